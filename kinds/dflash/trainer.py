"""DFlashTrainer: DistillTrainer for a DFlash draft (model.draft_kind dflash), for 1..N processes.

What changes from a standalone draft, one optimizer step (the rest of DistillTrainer's lifecycle is unchanged):
  get_batch_samples  -> anchors for every micro-batch (kinds.dflash.loss.sample_anchors, seeded by the step, the
                        micro-batch and the process: a resumed run draws the same), and W = sum_k w_k N_k, the
                        weighted count of kept slot positions over all processes and micro-batches
  compute_loss       -> the target's hidden states at the draft's layers and its final hidden states: one forward of
                        the frozen target, or both read from the batch with distill.hidden_state_cache; every block
                        of the batch in one pass (BlockTraining, inside the wrapped model's forward); each slot's
                        loss sum S_k; the returned loss is sum_k w_k S_k * P / W, so the update is that of the
                        weighted per-token mean over the whole optimizer batch, as for the other kinds
  log                -> loss, kd / tv / ce of slot 1 (comparable with a standalone draft's and a head's first step),
                        tokens_per_s, and per slot `dflash/slot{k}_tv` (1 - tv: the probability that sampling at
                        temperature 1 accepts the slot's token given the earlier ones)
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from distill.data.hidden_cache import cached_features, target_features
from distill.run.trainer import DistillTrainer, LogSums
from kinds.dflash.loss import (
    BlockTraining,
    position_weights,
    sample_anchors,
    slot_labels,
    slot_sums,
    slot_token_counts,
    weighted_block_loss,
)
from kinds.dflash.model import DFlashDraft

ANCHORS, KEPT = "dflash_anchors", "dflash_kept"  # what get_batch_samples adds to each micro-batch


class DFlashTrainer(DistillTrainer):
    """Trains a DFlashDraft on blocks at random anchors; see the module docstring for the maths."""

    def __init__(self, model: DFlashDraft, **kwargs: Any) -> None:
        distill = kwargs["distill"]
        super().__init__(model=BlockTraining(model), **kwargs)
        self.draft = model
        self.weights = position_weights(model.block_size, distill.dflash_position_decay)
        self._slot_sums = LogSums([f"slot{k}_{name}" for k in range(1, model.block_size) for name in ("tv", "tokens")],
                                  self.args.device)

    def trained_draft(self) -> nn.Module:
        """The DFlash draft (acceptance measures it, export writes it)."""
        return self.draft

    def get_batch_samples(self, epoch_iterator: Iterator, num_batches: int,
                          device: torch.device) -> tuple[list, torch.Tensor]:
        """The next `num_batches` micro-batches, each with its anchors, and W (weighted kept slots, all processes)."""
        batches = list(itertools.islice(epoch_iterator, num_batches))
        weights = torch.tensor(self.weights, dtype=torch.float64)
        local = torch.zeros((), dtype=torch.float64)
        for index, batch in enumerate(batches):
            generator = torch.Generator().manual_seed(
                (self.args.seed * 1_000_003 + self.state.global_step * 1009 + index * 31
                 + self.accelerator.process_index) % (2 ** 63))
            anchors, kept = sample_anchors(batch["labels"], batch["attention_mask"], self.distill.dflash_blocks,
                                           generator)
            batch[ANCHORS], batch[KEPT] = anchors, kept
            labels = slot_labels(batch["labels"].cpu(), batch["attention_mask"].cpu(), anchors, kept,
                                 self.draft.block_size)
            local += (weights * slot_token_counts(labels).double()).sum()
        local = local.to(device)
        total = self.accelerator.reduce(local, reduction="sum") if self.accelerator.num_processes > 1 else local
        return batches, total

    def compute_loss(self, model: nn.Module, inputs: dict[str, torch.Tensor], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """sum_k w_k S_k * P / W for the training loop; with this batch's own W when called alone."""
        if ANCHORS not in inputs:  # called outside the training loop (evaluation): draw this batch's anchors
            anchors, kept = sample_anchors(inputs["labels"], inputs["attention_mask"], self.distill.dflash_blocks,
                                           torch.Generator().manual_seed(self.args.seed))
            inputs = {**inputs, ANCHORS: anchors, KEPT: kept}
        anchors, kept = inputs[ANCHORS].to(inputs["input_ids"].device), inputs[KEPT].to(inputs["input_ids"].device)
        aux, final = cached_features(inputs) or target_features(self.target, inputs["input_ids"],
                                                                inputs["attention_mask"], self.draft.aux_layers)
        lm_head = self.target.get_output_embeddings()
        final = final.to(lm_head.weight.dtype)  # a cache's storage dtype -> the target's
        hidden = model(inputs["input_ids"], aux, anchors, inputs["attention_mask"])  # [B, n, S, H], through DDP
        labels = slot_labels(inputs["labels"], inputs["attention_mask"], anchors, kept, self.draft.block_size)
        sums = slot_sums(hidden, final, lm_head, labels, anchors, self.distill,
                         loss=self.distill.loss_at(self.state.global_step, self.state.max_steps))
        if num_items_in_batch is None:
            weighted = sum(w * s.num_tokens for w, s in zip(self.weights, sums))
            count, processes = torch.tensor(float(weighted), device=hidden.device), 1
        else:
            count, processes = torch.as_tensor(num_items_in_batch, device=hidden.device), \
                self.accelerator.num_processes
        loss = weighted_block_loss(sums, self.weights, count) * processes
        first = sums[0]
        self._log_sums.add(kd=first.kd, tv=first.tv, ce=first.ce, loss_tokens=first.num_tokens,
                           input_tokens=inputs["attention_mask"].sum())
        self._slot_sums.add(**{f"slot{k}_{name}": value for k, s in enumerate(sums, start=1)
                               for name, value in (("tv", s.tv), ("tokens", s.num_tokens))})
        return (loss, sums) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Adds dflash/slot{k}_tv (per-token mean total variation of each slot) to the periodic training log."""
        if "loss" in logs:
            totals = self._slot_sums.take(self.accelerator)
            for k in range(1, self.draft.block_size):
                logs[f"dflash/slot{k}_tv"] = totals[f"slot{k}_tv"] / max(totals[f"slot{k}_tokens"], 1)
        super().log(logs, start_time)
