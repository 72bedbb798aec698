"""Acceptance measured at every checkpoint: AcceptanceCallback (the measure step of a run, specdistill.pipeline).

AcceptanceCallback runs decode.measure.evaluate.evaluate_acceptance on rank 0 at every save; the other ranks wait at a
barrier that every rank reaches, so no collective is ever called from one rank alone. Each result becomes one line
of OUTPUT_DIR/acceptance.jsonl (`{"step", "checkpoint", <result keys>}`, docs/reference/interfaces.md) and TensorBoard
scalars such as `acceptance/gamma4/acceptance_rate` (under OUTPUT_DIR/runs/acceptance). The lines of one
measurement are appended in one write (distill.outputs.acceptance_log); a checkpoint whose lines are missing or
incomplete (the run was killed while measuring it) is measured from its folder at the start of training
(measure_missing). After training, measure_remaining measures what is still missing and the final step if it was not
saved.

Held in beside held out: with ``held_in`` prompts (eval.held_in_prompts of the training rows' own prompts,
distill.data.rows.held_in_prompts) every record also holds `held_in_acceptance_rate` and
`held_in_mean_accepted_tokens` (decode.measure.evaluate.acceptance_only: acceptance alone, nothing timed), and one
line warns when held-out acceptance falls below eval.held_in_warning of held-in: a draft that fits what it trained on
and not what it will serve, the gap the field's drafters show when served.

The cost ratios c and v of the cost model tau / (gamma * c + v) are measured once per run for each temperature and
gamma (the first time acceptance is measured, COST_REPEATS timings each, median, under that temperature's sampling;
a resumed run reuses those of its log) and handed to
evaluate_acceptance, which writes them and the predicted speedup into every record, next to the measured wall-clock
speedup; distill.publish.export picks the best checkpoint from them. Eager on CPU, target and draft are measured on
oneDNN-packed linear layers (decode.loop.packed_linear, inside the measurement only), as `specdistill-eval` decodes
by default (`--cpu-linear auto`): tuned at the run's first measurement, that choice kept at every later one.

What is measured is what gets exported: an EAGLE-3 head is measured as the Eagle3Head itself (the trainer holds it
inside kinds.eagle3.loss.UnrolledHead; decode's head drafter runs it), a LoRA draft as a merged copy, and under
ZeRO-3 or FSDP2 rank 0 measures whole copies of draft and target gathered from every rank's partitions (all ranks
take part in the gathering; the target's copy is kept on rank 0's CPU between measurements). Under ZeRO-3 / FSDP2
the last step is always saved as a checkpoint, so the export reads whole weights from disk.
"""
from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from accelerate import PartialState
from torch import nn
from transformers import PreTrainedModel, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from decode.loop.auto_gamma import AUTO_GAMMAS, is_auto
from decode.loop.packed_linear import packed_linears
from decode.loop.speedup import CostRatios
from decode.measure.cost_model import measure_cost_ratios
from distill.models.distributed import is_partitioned, plain_copy
from distill.models.lora import is_lora
from distill.models.served import TrainingKind, carry_draft_vocab, served_draft
from distill.outputs.acceptance_log import append_records, complete_steps, read_records, rewrite_records
from distill.outputs.checkpoints import checkpoint_step, crash_point, find_checkpoints
from distill.publish.export import best_record, draft_at_checkpoint
from distill.recipe.sections import EvalConfig
from distill.utils import eval_mode

logger = logging.getLogger(__name__)

COST_REPEATS = 31  # timings per cost ratio, measured once per run: enough for a stable median
# (target, draft, prompts, EvalSettings) -> one result dict per gamma; decode.measure.evaluate.evaluate_acceptance
# or a fake
Evaluate = Callable[..., list[dict]]


def cost_gammas(gammas: Sequence[int | str]) -> list[int]:
    """The draft lengths whose cost ratios a run needs: its fixed gammas, and every candidate of gamma "auto"."""
    return sorted({g for g in gammas if not is_auto(g)} | (set(AUTO_GAMMAS) if any(map(is_auto, gammas)) else set()))


CostKey = tuple[float, int]  # (temperature, gamma): sampling adds its own work to every step


def logged_cost_ratios(records: Sequence[dict], gammas: Sequence[int | str],
                       temperatures: Sequence[float]) -> dict[CostKey, CostRatios] | None:
    """The run's cost ratios per (temperature, gamma) as its records carry them; None unless every needed pair has
    them."""
    found = {(r["temperature"], r["gamma"]): CostRatios(r["draft_cost_ratio"], r["verify_cost_ratio"])
             for r in records if not is_auto(r["gamma"]) and r.get("draft_cost_ratio") is not None
             and r.get("verify_cost_ratio") is not None}
    needed = [(t, g) for t in temperatures for g in cost_gammas(gammas)]
    return found if all(key in found for key in needed) else None


def _default_evaluate(kind: TrainingKind) -> Evaluate:
    """decode.measure.evaluate.evaluate_acceptance for drafts of ``kind``."""
    from decode.measure.evaluate import evaluate_acceptance
    return functools.partial(evaluate_acceptance, kind=kind)


def _default_acceptance(kind: TrainingKind) -> Evaluate:
    """decode.measure.evaluate.acceptance_only for drafts of ``kind``: the held-in prompts' acceptance."""
    from decode.measure.evaluate import acceptance_only
    return functools.partial(acceptance_only, kind=kind)


HELD_IN_KEYS = ("acceptance_rate", "mean_accepted_tokens")  # measured on held-in prompts as held_in_<key>


def with_held_in(records: list[dict], held_in: list[dict]) -> list[dict]:
    """Each held-out record with the held-in prompts' acceptance at its (gamma, temperature), as held_in_<key>."""
    by_setting = {(row["gamma"], row["temperature"]): row for row in held_in}
    return [{**record, **{f"held_in_{key}": by_setting[record["gamma"], record["temperature"]][key]
                          for key in HELD_IN_KEYS}} if (record["gamma"], record["temperature"]) in by_setting
            else record for record in records]


def held_in_gap(record: dict, fraction: float) -> str | None:
    """The warning for a record whose held-out acceptance is below ``fraction`` of its held-in acceptance."""
    held_in, held_out = record.get("held_in_acceptance_rate"), record["acceptance_rate"]
    if not held_in or fraction <= 0 or held_out >= fraction * held_in:
        return None
    return (f"step {record['step']} gamma {record['gamma']} temperature {record['temperature']:g}: held-out "
            f"acceptance {held_out:.3f} is {held_out / held_in:.2f} of held-in {held_in:.3f} (below "
            f"eval.held_in_warning {fraction:g}): the draft fits its training prompts more than new ones; more varied "
            "rows help more than more steps")


def on_schedule(step: int, args: TrainingArguments, max_steps: int) -> bool:
    """Whether checkpoint `step` is one the save schedule makes (every save_steps, the last step), not one a
    preemption saved off it for resume: an uninterrupted run measures only the scheduled ones, and so does a resumed
    one, so both pick their export among the same checkpoints."""
    if step >= max_steps or str(getattr(args.save_strategy, "value", args.save_strategy)) != "steps":
        return True
    interval = args.save_steps if args.save_steps >= 1 else math.ceil(max_steps * args.save_steps)
    return step % int(interval) == 0


class AcceptanceCallback(TrainerCallback):
    """Measures acceptance of the draft against the target on rank 0 at every checkpoint; see module docstring."""

    def __init__(self, target: PreTrainedModel, prompts: list[torch.Tensor], cfg: EvalConfig, *, kind: TrainingKind,
                 evaluate: Evaluate | None = None, tensorboard: bool = True,
                 categories: list[str | None] | None = None, held_in: list[torch.Tensor] | None = None,
                 acceptance: Evaluate | None = None):
        self.target, self.prompts, self.cfg, self.kind = target, prompts, cfg, kind
        self.held_in = held_in or []  # prompts of the training rows (eval.held_in_prompts), measured beside
        self.acceptance = acceptance or _default_acceptance(kind)
        # one per prompt: each record then holds by_category (passed on only when some prompt has a category)
        self.categories = categories if categories and any(c is not None for c in categories) else None
        self.evaluate = evaluate or _default_evaluate(kind)
        self.tensorboard = tensorboard
        self._writer = None
        self.measured_steps: set[int] = set()
        self._whole_target: PreTrainedModel | None = None  # ZeRO-3 / FSDP2: rank 0's gathered copy (CPU), made once
        self._target_gathered = False  # on every rank: whether that (collective) gathering has happened
        self.cost_ratios: dict[CostKey, CostRatios] | None = None  # (temperature, gamma) -> c, v: once per run
        # (target, draft): the token counts their packed layers keep on F.linear, tuned at the first measurement
        self.plain_rows: tuple[frozenset[int] | None, ...] | None = None

    # ---- Trainer events ---------------------------------------------------------------------------------------

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: PreTrainedModel | None = None, **kwargs):
        """Keep the complete measurements of steps this run has already done (resume), drop those of an abandoned
        future and any interrupted one, then measure every saved checkpoint that still lacks its lines."""
        model = served_draft(model, self.kind)
        if state.is_world_process_zero:
            records = read_records(args.output_dir)
            done = complete_steps(records, self.cfg.gammas, self.cfg.temperatures)
            kept = [r for r in records if r["step"] <= state.global_step and r["step"] in done]
            os.makedirs(args.output_dir, exist_ok=True)
            rewrite_records(args.output_dir, kept)
            self.measured_steps = {r["step"] for r in kept}
            self.cost_ratios = self.cost_ratios or logged_cost_ratios(kept, self.cfg.gammas, self.cfg.temperatures)
            self._protect_best(args, state, kept)
        PartialState().wait_for_everyone()
        self.measure_missing(args, state, model)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    model: PreTrainedModel | None = None, **kwargs):
        """Under ZeRO-3 or FSDP2 save the last step too: the export then loads whole weights from that checkpoint."""
        if model is not None and state.global_step >= state.max_steps and is_partitioned(model):
            control.should_save = True

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                model: PreTrainedModel | None = None, **kwargs):
        """Measure the checkpoint just saved; not one saved on a stop before the last step (a preemption: its grace
        period is for the save; the resumed run measures it if the schedule made it, on_schedule)."""
        if control.should_training_stop and state.global_step < state.max_steps:
            return
        if self.cfg.at_checkpoints:
            self._measure_on_rank_zero(args, state, served_draft(model, self.kind),
                                       f"checkpoint-{state.global_step}")

    # ---- after training (specdistill.pipeline's measure step) -------------------------------------------------------

    def measure_remaining(self, args: TrainingArguments, state: TrainerState, model: nn.Module | None) -> None:
        """Measure every checkpoint up to state.global_step that still lacks its lines, then the final step unless
        it is measured already; close TensorBoard. Called on every rank, after training."""
        self.measure_missing(args, state, model)
        if state.global_step not in self.measured_steps:
            self._measure_on_rank_zero(args, state, model, "final")
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # ---- measuring --------------------------------------------------------------------------------------------

    def _measure_on_rank_zero(self, args: TrainingArguments, state: TrainerState, model: PreTrainedModel | None,
                              checkpoint: str) -> None:
        """Rank 0 measures and records; every rank (this is called on all of them) then meets at one barrier.
        Under ZeRO-3 / FSDP2 every rank first takes part in gathering the whole draft (and, once, the target)."""
        if not self.prompts or model is None:
            draft = None
        elif is_partitioned(model):  # ZeRO-3 / FSDP2: a collective, the copy lands on rank 0 (None elsewhere)
            draft = carry_draft_vocab(model, plain_copy(model))
            if is_partitioned(self.target) and not self._target_gathered:
                self._whole_target = plain_copy(self.target)
                self._target_gathered = True
        elif not state.is_world_process_zero:
            draft = None
        else:
            # LoRA: measure the merged draft, as exported
            draft = carry_draft_vocab(model, plain_copy(model)) if is_lora(model) else model
        if state.is_world_process_zero and draft is not None:
            self._record(args, state, state.global_step, checkpoint, draft)
        self.measured_steps.add(state.global_step)
        PartialState().wait_for_everyone()

    def _record(self, args: TrainingArguments, state: TrainerState, step: int, checkpoint: str,
                draft: PreTrainedModel) -> None:
        """Measure `draft` (rank 0) and append its lines to acceptance.jsonl in one write."""
        records = [{"step": step, "checkpoint": checkpoint, **r} for r in self.measure(draft, device=args.device)]
        crash_point("acceptance")  # test hook: killed with the measurement done but not yet written
        append_records(args.output_dir, records)
        self._write_tensorboard(args, step, records)
        for r in records:
            held_in = (f" (held-in: acceptance_rate {r['held_in_acceptance_rate']:.3f}, mean_accepted_tokens "
                       f"{r['held_in_mean_accepted_tokens']:.2f})" if "held_in_acceptance_rate" in r else "")
            logger.info("step %d gamma %s temperature %g: acceptance_rate %.3f, mean_accepted_tokens %.2f, "
                        "speedup %.2f%s", r["step"], r["gamma"], r["temperature"], r["acceptance_rate"],
                        r["mean_accepted_tokens"], r["speedup"], held_in)
            gap = held_in_gap(r, self.cfg.held_in_warning)
            if gap:
                logger.warning(gap)
        self._protect_best(args, state, read_records(args.output_dir))

    def measure_missing(self, args: TrainingArguments, state: TrainerState, model: nn.Module | None) -> list[int]:
        """Measure every complete checkpoint up to state.global_step that has no complete lines yet (a run killed
        before measuring it), loading its draft from disk. Called on every rank; returns the steps measured."""
        if not self.cfg.at_checkpoints or not self.prompts or model is None:
            return []
        missing = []
        if state.is_world_process_zero:
            missing = [str(folder) for folder in find_checkpoints(args.output_dir).complete
                       if checkpoint_step(folder) <= state.global_step
                       and checkpoint_step(folder) not in self.measured_steps
                       and on_schedule(checkpoint_step(folder), args, state.max_steps)]
        if PartialState().num_processes > 1:
            from accelerate.utils import broadcast_object_list
            missing = broadcast_object_list([missing])[0]
        if missing and is_partitioned(self.target) and not self._target_gathered:  # a collective, every rank
            self._whole_target = plain_copy(self.target)
            self._target_gathered = True
        if state.is_world_process_zero:
            for folder in missing:
                logger.info("measuring acceptance of %s (saved before an interruption, not measured yet)", folder)
                draft = draft_at_checkpoint(Path(folder), model, self.kind).to(args.device)
                self._record(args, state, checkpoint_step(folder), Path(folder).name, draft)
        steps = [checkpoint_step(folder) for folder in missing]
        self.measured_steps.update(steps)
        PartialState().wait_for_everyone()
        return steps

    def measure(self, draft: PreTrainedModel, device: torch.device | str | None = None) -> list[dict]:
        """Result dicts (one per gamma and temperature) of `draft` against the target; draft in eval mode meanwhile.

        `device`: where copies of the models (LoRA merged, ZeRO-3 / FSDP2 gathered) are measured; the draft itself is
        measured where it is. A partitioned target is replaced by its gathered copy, moved there and back.
        """
        target = self.target
        if is_partitioned(target):
            if self._whole_target is None:
                raise RuntimeError("the sharded target was not gathered before measuring (see _measure_on_rank_zero)")
            target = self._whole_target.to(device)
            draft = draft.to(device)
        # eager on CPU: both models on oneDNN-packed layers while measured, as specdistill-eval decodes by default
        # (--cpu-linear auto): tuned at the first measurement of the run, that choice kept at every later one
        models = () if self.cfg.compile else (target, draft)
        tune_rows = range(1, max(cost_gammas(self.cfg.gammas)) + 2)
        try:
            with packed_linears(*models, tune_rows=tune_rows, plain_rows=self.plain_rows) as packing:
                self.plain_rows = packing.plain_rows
                if self.cost_ratios is None:  # architectures, hardware and sampling: the same at every checkpoint
                    prompt = self.prompts[0].view(1, -1).to(next(target.parameters()).device)
                    self.cost_ratios = {
                        (t, g): measure_cost_ratios(target, draft, prompt, g, repeats=COST_REPEATS,
                                                    compile=self.cfg.compile, new_tokens=self.cfg.max_new_tokens,
                                                    sampling=self.cfg.decoder_settings(t).sampling, kind=self.kind)
                        for t in self.cfg.temperatures for g in cost_gammas(self.cfg.gammas)}
                results = []
                for temperature in self.cfg.temperatures:
                    settings = self.cfg.decoder_settings(temperature)
                    by_category = {"categories": self.categories} if self.categories else {}
                    costs = {g: ratios for (t, g), ratios in self.cost_ratios.items() if t == temperature}
                    with eval_mode(draft):
                        measured = self.evaluate(target, draft, self.prompts, settings, progress=False,
                                                 cost_ratios=costs, **by_category)
                        if self.held_in:
                            measured = with_held_in(measured, self.acceptance(target, draft, self.held_in, settings))
                    results += measured
            return results
        finally:
            if target is not self.target:
                self._whole_target.to("cpu")

    def _write_tensorboard(self, args: TrainingArguments, step: int, records: list[dict]) -> None:
        if not self.tensorboard:
            return
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter
            self._writer = SummaryWriter(log_dir=os.path.join(args.output_dir, "runs", "acceptance"))
        several = len(self.cfg.temperatures) > 1
        for record in records:
            prefix = f"acceptance/temperature{record['temperature']}/" if several else "acceptance/"
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("step", "gamma"):
                    self._writer.add_scalar(f"{prefix}gamma{record['gamma']}/{key}", value, step)
        self._writer.flush()

    def _protect_best(self, args: TrainingArguments, state: TrainerState, records: list[dict]) -> None:
        """Point state.best_model_checkpoint at the best folder so save_total_limit never deletes it."""
        best = best_record(records, self.cfg.temperatures[0])
        folder = os.path.join(args.output_dir, best["checkpoint"]) if best else None
        state.best_model_checkpoint = folder if folder and os.path.isdir(folder) else None
