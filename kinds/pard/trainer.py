"""PardTrainer: DistillTrainer for a PARD draft (model.draft_kind pard), for 1..N processes.

What changes from a standalone draft, one optimizer step (kinds/pard/loss.py has the maths):
  get_batch_samples     -> anchors for every micro-batch (seeded by the step, the micro-batch and the process: a
                           resumed run draws the same) and N_1..N_{K-1}, the mask slots' token counts over every
                           process and micro-batch, next to DistillTrainer's N_0
  draft_hidden_states   -> one forward of the draft over the row and its blocks' slots (block_attention); the row's
                           hidden states go on to DistillTrainer's slot-0 loss, the slots' are kept
  compute_loss          -> slot 0 as DistillTrainer computes it, each mask slot against the target's distribution at
                           a + k, then (sum_k w_k S_k / N_k) / sum_k w_k, times P for DDP's average
  log                   -> loss, kd / tv / ce of slot 0 (a standalone draft's), and per mask slot `pard/slot{k}_ce`
                           and, when the target runs, `pard/slot{k}_tv` (1 - tv: the probability that sampling at
                           temperature 1 accepts slot k's token)
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from distill.losses.distill_loss import chunked_distill_loss
from distill.models.fsdp import whole_head
from distill.run.trainer import DistillTrainer, LogSums
from distill.utils import IGNORE_INDEX
from kinds.parallel_drafting import anchor_generator, slot_weights, step_loss, step_slot_counts
from kinds.pard.loss import block_attention, block_inputs, pard_anchors, slot_labels, teacher_rows

ANCHORS, KEPT = "pard_anchors", "pard_kept"  # what get_batch_samples adds to each micro-batch


class PardTrainer(DistillTrainer):
    """Trains a causal LM to draft pard_gamma tokens per forward; see the module docstring."""

    def __init__(self, model: nn.Module, **kwargs: Any) -> None:
        super().__init__(model=model, **kwargs)
        config = self.accelerator.unwrap_model(self.model).config
        self.gamma, self.pard_token = int(config.pard_gamma), int(config.pard_token)
        self.weights = slot_weights(self.gamma, self.distill.pard_position_decay)
        self._slot_counts: torch.Tensor | None = None  # N_1..N_{K-1} of the current optimizer step
        self._slots: dict[str, torch.Tensor] = {}  # the current micro-batch's slot hidden states, teacher, labels
        self._slot_sums = LogSums([f"slot{k}_{name}" for k in range(1, self.gamma) for name in ("tv", "ce", "tokens")],
                                  self.args.device)

    def get_batch_samples(self, epoch_iterator: Iterator, num_batches: int,
                          device: torch.device) -> tuple[list, torch.Tensor]:
        """DistillTrainer's micro-batches and N_0, each micro-batch with its anchors; N_1..N_{K-1} kept."""
        batches, total = super().get_batch_samples(epoch_iterator, num_batches, device)
        labels = []
        for index, batch in enumerate(batches):
            generator = anchor_generator(self.args.seed, self.state.global_step, index, self.accelerator.process_index)
            anchors, kept = pard_anchors(batch["labels"], batch["attention_mask"], self.distill.pard_blocks, generator)
            batch[ANCHORS], batch[KEPT] = anchors, kept
            labels.append(slot_labels(batch["labels"], batch["attention_mask"], anchors, kept, self.gamma))
        self._slot_counts = step_slot_counts(labels, self.gamma, self.accelerator, device)
        return batches, total

    def draft_hidden_states(self, model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The row's final hidden states [B, T, H] from one forward that also runs the blocks' slots (kept)."""
        anchors, kept = inputs[ANCHORS].to(inputs["input_ids"].device), inputs[KEPT].to(inputs["input_ids"].device)
        tokens, positions = block_inputs(inputs["input_ids"], anchors, self.gamma, self.pard_token)
        dtype = self.accelerator.unwrap_model(model).get_output_embeddings().weight.dtype
        mask = block_attention(anchors, inputs["attention_mask"], self.gamma, dtype)
        extra = {"logits_to_keep": 1} if self._draft_takes_logits_to_keep else {}
        hidden = model(input_ids=tokens, attention_mask=mask, position_ids=positions, output_hidden_states=True,
                       use_cache=False, **extra).hidden_states[-1]
        length = inputs["input_ids"].shape[1]
        self._slots = {"hidden": hidden[:, length:].view(hidden.shape[0], anchors.shape[1], self.gamma - 1, -1),
                       "anchors": anchors,
                       "labels": slot_labels(inputs["labels"], inputs["attention_mask"], anchors, kept, self.gamma)}
        return hidden[:, :length]

    @torch.no_grad()
    def target_hidden_states(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """DistillTrainer's, kept for the slots' teacher rows."""
        final = super().target_hidden_states(inputs)
        self._slots["teacher"] = final
        return final

    def compute_loss(self, model: nn.Module, inputs: dict[str, torch.Tensor], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """(sum_k w_k S_k / N_k) / sum_k w_k, times P in the training loop; with this batch's own counts alone."""
        if ANCHORS not in inputs:  # called outside the training loop (evaluation): draw this batch's anchors
            anchors, kept = pard_anchors(inputs["labels"], inputs["attention_mask"], self.distill.pard_blocks,
                                         torch.Generator().manual_seed(self.args.seed))
            inputs = {**inputs, ANCHORS: anchors, KEPT: kept}
        self._slots = {}
        first = self.distill_sums(model, inputs)  # slot 0; runs the slots' forward and the teacher
        sums = self.slot_sums(model)
        loss = step_loss(first, sums, self.weights, num_items_in_batch, self._slot_counts,
                         self.accelerator.num_processes)
        self._log_sums.add(kd=first.kd, tv=first.tv, ce=first.ce, loss_tokens=first.num_tokens,
                           input_tokens=inputs["attention_mask"].sum())
        self._slot_sums.add(**{f"slot{k}_{name}": value for k, s in enumerate(sums, start=1)
                               for name, value in (("tv", s.tv), ("ce", s.ce), ("tokens", s.num_tokens))})
        self._slots = {}
        return (loss, [first, *sums]) if return_outputs else loss

    def slot_sums(self, model: nn.Module) -> list:
        """The loss sums of mask slots 1..K-1 from the kept hidden states, against the target at a + k."""
        slots = self._slots
        head = self.accelerator.unwrap_model(model).get_output_embeddings()
        teacher_head = self.target.get_output_embeddings() if "teacher" in slots else None
        teacher = teacher_rows(slots["teacher"], slots["anchors"], self.gamma) if teacher_head is not None else None
        loss = self.distill.loss_at(self.state.global_step, self.state.max_steps)
        sums = []
        with whole_head(self.target, teacher_head):
            for k in range(1, self.gamma):
                labels = slots["labels"][:, :, k - 1]
                sums.append(chunked_distill_loss(
                    slots["hidden"][:, :, k - 1], head, None if teacher is None else teacher[:, :, k - 1], labels,
                    labels != IGNORE_INDEX, teacher_head=teacher_head, chunk_size=self.distill.chunk_size, loss=loss,
                    beta=self.distill.beta, temperature=self.distill.temperature, ce_weight=self.distill.ce_weight))
        return sums

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Adds per mask slot pard/slot{k}_ce (per-token mean cross-entropy on the row's tokens) and, when the target
        runs (a loss against its distribution), pard/slot{k}_tv (per-token mean total variation) to the periodic
        training log."""
        if "loss" in logs:
            totals = self._slot_sums.take(self.accelerator)
            for k in range(1, self.gamma):
                tokens = max(totals[f"slot{k}_tokens"], 1)
                logs[f"pard/slot{k}_ce"] = totals[f"slot{k}_ce"] / tokens
                if self.distill.needs_teacher:  # without the target there is no distribution to compare with
                    logs[f"pard/slot{k}_tv"] = totals[f"slot{k}_tv"] / tokens
        super().log(logs, start_time)
