"""HeadTrainer: DistillTrainer for an EAGLE-3 head (model.draft_kind eagle3), for 1..N processes.

What changes from a standalone draft, one optimizer step (the rest of DistillTrainer's lifecycle is unchanged):
  get_batch_samples  -> N_j for every TTT step j: the kept positions of step j (label x_{t+2+j} a loss token in
                        the draft vocabulary) summed over all processes and micro-batches, [K]
  compute_loss       -> one forward of the frozen target (aux hidden states and final hidden states together), or
                        both read from the batch with distill.hidden_state_cache (distill.data.hidden_cache: the
                        target is not run, only a copy of its lm_head gives the teacher's logits), the head
                        unrolled K steps inside the wrapped model's forward (kinds.eagle3.loss), each
                        step's loss sum S_pg,j; the returned loss is sum_j decay^j S_pg,j * P / N_j, so the
                        update is that of sum_j decay^j (per-token mean of step j over the whole optimizer batch):
                        identical for (P processes x G micro-batches) = (1 x P*G), as for standalone drafts
  log                -> loss, kd / tv / ce of step 0 (comparable with a standalone draft's), tokens_per_s, and per
                        step `ttt/step{j}_kd` (the recipe's divergence) and `ttt/step{j}_tv` (1 - tv is the
                        probability that sampling at temperature 1 accepts the step's token: the acceptance proxy),
                        and with distill.feature_weight `ttt/step{j}_feature` (the feature regression's mean F)
The trained module is kinds.eagle3.loss.UnrolledHead; `head` is the Eagle3Head that acceptance measures and
export writes.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from distill.data.hidden_cache import cached_features, target_features
from distill.run.trainer import DistillTrainer, LogSums
from kinds.eagle3.build import teacher_lm_head
from kinds.eagle3.loss import UnrolledHead, step_token_counts, teacher_of, ttt_step_sums, weighted_loss
from kinds.eagle3.model import Eagle3Head


class HeadTrainer(DistillTrainer):
    """Trains an Eagle3Head with training-time test; see the module docstring for the maths."""

    def __init__(self, model: Eagle3Head, **kwargs: Any) -> None:
        distill = kwargs["distill"]
        super().__init__(model=self.wrapped(model, distill), **kwargs)
        self.head = model
        if model.bound_embeddings is not None:  # a whole copy of the target's embedding (ZeRO-3, FSDP2) joins the head
            model.bound_embeddings.to(self.args.device)
        self._teacher_head: nn.Module | None = None  # the target's lm_head on the draft vocabulary (first step)
        # per step j: [kd, tv, kept positions] summed on this process since the last log
        # each unrolled step's kd and tv (summed over its loss tokens) and its tokens, since the last log
        names = [f"step{j}_{name}" for j in range(distill.ttt_steps) for name in ("kd", "tv", "feature", "tokens")]
        self._ttt_sums = LogSums(names, self.args.device)

    @staticmethod
    def wrapped(head: Eagle3Head, distill: Any) -> nn.Module:
        """The module Trainer trains: the head unrolled distill.ttt_steps steps."""
        return UnrolledHead(head, distill.ttt_steps, distill.feature_noise)

    def teacher(self) -> nn.Module:
        """The target's lm_head on the draft vocabulary, cut to its top k with distill.soft_target_top_k (built at the
        first step: after a resume has loaded the head's vocabulary; a collective when the target is sharded)."""
        if self._teacher_head is None:
            self._teacher_head = teacher_of(teacher_lm_head(self.target), self.head, self.distill.soft_target_top_k)
        return self._teacher_head

    def features(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's aux hidden states [B, T, k H'] and final normed hidden states [B, T, H'] (in the teacher's
        dtype): from the hidden-state cache (the target is not run), else one target forward."""
        aux, final = cached_features(inputs) or target_features(self.target, inputs["input_ids"],
                                                                inputs["attention_mask"], self.head.aux_layers)
        return aux, final.to(self.teacher().weight.dtype)  # a cache's storage dtype -> the target's

    def trained_draft(self) -> nn.Module:
        """The head (acceptance measures it, export writes it)."""
        return self.head

    def get_batch_samples(self, epoch_iterator: Iterator, num_batches: int,
                          device: torch.device) -> tuple[list, torch.Tensor]:
        """The next `num_batches` micro-batches and N_j [K]: each step's kept positions over every process."""
        batches = list(itertools.islice(epoch_iterator, num_batches))
        local = torch.zeros(self.distill.ttt_steps, dtype=torch.long)
        for b in batches:
            local += step_token_counts(b["labels"], b["attention_mask"], self.head, self.distill.ttt_steps).cpu()
        local = local.to(device)
        return batches, self.accelerator.gather(local[None]).sum(0) if self.accelerator.num_processes > 1 else local

    def compute_loss(self, model: nn.Module, inputs: dict[str, torch.Tensor], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """sum_j decay^j S_j * P / N_j for the training loop; with each step's own counts when called alone."""
        aux, final = self.features(inputs)
        outputs = model(inputs["input_ids"], aux)  # K x [B, T, H], through DDP's forward
        sums = ttt_step_sums(self.head, outputs, final, self.teacher(), inputs["labels"],
                             inputs["attention_mask"], self.distill,
                             loss=self.distill.loss_at(self.state.global_step, self.state.max_steps))
        if num_items_in_batch is None:
            counts, processes = torch.tensor([s.num_tokens for s in sums], device=final.device), 1
        else:
            counts, processes = torch.as_tensor(num_items_in_batch, device=final.device), \
                self.accelerator.num_processes
        # loss = sum_j decay^j S_pg,j * P / N_j: DDP's gradient average then yields the per-token means' sum
        loss = weighted_loss(sums, counts, self.distill.ttt_decay) * processes
        first = sums[0]
        self._log_sums.add(kd=first.kd, tv=first.tv, ce=first.ce, loss_tokens=first.num_tokens,
                           input_tokens=inputs["attention_mask"].sum())
        self._ttt_sums.add(**{f"step{j}_{name}": value for j, s in enumerate(sums)
                              for name, value in (("kd", s.kd), ("tv", s.tv), ("tokens", s.num_tokens),
                                                  ("feature", s.terms.get("feature", 0.0)))})
        return (loss, sums) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Adds ttt/step{j}_kd and ttt/step{j}_tv (per-token means of each step) to the periodic training log."""
        if "loss" in logs:
            totals = self._ttt_sums.take(self.accelerator)
            for step in range(self.distill.ttt_steps):
                tokens = max(totals[f"step{step}_tokens"], 1)
                if self.distill.needs_teacher:  # loss ce alone: no distribution to compare with
                    logs[f"ttt/step{step}_kd"] = totals[f"step{step}_kd"] / tokens
                    logs[f"ttt/step{step}_tv"] = totals[f"step{step}_tv"] / tokens
                if self.distill.feature_weight > 0:
                    logs[f"ttt/step{step}_feature"] = totals[f"step{step}_feature"] / tokens
        super().log(logs, start_time)
