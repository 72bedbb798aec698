"""PEagleTrainer: HeadTrainer for a P-EAGLE head (model.draft_kind p_eagle), for 1..N processes.

What changes from an EAGLE-3 head, one optimizer step (kinds/p_eagle/loss.py has the maths):
  get_batch_samples  -> the head's N_0 (its first step's kept positions, over every process and micro-batch), anchors
                        for every micro-batch (seeded by the step, the micro-batch and the process: a resumed run draws
                        the same) and N_1..N_{K-1}, the mask slots' counts over every process and micro-batch
  compute_loss       -> the target's features as for a head (a forward, or the hidden-state cache), one pass of the
                        head over the row and its blocks' mask slots (ParallelHead, through DDP's forward), slot 0
                        scored as an EAGLE-3 head's step 0, slot k against p at a + 1 + k, then
                        (sum_k w_k S_k / N_k) / sum_k w_k, times P for DDP's average
  log                -> loss, kd / tv / ce of slot 0, and per mask slot `p_eagle/slot{k}_tv` (1 - tv: the probability
                        that sampling at temperature 1 accepts slot k's token)
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from distill.losses.distill_loss import chunked_distill_loss
from distill.run.trainer import LogSums
from distill.utils import IGNORE_INDEX
from kinds.eagle3.loss import draft_labels, ttt_step_sums
from kinds.eagle3.model import Eagle3Head, parallel_token
from kinds.eagle3.trainer import HeadTrainer
from kinds.p_eagle.loss import ParallelHead, head_anchors, slot_labels, teacher_rows
from kinds.parallel_drafting import anchor_generator, slot_weights, step_loss, step_slot_counts

ANCHORS, KEPT = "p_eagle_anchors", "p_eagle_kept"  # what get_batch_samples adds to each micro-batch


class PEagleTrainer(HeadTrainer):
    """Trains an Eagle3Head to draft ptd_gamma tokens per pass; see the module docstring."""

    def __init__(self, model: Eagle3Head, **kwargs: Any) -> None:
        super().__init__(model=model, **kwargs)
        self.gamma = int(model.config.ptd_gamma)
        self.weights = slot_weights(self.gamma, self.distill.pard_position_decay)
        self._slot_counts: torch.Tensor | None = None  # N_1..N_{K-1} of the current optimizer step
        self._slot_sums = LogSums([f"slot{k}_{name}" for k in range(1, self.gamma) for name in ("tv", "tokens")],
                                  self.args.device)

    @staticmethod
    def wrapped(head: Eagle3Head, distill: Any) -> nn.Module:
        """The module Trainer trains: the head's row and mask slots in one pass."""
        return ParallelHead(head, int(head.config.ptd_gamma), parallel_token(head.config), distill.feature_noise)

    def anchors(self, batch: dict[str, torch.Tensor], index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The anchors of micro-batch `index` of this step on this process (the same after a resume)."""
        generator = anchor_generator(self.args.seed, self.state.global_step, index, self.accelerator.process_index)
        ids = draft_labels(batch["labels"], batch["attention_mask"], self.head)
        return head_anchors(ids, batch["attention_mask"], self.distill.pard_blocks, generator)

    def get_batch_samples(self, epoch_iterator: Iterator, num_batches: int,
                          device: torch.device) -> tuple[list, torch.Tensor]:
        """The head's micro-batches and N_0, each micro-batch with its anchors; N_1..N_{K-1} kept."""
        batches, total = super().get_batch_samples(epoch_iterator, num_batches, device)
        labels = []
        for index, batch in enumerate(batches):
            batch[ANCHORS], batch[KEPT] = self.anchors(batch, index)
            ids = draft_labels(batch["labels"], batch["attention_mask"], self.head)
            labels.append(slot_labels(ids, batch["attention_mask"], batch[ANCHORS], batch[KEPT], self.gamma))
        self._slot_counts = step_slot_counts(labels, self.gamma, self.accelerator, device)
        return batches, total

    def compute_loss(self, model: nn.Module, inputs: dict[str, torch.Tensor], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """(sum_k w_k S_k / N_k) / sum_k w_k, times P in the training loop; with this batch's own counts alone."""
        if ANCHORS not in inputs:  # called outside the training loop (evaluation): draw this batch's anchors
            anchors, kept = self.anchors(inputs, 0)
            inputs = {**inputs, ANCHORS: anchors, KEPT: kept}
        device = inputs["input_ids"].device
        anchors, kept = inputs[ANCHORS].to(device), inputs[KEPT].to(device)
        aux, final = self.features(inputs)
        row, slots = model(inputs["input_ids"], aux, anchors, inputs["attention_mask"])  # through DDP's forward
        loss_name = self.distill.loss_at(self.state.global_step, self.state.max_steps)
        first = ttt_step_sums(self.head, [row], final, self.teacher(), inputs["labels"], inputs["attention_mask"],
                              self.distill, loss=loss_name)[0]
        sums = self.slot_sums(slots, final, anchors, kept, inputs, loss_name)
        loss = step_loss(first, sums, self.weights, num_items_in_batch, self._slot_counts,
                         self.accelerator.num_processes)
        self._log_sums.add(kd=first.kd, tv=first.tv, ce=first.ce, loss_tokens=first.num_tokens,
                           input_tokens=inputs["attention_mask"].sum())
        self._ttt_sums.add(step0_kd=first.kd, step0_tv=first.tv, step0_tokens=first.num_tokens,
                           step0_feature=first.terms.get("feature", 0.0))
        self._slot_sums.add(**{f"slot{k}_{name}": value for k, s in enumerate(sums, start=1)
                               for name, value in (("tv", s.tv), ("tokens", s.num_tokens))})
        return (loss, [first, *sums]) if return_outputs else loss

    def slot_sums(self, slots: torch.Tensor, final: torch.Tensor, anchors: torch.Tensor, kept: torch.Tensor,
                  inputs: dict[str, torch.Tensor], loss: Any) -> list:
        """The loss sums of mask slots 1..K-1 (slots [B, n, K-1, H]) against the target at a + 1 + k, restricted to
        the draft vocabulary."""
        ids = draft_labels(inputs["labels"], inputs["attention_mask"], self.head)
        labels = slot_labels(ids, inputs["attention_mask"], anchors, kept, self.gamma)  # [B, n, K-1]
        teacher = teacher_rows(final, anchors, self.gamma)  # [B, n, K-1, H']
        sums = []
        for k in range(1, self.gamma):
            wanted = labels[:, :, k - 1]
            sums.append(chunked_distill_loss(
                slots[:, :, k - 1], self.head.lm_head, teacher[:, :, k - 1].detach(), wanted, wanted != IGNORE_INDEX,
                teacher_head=self.teacher(), chunk_size=self.distill.chunk_size, loss=loss, beta=self.distill.beta,
                temperature=self.distill.temperature, ce_weight=self.distill.ce_weight))
        return sums

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Adds p_eagle/slot{k}_tv (per-token mean total variation of each mask slot) to the periodic training log."""
        if "loss" in logs:
            totals = self._slot_sums.take(self.accelerator)
            for k in range(1, self.gamma):
                logs[f"p_eagle/slot{k}_tv"] = totals[f"slot{k}_tv"] / max(totals[f"slot{k}_tokens"], 1)
        super().log(logs, start_time)
