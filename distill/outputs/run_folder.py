"""What a run leaves in train.output_dir, and the two writes that open and close it.

    recipe.yaml          the resolved recipe, written when training starts (start_run_folder)
    checkpoint-*/        Trainer checkpoints (distill.outputs.checkpoints), runs/ TensorBoard, acceptance.jsonl
    model files          the exported draft (distill.publish.export)
    train_results.json   written last, atomically (write_results): its presence means the run is done

A fresh run into a folder that holds a previous run is refused by distill.run.preflight; train.overwrite_output_dir=true
deletes that run first (clear_previous_run, when training starts: a run that fails its checks deletes nothing).
"""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import yaml
from accelerate import PartialState

from decode.inputs.checks import FileProblem, read_text
from decode.inputs.writes import write_atomic
from distill.outputs.acceptance_log import ACCEPTANCE_LOG
from distill.outputs.checkpoints import PARTIAL_DIR
from distill.recipe.loader import recipe_to_dict, save_recipe
from distill.recipe.sections import Recipe

logger = logging.getLogger(__name__)

RESULTS_FILE = "train_results.json"
RECIPE_FILE = "recipe.yaml"
# What a run leaves in train.output_dir (besides checkpoint-*): the exported draft, its logs and results.
RUN_FILES = (ACCEPTANCE_LOG, RESULTS_FILE, RECIPE_FILE, "model.safetensors", "model.safetensors.index.json",
             "adapter_model.safetensors")
RUN_GLOBS = ("checkpoint-*", PARTIAL_DIR, "runs", ACCEPTANCE_LOG + ".tmp", "model-*.safetensors", "config.json",
             "generation_config.json", "tokenizer*", "special_tokens_map.json", "chat_template.jinja", *RUN_FILES)


def previous_run_files(output_dir: Path) -> list[str]:
    """Names of what a previous run left in output_dir (empty for a new or unrelated folder)."""
    if not output_dir.is_dir():
        return []
    found = {p.name for pattern in ("checkpoint-*", PARTIAL_DIR, *RUN_FILES) for p in output_dir.glob(pattern)}
    return sorted(found)


def clear_previous_run(output_dir: str | Path) -> None:
    """Delete what an earlier run left in output_dir (train.overwrite_output_dir=true; rank 0)."""
    output_dir = Path(output_dir)
    for pattern in RUN_GLOBS:
        for path in output_dir.glob(pattern):
            logger.info("train.overwrite_output_dir: deleting %s", path)
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def start_run_folder(recipe: Recipe) -> None:
    """Rank 0 clears an earlier run (train.overwrite_output_dir) and writes recipe.yaml; every rank then waits."""
    state = PartialState()
    if state.is_main_process:
        output_dir = Path(recipe.train.output_dir)
        if recipe.train.overwrite_output_dir:
            clear_previous_run(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        save_recipe(recipe, output_dir / RECIPE_FILE)
    state.wait_for_everyone()


# The sections that say what a run learns from and how; train and eval (how long, how it is saved and measured) are
# what a resumed run is expected to change.
LEARNING_SECTIONS = ("model", "data", "distill", "lora")


def recipe_changes(started: str | Path, recipe: Recipe) -> list[str]:
    """What ``recipe`` sets otherwise than the recipe.yaml a run started with (``started``), in LEARNING_SECTIONS:
    "data.dataset: a.txt -> b.txt" per key. Paths naming the same file are equal; [] when the file is absent or
    unreadable (nothing to compare: resume does not depend on it)."""
    try:
        saved = yaml.safe_load(read_text(started))
    except (OSError, ValueError, yaml.YAMLError):
        return []
    now = recipe_to_dict(recipe)
    changes = []
    for section in LEARNING_SECTIONS:
        before, after = _flat((saved or {}).get(section) or {}, section), _flat(now.get(section) or {}, section)
        changes += [f"{key}: {before.get(key)} -> {after.get(key)}" for key in sorted({*before, *after})
                    if not _same(before.get(key), after.get(key))]
    return changes


def _flat(values: dict, prefix: str) -> dict[str, Any]:
    """A section's keys as dotted names ("distill.loss.name"), down to the values."""
    flat = {}
    for key, value in values.items():
        name = f"{prefix}.{key}"
        flat.update(_flat(value, name) if isinstance(value, dict) and value else {name: value})
    return flat


def _same(a: Any, b: Any) -> bool:
    if a == b:
        return True
    if isinstance(a, str) and isinstance(b, str) and Path(a).expanduser().exists():
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    return False


def read_results(output_dir: str | Path) -> dict | None:
    """train_results.json of a finished run; None when absent or torn (the export then runs again)."""
    path = Path(output_dir) / RESULTS_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(read_text(path))
    except FileProblem:  # not text at all: named, never taken for a torn write and replaced
        raise
    except ValueError:
        return None


def write_results(output_dir: str | Path, results: dict) -> None:
    """train_results.json, written last (its presence means the run is done): a temporary file, then a rename."""
    write_atomic(Path(output_dir) / RESULTS_FILE, json.dumps(results, indent=2) + "\n")
