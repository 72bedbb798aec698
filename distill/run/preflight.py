"""The check step of a run (specdistill.pipeline): everything that can fail is checked before a weight is loaded.

check_run goes through, in order: the hub settings and trackers transformers would refuse late (RecipeError), the
precision for this machine, the output folder and where training starts (plan_run), transformers' own checks of
the TrainingArguments, the processes and the device mode, a .gguf model path turned into its converted folder (once,
on the main process first: decode.inputs.gguf), the model files (FileProblem for truncated weights, a target without
tokenizer files), the tokenizer and the draft plan from configs (ModelSetupError), and the dataset
itself: it is read and tokenised here (once, on the main process first; `datasets` caches it), so that a bad file
or column is named before any weight loads.

The output folder (distill.outputs.run_folder): a fresh run into a folder that holds a previous run is refused (nothing
is ever overwritten silently); train.resume_from_checkpoint=true continues it, train.overwrite_output_dir=true
deletes that run when training starts. A folder another live run holds (decode.inputs.folder_lock) is refused too.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from accelerate import PartialState
from transformers import AutoConfig, PreTrainedTokenizerBase, TrainingArguments, set_seed

from decode.inputs.checks import (
    FileProblem,
    check_json_files_text,
    check_language_model_folder,
    check_safetensors_whole,
    check_tokenizer_files,
    check_writable_folder,
    read_text,
)
from decode.inputs.folder_lock import RUN_LOCK, FolderInUse, hold_folder
from distill.data.dataset import build_data
from distill.data.rows import DistillData
from distill.models.distributed import check_device_mode, check_fsdp_devices
from distill.models.load import ModelSetupError, check_model_plan, load_tokenizer, with_model_folders
from distill.outputs.checkpoints import (
    Checkpoints,
    corruption,
    find_checkpoints,
    finished_step,
    report_incomplete,
    verified_latest,
)
from distill.outputs.run_folder import RECIPE_FILE, previous_run_files, read_results, recipe_changes
from distill.recipe.sections import OVERRIDE_SOURCE, Recipe, RecipeError, check_precision
from distill.recipe.train_config import training_arguments

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------------
# The check step
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class CheckedRun:
    """What the check step hands on: where training starts and, unless the run is already done, the processes'
    TrainingArguments, the tokenizer, the tokenised data (rows and acceptance prompts) and the recipe the run goes
    on with (a .gguf model path replaced by its converted folder: distill.models.load.with_model_folders)."""

    plan: RunPlan
    args: TrainingArguments | None = None
    tokenizer: PreTrainedTokenizerBase | None = None
    data: DistillData | None = None
    recipe: Recipe | None = None

    @property
    def done(self) -> bool:
        """The output folder holds this run finished, train_results.json written: nothing is left to do."""
        return self.plan.results is not None


def check_run(recipe: Recipe, source: str, overrides: Sequence[str] = ()) -> CheckedRun:
    """Every check of a run before a weight loads (see the module docstring); `source` is the recipe file and
    `overrides` its key=value arguments, named in the errors. Also sets up the processes and the seed."""
    # ---- recipe and output folder ----------------------------------------------------------------------------
    check_hub_settings(recipe, source)
    check_trackers(recipe, source)  # named now, not when the Trainer starts (after loading models)
    check_precision(recipe.train)  # fp16 on CPU, bf16 without a bf16 GPU: named before TrainingArguments sees them
    check_paths_beside_the_recipe(recipe, source)  # a repository's recipe run from another folder
    plan = plan_run(recipe, source)  # a used output folder is refused; resume picks the latest complete checkpoint
    if plan.results is not None:
        return CheckedRun(plan)
    args = arguments_of(recipe, source, overrides)  # also sets up the processes (accelerate launch / torchrun)
    check_device_mode(args)
    check_fsdp_devices(args)
    PartialState()
    set_seed(recipe.train.seed)

    # ---- tokenizer and model plan: configs only, no weights yet ----------------------------------------------
    recipe = recipe.model_copy(update={"model": with_model_folders(recipe.model)})  # a .gguf: converted once
    check_model_files(recipe)  # truncated safetensors, a target folder without tokenizer files
    tokenizer = load_tokenizer(recipe.model)
    check_model_plan(recipe.model, tokenizer, hidden_state_cache=recipe.distill.hidden_state_cache is not None)
    check_attn_implementation(recipe)
    check_resume_shape(recipe, plan.resume)
    note_recipe_changes(recipe, plan.resume)
    topk_from_override = any(a.startswith("distill.teacher_topk=") for a in overrides)
    check_teacher_topk(recipe, OVERRIDE_SOURCE if topk_from_override else source)  # k <= the target's vocabulary

    # ---- data: read and tokenised once on rank 0 (datasets cache), read by the others -----------------------
    with args.main_process_first(desc="tokenise dataset"):
        data = build_data(recipe.data, tokenizer, seed=recipe.train.seed, chat_template=recipe.eval.chat_template)
    logger.info("%d training rows (%s), %d acceptance prompts", len(data.train), data.format, len(data.eval_prompts))
    return CheckedRun(plan, args, tokenizer, data, recipe)


# ---------------------------------------------------------------------------------------------------------------
# Settings that need no file
# ---------------------------------------------------------------------------------------------------------------

def check_hub_settings(recipe: Recipe, source: str) -> None:
    """A bad hub.repo_id fails now, not after training."""
    if recipe.hub.push_to_hub:
        from distill.publish.hub import check_repo_id
        try:
            check_repo_id(recipe.hub.repo_id)
        except ValueError as err:
            raise RecipeError("hub.repo_id", str(err), source) from None


def check_trackers(recipe: Recipe, source: str) -> None:
    """train.report_to names trackers transformers has, and that are installed."""
    from transformers.integrations.integration_utils import (
        INTEGRATION_TO_CALLBACK,
        get_available_reporting_integrations,
    )

    report_to = recipe.train.report_to
    available = get_available_reporting_integrations()
    for name in [report_to] if isinstance(report_to, str) else report_to or []:
        if name in ("none", "all"):
            continue
        if name not in INTEGRATION_TO_CALLBACK:
            raise RecipeError("train.report_to", f"got {name!r}; allowed: {', '.join(INTEGRATION_TO_CALLBACK)}",
                              source)
        if name not in available:
            raise RecipeError("train.report_to", f"{name!r} is not installed (pip install {name}); installed: "
                              f"{', '.join(available) or 'none'}; use [] for no tracker", source)


def arguments_of(recipe: Recipe, source: str, overrides: Sequence[str]) -> TrainingArguments:
    """TrainingArguments of the train section; a combination transformers refuses is one RecipeError."""
    try:
        return training_arguments(recipe.train)
    except ValueError as err:
        where = OVERRIDE_SOURCE if any(a.startswith("train.") for a in overrides) else source
        reason = " ".join(str(err).split())[:400]
        raise RecipeError("train", f"transformers.TrainingArguments refused these settings: {reason}", where) from None


def check_teacher_topk(recipe: Recipe, source: str) -> None:
    """distill.teacher_topk must not exceed the target's vocabulary (read from its config: no weights loaded).
    Raises RecipeError naming the key."""
    if recipe.distill.teacher_cache is None:
        return
    config = AutoConfig.from_pretrained(recipe.model.target, trust_remote_code=recipe.model.trust_remote_code)
    vocab = config.get_text_config().vocab_size
    k = recipe.distill.teacher_topk
    if k > vocab:
        raise RecipeError("distill.teacher_topk", f"got {k}; allowed: an integer in [1, {vocab}] (the target's "
                                                  "vocabulary size)", source)


def check_model_files(recipe: Recipe) -> None:
    """Local model folders: whole safetensors files, JSON files that are text, and tokenizer files where the
    tokenizer is read from."""
    model = recipe.model
    for key in ("target", "draft", "tokenizer"):
        if getattr(model, key) is not None:
            check_json_files_text(getattr(model, key), f"model.{key}")
    check_safetensors_whole(model.target, "model.target")
    check_language_model_folder(model.target, "model.target")  # a draft's folder is no target
    if model.draft is not None:
        check_safetensors_whole(model.draft, "model.draft")
    if model.tokenizer is None:
        check_tokenizer_files(model.target, "model.target",
                              "set model.tokenizer to a folder or hub id holding the target's tokenizer")
    else:
        check_tokenizer_files(model.tokenizer, "model.tokenizer", "give a folder that holds a tokenizer")


# Input paths a recipe names relative to the folder the command runs in (its documented meaning)
RELATIVE_INPUTS = ("data.dataset", "data.eval_prompts")


def check_paths_beside_the_recipe(recipe: Recipe, source: str) -> None:
    """A relative input path that is not under the current folder but is under a folder holding the recipe file (a
    repository's `recipes/...` run from elsewhere): one line naming where it is and the two ways to use it, not a
    "does not exist" (or a hub lookup) for a file the user can see."""
    recipe_file = Path(source)
    if not recipe_file.is_file():
        return
    for key in RELATIVE_INPUTS:
        section, name = key.split(".")
        value = getattr(getattr(recipe, section), name)
        if not value or Path(value).is_absolute() or Path(value).exists():
            continue
        root = next((d for d in recipe_file.resolve().parents if (d / value).exists()), None)
        if root is not None:
            raise RecipeError(key, f"{value} is not under the current folder ({Path.cwd()}), which relative paths "
                              f"are read from, but is under {root}: run from there or set {key}={root / value}",
                              source)


# ---------------------------------------------------------------------------------------------------------------
# The output folder
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class RunPlan:
    """Where training starts: a fresh run, a checkpoint to resume from, or a run that has already finished."""

    resume: str | None  # a checkpoint folder for Trainer.train, or None
    finished_at: int | None = None  # the run already ended at this step: nothing to train
    results: dict | None = None  # its train_results.json when everything after training is done too


def plan_run(recipe: Recipe, source: str) -> RunPlan:
    """Check train.output_dir and decide where to start; raises RecipeError / FileProblem (one line)."""
    train, output_dir = recipe.train, Path(recipe.train.output_dir)
    check_writable_folder(output_dir, "train.output_dir")
    for key in ("model.target", "model.draft", "model.tokenizer"):
        model_folder = getattr(recipe.model, key.split(".")[1])
        if model_folder and Path(model_folder).expanduser().resolve() == output_dir.expanduser().resolve():
            raise RecipeError("train.output_dir", f"{output_dir} is the folder of {key}; the run would write over "
                              "it: choose another folder", source)
    try:  # the folder is this run's from here to its end (specdistill.pipeline lets go): a second run is refused
        hold_folder(output_dir, RUN_LOCK)
    except FolderInUse as err:
        raise RecipeError("train.output_dir", str(err), source) from None
    used = previous_run_files(output_dir)
    if train.resume_from_checkpoint is None:
        if used and not train.overwrite_output_dir:
            shown = ", ".join(used[:4]) + (", ..." if len(used) > 4 else "")
            raise RecipeError("train.output_dir", f"{output_dir} already holds a run ({shown}); continue it with "
                              "train.resume_from_checkpoint=true, replace it with train.overwrite_output_dir=true, "
                              "or choose another folder", source)
        return RunPlan(resume=None)
    found = find_checkpoints(output_dir) if train.resume_from_checkpoint is True else None
    resume = _resume_folder(recipe, found, used, source)
    if resume is None:
        return RunPlan(resume=None)
    step = finished_step(resume) if recipe.train.max_steps == -1 else _step_of(resume, recipe.train.max_steps)
    if step is None:
        return RunPlan(resume=resume)
    results = read_results(output_dir) if Path(resume).parent == output_dir else None  # None when torn: export
    return RunPlan(resume=resume, finished_at=step, results=results)


def _step_of(checkpoint: str, max_steps: int) -> int | None:
    """The checkpoint's step when it has reached train.max_steps, else None."""
    state = json.loads(read_text(Path(checkpoint) / "trainer_state.json"))
    return state["global_step"] if state.get("global_step", 0) >= max_steps else None


def _resume_folder(recipe: Recipe, found: Checkpoints | None, used: list[str], source: str) -> str | None:
    """train.resume_from_checkpoint as a complete checkpoint folder (None: start from step 0)."""
    resume, output_dir = recipe.train.resume_from_checkpoint, recipe.train.output_dir
    if found is None:  # a folder named explicitly
        folder = Path(resume)
        if not folder.is_dir():
            raise FileProblem(f"train.resume_from_checkpoint: no checkpoint folder at {folder}")
        if not (folder / "trainer_state.json").is_file():
            raise FileProblem(f"train.resume_from_checkpoint: {folder} is an incomplete checkpoint (no "
                              "trainer_state.json: its save was interrupted); name an earlier one")
        problem = corruption(folder)
        if problem is not None:
            raise FileProblem(f"train.resume_from_checkpoint: {folder} is not what was saved: {problem}; name an "
                              "earlier checkpoint")
        return str(folder)
    report_incomplete(found)
    latest = verified_latest(found)
    if latest is not None:
        logger.info("resuming from %s", latest)
        return str(latest)
    if found.complete:
        raise FileProblem(f"train.resume_from_checkpoint: every checkpoint in {output_dir} differs from what was "
                          f"saved ({corruption(found.complete[-1])}); start again with train.overwrite_output_dir=true")
    if RECIPE_FILE in used:  # this run started here but was stopped before its first complete checkpoint
        logger.warning("%s holds no complete checkpoint yet: training starts again from step 0", output_dir)
        return None
    raise FileProblem(f"train.resume_from_checkpoint is true but {output_dir} holds no checkpoint-* folder")


# ---------------------------------------------------------------------------------------------------------------
# Model settings that need configs only
# ---------------------------------------------------------------------------------------------------------------


def check_attn_implementation(recipe: Recipe) -> None:
    """model.attn_implementation is one transformers can use for the target (built on the meta device)."""
    name = recipe.model.attn_implementation
    if name is None:
        return
    import torch
    from transformers import AutoModelForCausalLM

    config = AutoConfig.from_pretrained(recipe.model.target, trust_remote_code=recipe.model.trust_remote_code)
    try:
        with torch.device("meta"):
            AutoModelForCausalLM.from_config(config, attn_implementation=name,
                                             trust_remote_code=recipe.model.trust_remote_code)
    except (ValueError, ImportError) as err:
        reason = str(err).strip().splitlines()[0][:300]
        raise ModelSetupError(f"model.attn_implementation: got {name!r}; {reason}") from None


def note_recipe_changes(recipe: Recipe, resume: str | None) -> None:
    """One warning when a resumed run learns otherwise than it started (another dataset, loss, target: often meant,
    easily not): the keys that differ from the recipe.yaml beside the checkpoint."""
    if resume is None:
        return
    changes = recipe_changes(Path(resume).parent / RECIPE_FILE, recipe)
    if changes:
        more = f" (and {len(changes) - 3} more)" if len(changes) > 3 else ""
        logger.warning("resuming from %s with a recipe that differs from the one the run started with (%s): %s%s; "
                       "training goes on from the checkpoint with the new values", resume,
                       Path(resume).parent / RECIPE_FILE, "; ".join(changes[:3]), more)


def check_resume_shape(recipe: Recipe, resume: str | None) -> None:
    """The checkpoint to resume from holds a draft of the recipe's shape (else loading it fails with a trace): its
    kind's check (kinds/<kind>/__init__.py, check_resume)."""
    if resume is not None:
        recipe.model.kind.check_resume(recipe, resume)
