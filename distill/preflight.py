"""What scripts/train.py checks before it tokenises anything or loads a weight, and what the output folder holds.

Every check raises an error whose one-line message names the recipe key (and file or path): RecipeError for
keys transformers would only refuse later (scheduler, optimizer, trackers), FileProblem for paths (output folder,
truncated weights, a target without tokenizer files), ModelSetupError for a checkpoint of another shape.

The output folder: a fresh run into a folder that holds a previous run is refused (nothing is ever overwritten
silently); train.resume_from_checkpoint=true continues it, train.overwrite_output_dir=true deletes that run first.
"""
from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from decode.checks import FileProblem, check_safetensors_whole, check_tokenizer_files, check_writable_folder
from distill.acceptance_log import ACCEPTANCE_LOG
from distill.checkpoints import PARTIAL_DIR, Checkpoints, find_checkpoints, finished_step, report_incomplete
from distill.config import Recipe, RecipeError

logger = logging.getLogger(__name__)

RESULTS_FILE = "train_results.json"
# What a run leaves in train.output_dir (besides checkpoint-*): the exported draft, its logs and results.
RUN_FILES = (ACCEPTANCE_LOG, RESULTS_FILE, "recipe.yaml", "model.safetensors", "model.safetensors.index.json",
             "adapter_model.safetensors")
RUN_GLOBS = ("checkpoint-*", PARTIAL_DIR, "runs", ACCEPTANCE_LOG + ".tmp", "model-*.safetensors", "config.json",
             "generation_config.json", "tokenizer*", "special_tokens_map.json", "chat_template.jinja", *RUN_FILES)


# ---------------------------------------------------------------------------------------------------------------
# Names transformers would refuse only after the models are loaded
# ---------------------------------------------------------------------------------------------------------------

def check_train_names(recipe: Recipe, source: str) -> None:
    """train.lr_scheduler_type, train.optim and train.report_to name things transformers has (and installed)."""
    from transformers.integrations.integration_utils import (INTEGRATION_TO_CALLBACK,
                                                             get_available_reporting_integrations)
    from transformers.trainer_utils import SchedulerType
    from transformers.training_args import OptimizerNames

    train = recipe.train
    schedulers = [s.value for s in SchedulerType]
    if train.lr_scheduler_type not in schedulers:
        raise RecipeError("train.lr_scheduler_type", f"got {train.lr_scheduler_type!r}; allowed: "
                          f"{', '.join(schedulers)}", source)
    optimizers = [o.value for o in OptimizerNames]
    if train.optim not in optimizers:
        raise RecipeError("train.optim", f"got {train.optim!r}; allowed: a transformers optimizer name such as "
                          f"adamw_torch, adamw_torch_fused, sgd, adafactor ({len(optimizers)} in all)", source)
    available = get_available_reporting_integrations()
    for name in train.report_to:
        if name in ("none", "all"):
            continue
        if name not in INTEGRATION_TO_CALLBACK:
            raise RecipeError("train.report_to", f"got {name!r}; allowed: {', '.join(INTEGRATION_TO_CALLBACK)}",
                              source)
        if name not in available:
            raise RecipeError("train.report_to", f"{name!r} is not installed (pip install {name}); installed: "
                              f"{', '.join(available) or 'none'}; use [] for no tracker", source)


def check_model_files(recipe: Recipe) -> None:
    """Local model folders: whole safetensors files, and tokenizer files where the tokenizer is read from."""
    model = recipe.model
    check_safetensors_whole(model.target, "model.target")
    if model.draft is not None:
        check_safetensors_whole(model.draft, "model.draft")
    if model.tokenizer is None:
        check_tokenizer_files(model.target, "model.target",
                              "set model.tokenizer to a folder or hub id holding the target's tokenizer")
    else:
        check_tokenizer_files(model.tokenizer, "model.tokenizer", "give a folder that holds a tokenizer")


# ---------------------------------------------------------------------------------------------------------------
# The output folder
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class RunPlan:
    """Where training starts: a fresh run, a checkpoint to resume from, or a run that has already finished."""

    resume: str | None  # a checkpoint folder for Trainer.train, or None
    finished_at: int | None = None  # the run already ended at this step: nothing to train
    results: dict | None = None  # its train_results.json when everything after training is done too


def previous_run_files(output_dir: Path) -> list[str]:
    """Names of what a previous run left in output_dir (empty for a new or unrelated folder)."""
    if not output_dir.is_dir():
        return []
    found = {p.name for pattern in ("checkpoint-*", PARTIAL_DIR, *RUN_FILES) for p in output_dir.glob(pattern)}
    return sorted(found)


def plan_run(recipe: Recipe, source: str) -> RunPlan:
    """Check train.output_dir and decide where to start; raises RecipeError / FileProblem (one line)."""
    train, output_dir = recipe.train, Path(recipe.train.output_dir)
    check_writable_folder(output_dir, "train.output_dir")
    for key in ("model.target", "model.draft", "model.tokenizer"):
        model_folder = getattr(recipe.model, key.split(".")[1])
        if model_folder and Path(model_folder).expanduser().resolve() == output_dir.expanduser().resolve():
            raise RecipeError("train.output_dir", f"{output_dir} is the folder of {key}; the run would write over "
                              "it: choose another folder", source)
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
    results_file = output_dir / RESULTS_FILE
    results = None
    if results_file.is_file() and Path(resume).parent == output_dir:
        try:
            results = json.loads(results_file.read_text())
        except ValueError:
            results = None  # a torn write: export again
    return RunPlan(resume=resume, finished_at=step, results=results)


def _step_of(checkpoint: str, max_steps: int) -> int | None:
    """The checkpoint's step when it has reached train.max_steps, else None."""
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
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
        return str(folder)
    report_incomplete(found)
    if found.latest is not None:
        logger.info("resuming from %s", found.latest)
        return str(found.latest)
    if "recipe.yaml" in used:  # this run started here but was stopped before its first complete checkpoint
        logger.warning("%s holds no complete checkpoint yet: training starts again from step 0", output_dir)
        return None
    raise FileProblem(f"train.resume_from_checkpoint is true but {output_dir} holds no checkpoint-* folder")


def clear_previous_run(output_dir: str | Path) -> None:
    """Delete what an earlier run left in output_dir (train.overwrite_output_dir=true; rank 0)."""
    output_dir = Path(output_dir)
    for pattern in RUN_GLOBS:
        for path in output_dir.glob(pattern):
            logger.info("train.overwrite_output_dir: deleting %s", path)
            shutil.rmtree(path) if path.is_dir() else path.unlink()


# ---------------------------------------------------------------------------------------------------------------
# Model settings that need configs only
# ---------------------------------------------------------------------------------------------------------------

SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size")


def check_attn_implementation(recipe: Recipe) -> None:
    """model.attn_implementation is one transformers can use for the target (built on the meta device)."""
    name = recipe.model.attn_implementation
    if name is None:
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from distill.models import ModelSetupError

    config = AutoConfig.from_pretrained(recipe.model.target, trust_remote_code=recipe.model.trust_remote_code)
    try:
        with torch.device("meta"):
            AutoModelForCausalLM.from_config(config, attn_implementation=name,
                                             trust_remote_code=recipe.model.trust_remote_code)
    except (ValueError, ImportError) as err:
        reason = str(err).strip().splitlines()[0][:300]
        raise ModelSetupError(f"model.attn_implementation: got {name!r}; {reason}") from None


def check_resume_shape(recipe: Recipe, resume: str | None) -> None:
    """The checkpoint to resume from holds a draft of the recipe's shape (else loading it fails with a trace)."""
    if resume is None or not (Path(resume) / "config.json").is_file():
        return
    from transformers import AutoConfig
    from distill.models import ModelSetupError, draft_config

    trust = recipe.model.trust_remote_code
    planned = draft_config(recipe.model, AutoConfig.from_pretrained(recipe.model.target, trust_remote_code=trust))
    saved = AutoConfig.from_pretrained(resume, trust_remote_code=trust)
    for key in SHAPE_KEYS:
        want, got = getattr(planned.get_text_config(), key, None), getattr(saved.get_text_config(), key, None)
        if want != got:
            raise ModelSetupError(f"train.resume_from_checkpoint: {resume} holds a draft with {key} {got!r}, the "
                                  f"recipe's draft has {want!r}; resume with the recipe that made it, or start a "
                                  "new run (train.overwrite_output_dir=true)")
