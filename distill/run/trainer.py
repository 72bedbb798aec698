"""DistillTrainer: a transformers.Trainer that trains the draft toward a frozen target, for 1..N processes.

Lifecycle of one optimizer step (per process p, micro-batches g = 1..G):
  get_batch_samples  -> the G micro-batches, with on-policy rows (distill.data.onpolicy) put in first when
                        distill.on_policy_fraction > 0, and N = number of loss tokens of those rows summed over all
                        processes and micro-batches
  compute_loss       -> the loss's weights at this optimizer step (DistillKeys.loss_at); draft and target final
                        hidden states (or the cached top-k teacher of the batch, when the rows carry one: the
                        target is then not run); chunked_distill_loss gives S_pg (a sum over
                        tokens); the returned loss is S_pg * P / N; all of it under bfloat16 autocast with
                        train.bf16 (autocast_smart_context_manager)
  backward           -> DDP / DeepSpeed / FSDP average gradients over the P processes, so the update follows
                        (1/P) sum_p sum_g grad(S_pg * P / N) = grad(sum_pg S_pg) / N: the per-token mean over the
                        whole optimizer batch, identical for (P processes x G micro-batches) = (1 x P*G).
  log                -> loss (per token), kd (per-token divergence), tv (per-token total variation of the batch at
                        temperature 1; kd and tv only when the loss has a divergence term), ce, tokens_per_s (all
                        processes' input tokens per second of training steps), on_policy (share of rows that
                        were the draft's samples, when on); with a combination of losses (distill.losses.loss_mix)
                        also loss/<name> (each term's per-token mean) and weight/<name> (its scheduled weight);
                        learning_rate and grad_norm come from Trainer.

The target is never wrapped by the Trainer or trained: it is frozen and used under no_grad, a replica on this
process's device (single process, DDP, ZeRO-1/2) or sharded for inference (ZeRO-3, FSDP2: every rank runs every
target forward). Device modes come from the accelerate config, not from this file; settings DistillTrainer cannot
run are refused by distill.models.distributed.check_device_mode before any weights load. Under FSDP2 the draft is
sharded by accelerate, checkpoints hold the sharded training state (torch distributed checkpoint) and the whole weights
gathered onto rank 0 (save_model), and on-policy rows are sampled from a local whole copy of the draft.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from decode.inputs.manifest import write_manifest
from decode.loop.batched import accepts_logits_to_keep
from distill.data.onpolicy import OnPolicySettings, micro_batch_generator, on_policy_batch
from distill.data.teacher_cache import TEACHER_COLUMNS, sparse_teacher_from_batch
from distill.losses.distill_loss import LossSums, chunked_distill_loss
from distill.models.distributed import is_partitioned
from distill.models.fsdp import is_sharded, local_copy, whole_head
from distill.outputs.checkpoints import clear_partial, find_checkpoints, partial_folder, publish
from distill.recipe.sections import DistillKeys
from distill.utils import IGNORE_INDEX, fault_point, folder_bytes, human_bytes, no_space, out_of_space

logger = logging.getLogger(__name__)


class LogSums:
    """Named sums a trainer logs, accumulated on this process since the last log: one float64 tensor, so summing
    over processes is one all-reduce. ``add(kd=..., tokens=...)`` adds by name; ``take(accelerator)`` returns the
    sums over every process (a collective: every rank calls it at the same log step) and starts again from zero."""

    def __init__(self, names: list[str], device: torch.device | str):
        self.names = list(names)
        self.slot = {name: i for i, name in enumerate(self.names)}
        self.values = torch.zeros(len(self.names), dtype=torch.float64, device=device)

    def add(self, **values: torch.Tensor | float) -> None:
        slots = torch.tensor([self.slot[name] for name in values], device=self.values.device)
        added = torch.stack([torch.as_tensor(v).detach().to(self.values.device, torch.float64)
                             for v in values.values()])
        self.values.index_add_(0, slots, added)

    def take(self, accelerator) -> dict[str, float]:
        values = accelerator.reduce(self.values, reduction="sum") if accelerator.num_processes > 1 else self.values
        totals = dict(zip(self.names, values.tolist()))
        self.values.zero_()
        return totals


class TrainStepTimer(TrainerCallback):
    """Seconds spent inside optimizer steps (forward, backward, update); logging, saving and acceptance
    measurements at checkpoints are left out, so tokens_per_s is the training throughput."""

    def __init__(self) -> None:
        self.seconds, self._start = 0.0, 0.0

    def on_step_begin(self, args, state, control, **kwargs) -> None:
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs) -> None:
        self.seconds += time.perf_counter() - self._start


class DistillTrainer(Trainer):
    """Trains `model` (the draft) to match `target` on the training rows; see the module docstring for the maths."""

    # compute_loss already divides by the token count of the whole optimizer step: Trainer must not divide by G.
    # transformers 5.20+ reads loss_is_scaled_for_ga; older ones model_accepts_loss_kwargs (set in __init__).
    loss_is_scaled_for_ga = True

    def __init__(
        self,
        model: PreTrainedModel,
        target: PreTrainedModel,
        args: TrainingArguments,
        distill: DistillKeys,
        train_dataset: Any,
        data_collator: Any,
        processing_class: PreTrainedTokenizerBase | None = None,
        callbacks: list[TrainerCallback] | None = None,
        on_policy: OnPolicySettings | None = None,
    ):
        super().__init__(model=model, args=args, train_dataset=train_dataset, data_collator=data_collator,
                         processing_class=processing_class, callbacks=callbacks)
        self.model_accepts_loss_kwargs = True  # transformers < 5.20: else the loss is divided by G a second time
        self.distill = distill
        self.on_policy = on_policy  # None: no on-policy rows
        # frozen by distill.models.load.load_target; never prepared (a sharded target is already where its shards live)
        self.target = target if is_partitioned(target) else target.to(self.args.device)
        self._draft_takes_logits_to_keep = accepts_logits_to_keep(model)
        # kd, tv, ce (summed over loss tokens), the tokens and the (on-policy) rows, since the last log
        self._log_sums = LogSums(["kd", "tv", "ce", "loss_tokens", "input_tokens", "rows", "on_policy_rows"],
                                 self.args.device)
        # a combination of losses: each term's sum since the last log (loss/<name>) and its weight (weight/<name>)
        terms = [] if isinstance(distill.loss, str) else list(distill.loss)
        self._term_sums = LogSums(terms, self.args.device) if terms else None
        self._step_timer = TrainStepTimer()
        self.add_callback(self._step_timer)
        self._saving_into: str | None = None  # while a checkpoint is written: OUTPUT_DIR/.partial

    # ---- checkpoints: complete or absent (distill.outputs.checkpoints) ----------------------------------------------

    def _get_output_dir(self, trial: Any) -> str:
        return self._saving_into or super()._get_output_dir(trial)

    def _save_checkpoint(self, model: nn.Module, trial: Any) -> None:
        """Trainer's save, written into OUTPUT_DIR/.partial/checkpoint-N and renamed to OUTPUT_DIR/checkpoint-N
        when every process has written its part; then the rotation (save_total_limit) that Trainer would do."""
        run_dir = super()._get_output_dir(trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.args.should_save:
            clear_partial(run_dir)  # what a killed save left behind
        self.accelerator.wait_for_everyone()
        self._saving_into = str(partial_folder(run_dir))
        try:
            super()._save_checkpoint(model, trial)  # rotation in .partial/ finds one checkpoint: deletes nothing
            fault_point("checkpoint-save")  # test hook: SPECDISTILL_FULL_DISK_AT=checkpoint-save:K, the K-th save
            self.accelerator.wait_for_everyone()  # every process has written its files (optimizer shards, rng state)
            if self.args.should_save:
                write_manifest(partial_folder(run_dir) / name)  # sha256 of every file, last: resume verifies it
        except OSError as err:
            if not out_of_space(err):
                raise
            raise self.disk_full(run_dir, name) from None
        finally:
            self._saving_into = None
        if self.args.should_save:
            publish(run_dir, name)
            rotate_checkpoints(output_dir=run_dir, save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)
        self.accelerator.wait_for_everyone()

    def disk_full(self, run_dir: str, name: str) -> Exception:
        """The one-line error of a checkpoint save that found the disk full, with the half-written checkpoint removed
        (the complete ones are untouched: nothing is renamed into run_dir before it is whole)."""
        found = find_checkpoints(run_dir)
        written = folder_bytes(partial_folder(run_dir) / name)
        if self.args.should_save:  # the main process clears, as it publishes
            clear_partial(run_dir)
        previous = found.latest
        needed = folder_bytes(previous) if previous is not None else None
        kept = (f"{previous.name} is intact" if previous is not None else "no checkpoint was complete yet") + \
            f" and nothing of {name} was kept; free space, then continue with train.resume_from_checkpoint=true"
        return no_space(run_dir, f"{name} ({human_bytes(written)} written)", kept, needed)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Trainer's save_model; under FSDP2 the sharded checkpoint (written by Trainer with the optimizer) gets the
        whole weights next to it, gathered onto rank 0 (a collective), as acceptance and the export read them."""
        if self.is_fsdp_enabled and is_sharded(self.model):
            self._save(output_dir, state_dict=self.accelerator.get_state_dict(self.model))
            return
        super().save_model(output_dir, _internal_call)

    def trained_draft(self) -> nn.Module:
        """The draft as acceptance measures it and export writes it (a plain or peft model)."""
        return self.accelerator.unwrap_model(self.model)

    # ---- the global token count N of one optimizer step ----------------------------------------------------

    def get_batch_samples(self, epoch_iterator: Iterator, num_batches: int,
                          device: torch.device) -> tuple[list, torch.Tensor]:
        """The next `num_batches` micro-batches (on-policy rows in place) and N, their loss tokens summed over every
        process. The replacement comes first, so N counts the tokens the loss is actually taken on."""
        batches = list(itertools.islice(epoch_iterator, num_batches))
        if self.on_policy is not None:
            sampler = self.on_policy_sampler()
            batches = [self.with_on_policy_rows(batch, micro, sampler) for micro, batch in enumerate(batches)]
        # position t predicts token t+1, so the loss tokens are the labels[:, 1:] that are not -100
        local = sum((b["labels"][:, 1:] != IGNORE_INDEX).sum() for b in batches) if batches else torch.tensor(0)
        local = torch.as_tensor(local, device=device).reshape(1)
        return batches, self.accelerator.gather(local).sum() if self.accelerator.num_processes > 1 else local[0]

    def on_policy_sampler(self) -> nn.Module:
        """The draft that samples on-policy rows: itself, or under FSDP2 a whole copy on every rank (a collective,
        once per optimizer step on every rank), since the ranks sample different numbers of tokens."""
        draft = self.accelerator.unwrap_model(self.model)
        return local_copy(draft) if is_sharded(draft) else draft

    def with_on_policy_rows(self, batch: dict[str, torch.Tensor], micro_batch: int,
                            draft: nn.Module) -> dict[str, torch.Tensor]:
        """The micro-batch with a lambda share of its rows replaced by `draft`'s samples (no collective: each process
        samples its own rows, from a generator seeded by seed, process, step and micro-batch)."""
        generator = micro_batch_generator(self.on_policy.seed, self.args.process_index, self.state.global_step,
                                          micro_batch)
        batch, rows = on_policy_batch(batch, draft, self.on_policy, generator)
        self._log_sums.add(rows=batch["input_ids"].shape[0], on_policy_rows=len(rows.selected))
        return batch

    # ---- the loss ---------------------------------------------------------------------------------------------

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True) -> contextlib.AbstractContextManager:
        """compute_loss under bfloat16 autocast with train.bf16 (Trainer enters this around it). accelerate autocasts
        only the draft's forward, so without this the loss's lm_head matmuls (the student's, the teacher's and the
        closed-form gradients of distill/losses/fused.py: most of a head's step) would stay in float32. Softmax and
        the divergences stay in float32 (`upcast`). Not under train.fp16: the fused path computes its gradients in
        the forward, before the loss scaler, where float16 would flush small ones to zero. A no-op under DeepSpeed,
        whose bf16 keeps the weights themselves in bfloat16."""
        return self.accelerator.autocast() if self.args.bf16 else contextlib.nullcontext()

    def draft_hidden_states(self, model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Final (normed) hidden states of the draft [B, T, H], through the wrapped model so DDP hooks run."""
        extra = {"logits_to_keep": 1} if self._draft_takes_logits_to_keep else {}
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                        output_hidden_states=True, use_cache=False, **extra)
        return outputs.hidden_states[-1]

    @torch.no_grad()
    def target_hidden_states(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Final (normed) hidden states of the target [B, T, H'] from its base model (no logits); an FSDP2-sharded
        target runs from its root (whose forward gathers the embeddings), logits at the last position only."""
        if is_sharded(self.target):
            outputs = self.target(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                  use_cache=False, output_hidden_states=True, logits_to_keep=1)
            return outputs.hidden_states[-1]
        outputs = self.target.base_model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                         use_cache=False)
        return outputs.last_hidden_state

    def distill_sums(self, model: nn.Module, inputs: dict[str, torch.Tensor]) -> LossSums:
        """Loss sums of one micro-batch: the divergence between the models at every position t whose next token
        labels[t + 1] is a target, computed chunk by chunk from hidden states (full logits are never built)."""
        draft_hidden = self.draft_hidden_states(model, inputs)  # [B, T, H]
        if TEACHER_COLUMNS[0] in inputs:  # cached top-k teacher (distill.teacher_cache): the target is not run
            teacher, teacher_head = sparse_teacher_from_batch(inputs), None  # SparseTeacher, B * (T-1) positions
        elif not self.distill.needs_teacher:  # cross-entropy on the data alone: the target is not run (kd = tv = 0)
            teacher, teacher_head = None, None
        else:
            teacher = self.target_hidden_states(inputs)[:, :-1]  # [B, T-1, H']
            teacher_head = self.target.get_output_embeddings()
        labels = inputs["labels"][:, 1:]  # [B, T-1]: the token each position predicts
        with whole_head(self.target, teacher_head):  # FSDP2: gathered once here, not once per chunk
            return chunked_distill_loss(
                draft_hidden[:, :-1], self.accelerator.unwrap_model(model).get_output_embeddings(),
                teacher, labels, inputs["attention_mask"][:, 1:].bool(),
                teacher_head=teacher_head, chunk_size=self.distill.chunk_size,
                loss=self.distill.loss_at(self.state.global_step, self.state.max_steps), beta=self.distill.beta,
                temperature=self.distill.temperature, ce_weight=self.distill.ce_weight,
            )

    def compute_loss(self, model: nn.Module, inputs: dict[str, torch.Tensor], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """S * P / N for the training loop (see module docstring); S / (its own token count) when called alone."""
        sums = self.distill_sums(model, inputs)
        if num_items_in_batch is None:
            loss = sums.loss / max(sums.num_tokens, 1)
        else:
            # loss = S_pg * P / N: DDP's gradient average over P processes then yields grad(sum S) / N
            loss = sums.loss * self.accelerator.num_processes / torch.as_tensor(num_items_in_batch).clamp(min=1)
        self._log_sums.add(kd=sums.kd, tv=sums.tv, ce=sums.ce, loss_tokens=sums.num_tokens,
                           input_tokens=inputs["attention_mask"].sum())
        if self._term_sums is not None:  # a combination: each term's own sum, logged as loss/<name>
            self._term_sums.add(**{name: sums.terms[name] for name in self._term_sums.names})
        return (loss, sums) if return_outputs else loss

    # ---- logging ----------------------------------------------------------------------------------------------

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Adds kd, tv, ce and tokens_per_s to the periodic training log (the one with 'loss', on every rank)."""
        if "loss" in logs:
            sums = self._log_sums.take(self.accelerator)
            loss_tokens = max(sums["loss_tokens"], 1)
            if self.distill.needs_teacher:  # loss ce alone: no distribution to compare with, kd and tv not logged
                logs.update(kd=sums["kd"] / loss_tokens, tv=sums["tv"] / loss_tokens)
            logs.update(ce=sums["ce"] / loss_tokens,
                        tokens_per_s=sums["input_tokens"] / max(self._step_timer.seconds, 1e-9))
            if self.on_policy is not None:
                logs["on_policy"] = sums["on_policy_rows"] / max(sums["rows"], 1)
            if self._term_sums is not None:
                self._log_terms(logs, loss_tokens)
            self._step_timer.seconds = 0.0
        super().log(logs, start_time)


    def _log_terms(self, logs: dict[str, float], loss_tokens: float) -> None:
        """loss/<name>: each term's per-token mean since the last log; weight/<name>: its weight in the last step."""
        weights = self.distill.loss_at(max(self.state.global_step - 1, 0), self.state.max_steps)
        for name, total in self._term_sums.take(self.accelerator).items():
            logs[f"loss/{name}"] = total / loss_tokens
            logs[f"weight/{name}"] = weights[name]
