"""One run of a recipe, as six named steps (README, "What a run does"), each one call into the module that owns it:

  1. check     distill.run.preflight     recipe, output folder, processes, tokenizer and draft plan from configs,
                                         and the dataset read and tokenised: every problem named before a weight loads
  2. load      distill.models.load       the frozen target and the trainable draft (under FSDP2 the target is sharded
                                         by distill.models.fsdp after step 3, which may run it on the main process)
  3. tokenise  distill.data.sources      the training rows: the dataset's, the target's responses, the teacher cache
                                         (then the draft's kind prepares on them, e.g. a head's draft vocabulary)
  4. distil    distill.run.trainer       DistillTrainer, with AcceptanceCallback measuring every checkpoint it saves
  5. measure   distill.run.callbacks     acceptance of every checkpoint that still lacks it, and of the final step
  6. export    distill.publish.export    the best checkpoint as a model folder, its deployment check,
                                         train_results.json (last), the optional hub push

Every process runs every step; what only rank 0 writes is decided inside each step. specdistill.cli.train
(`specdistill-train`, `scripts/train.py`) is the command line around run_recipe.
"""
from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from accelerate import PartialState

from decode.inputs.folder_lock import RUN_LOCK, release_folder
from distill.data.rows import held_in_prompts
from distill.data.sources import training_rows, with_synthesized_prompts
from distill.models.fsdp import fsdp_enabled, shard_for_inference
from distill.models.load import load_models
from distill.publish.export import export_run
from distill.recipe.sections import Recipe
from distill.run.callbacks import AcceptanceCallback
from distill.run.distil import distil
from distill.run.preemption import Preempted, PreemptionCallback
from distill.run.preflight import check_run
from distill.utils import crash_point

logger = logging.getLogger(__name__)

@dataclass
class RunOutcome:
    """What a run did: the exported draft's summary (export_draft; empty on ranks other than 0), or, when the
    output folder already held this run finished, that run's summary and the step it finished at."""

    summary: dict
    finished_before: int | None = None  # the step of a run found finished: nothing was done


def run_recipe(recipe: Recipe, source: str, overrides: Sequence[str] = ()) -> RunOutcome:
    """Run `recipe` (loaded from the file `source` with the key=value `overrides`, which errors name) end to end.
    Raises the errors of each step (RecipeError, DataError, ModelSetupError, FileProblem, PushError, ...). The check
    step locks train.output_dir for this process (decode.inputs.folder_lock); it is let go however the run ends."""
    output_dir = recipe.train.output_dir
    try:
        # 1. check: nothing heavy yet; a run found finished is left as it is
        checked = check_run(recipe, source, overrides)
        if checked.done:
            return RunOutcome(checked.plan.results.get("best", {}), finished_before=checked.plan.finished_at)
        if recipe.kind_defaults:  # keys the recipe left unset, filled with what works for its kind of draft
            logger.info("model.draft_kind %s supplied %s (set a key in the recipe to override it)",
                        recipe.model.draft_kind, ", ".join(f"{k}={v}" for k, v in recipe.kind_defaults.items()))
        recipe, args, tokenizer, data = checked.recipe, checked.args, checked.tokenizer, checked.data  # .gguf: folders
        kind = recipe.model.kind  # kinds/<kind>/: what differs between draft kinds, chosen by the recipe, handed down
        # 2. load
        target, draft = load_models(recipe.model, recipe.lora, args.device)
        crash_point("models-loaded")  # test hook: SPECDISTILL_KILL_AT=models-loaded with SPECDISTILL_KILL_SIGNAL=TERM
        # 3. tokenise (prompts the target writes first, when the recipe asks for them)
        data = with_synthesized_prompts(recipe, data, target, tokenizer, args)
        rows = training_rows(recipe, data, target, draft, tokenizer, args)
        kind.prepare(recipe, draft, target, rows)  # e.g. a head's vocabulary: the rows' most frequent label tokens
        if fsdp_enabled():  # FSDP2: nothing runs the target on one process alone any more: shard it over all of them
            shard_for_inference(target, args.device)
        # 4. distil
        held_in = held_in_prompts(rows.rows, recipe.eval.held_in_prompts, recipe.data.eval_prompt_tokens,
                                  recipe.train.seed)
        acceptance = AcceptanceCallback(target, data.eval_prompts, recipe.eval, kind=kind,
                                        categories=data.eval_categories,
                                        tensorboard="tensorboard" in recipe.train.report_to, held_in=held_in)
        preemption = PreemptionCallback(recipe.train.preemption_grace_s)  # SIGTERM & co: save this step, stop
        try:
            distilled = distil(recipe, args, target, draft, rows, tokenizer, [acceptance, preemption],
                               resume=checked.plan.resume, finished_at=checked.plan.finished_at)
        finally:  # a run that raised mid-training never saw on_train_end: its signal handlers go with it all the same
            preemption.uninstall()
        try:
            preemption.finish(args.output_dir, PartialState().is_main_process)  # Preempted: steps 5 and 6 on resume
        except Preempted:
            distilled.end()
            raise
        # 5. measure
        acceptance.measure_remaining(args, distilled.state, distilled.draft)
        # 6. export
        summary = export_run(recipe, distilled.draft, tokenizer, distilled.metrics, data.eval_prompts,
                             data.eval_categories)
        distilled.end()  # every process leaves together
        return RunOutcome(summary)
    finally:  # however the run ends
        release_folder(output_dir, RUN_LOCK)


def prepare_data(recipe: Recipe, source: str, overrides: Sequence[str] = ()) -> Recipe:
    """Steps 1-3 of a run and nothing after: every stored thing the recipe's rows need from the target (synthesized
    prompts, the target's responses, the teacher or hidden-state cache) built or resumed where the recipe keeps
    it, so that a later run with the same recipe finds them (`specdistill-data hidden-states`). The run's own
    output folder is not touched (the check step sees a scratch one). Returns the recipe as checked (.gguf paths
    as their folders)."""
    with tempfile.TemporaryDirectory(prefix="specdistill-data-") as scratch:
        scratch_run = recipe.model_copy(update={"train": recipe.train.model_copy(update={"output_dir": scratch})})
        try:
            checked = check_run(scratch_run, source, overrides)
            target, draft = load_models(checked.recipe.model, checked.recipe.lora, checked.args.device)
            data = with_synthesized_prompts(checked.recipe, checked.data, target, checked.tokenizer, checked.args)
            training_rows(checked.recipe, data, target, draft, checked.tokenizer, checked.args)
            return checked.recipe
        finally:
            release_folder(scratch, RUN_LOCK)
