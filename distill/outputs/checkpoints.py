"""Checkpoints that are complete or absent, and what an output folder already holds.

transformers.Trainer writes checkpoint-N/ file by file; a process killed meanwhile used to leave a half-written
checkpoint-N that `train.resume_from_checkpoint=true` then picked. DistillTrainer now saves into
OUTPUT_DIR/.partial/checkpoint-N and renames it to OUTPUT_DIR/checkpoint-N once every process has written its
part (trainer_state.json, written last, marks a complete checkpoint). Resume picks the latest complete checkpoint,
reports incomplete ones (and a leftover .partial/) and never uses them. Every checkpoint gets a manifest of its
files' sha256 digests (decode.inputs.manifest), written last before the rename; resume verifies it
(`verified_latest`): a checkpoint whose bytes changed since (a flipped bit, a partial copy) is skipped with one
warning naming the file, and the previous complete one is used.

`crash_point(name)` is a test hook: with SPECDISTILL_KILL_AT=name (or name:K, the K-th time, 1-based) in the
environment the process SIGKILLs itself there, so tests can kill a run at an exact moment.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from decode.inputs.checks import FileProblem, read_text
from decode.inputs.manifest import manifest_problems
from distill.utils import KILL_ENV, crash_point  # noqa: F401  (KILL_ENV: for the tests that set it)

logger = logging.getLogger(__name__)

PARTIAL_DIR = ".partial"  # checkpoints being written; never a checkpoint-* name, so nothing picks or rotates it
TRAINER_STATE = "trainer_state.json"  # written last by Trainer._save_checkpoint
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_step(folder: str | Path) -> int | None:
    """N for a folder named checkpoint-N, else None."""
    match = CHECKPOINT_NAME.match(Path(folder).name)
    return int(match.group(1)) if match else None


def is_complete(folder: str | Path) -> bool:
    """Whether a checkpoint folder was written to the end (its trainer_state.json is there and readable).
    Raises FileProblem naming a trainer_state.json that is not text at all (no interrupted save writes that)."""
    try:
        json.loads(read_text(Path(folder) / TRAINER_STATE))
    except FileProblem:
        raise
    except (OSError, ValueError):
        return False
    return True


@dataclass
class Checkpoints:
    """The checkpoint folders of an output folder, oldest first."""

    complete: list[Path]
    incomplete: list[Path]  # checkpoint-N without (a readable) trainer_state.json, and a leftover .partial/

    @property
    def latest(self) -> Path | None:
        return self.complete[-1] if self.complete else None


def find_checkpoints(output_dir: str | Path) -> Checkpoints:
    """Complete and incomplete checkpoints in output_dir (none when it does not exist)."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return Checkpoints([], [])
    folders = sorted((p for p in output_dir.iterdir() if p.is_dir() and checkpoint_step(p) is not None),
                     key=checkpoint_step)
    complete = [p for p in folders if is_complete(p)]
    incomplete = [p for p in folders if p not in complete]
    partial = output_dir / PARTIAL_DIR
    if partial.is_dir() and any(partial.iterdir()):
        incomplete.append(partial)
    return Checkpoints(complete, incomplete)


def corruption(folder: str | Path) -> str | None:
    """Why a checkpoint's files are not what was written (its manifest's first problem and how many more), None
    when they are, or when it has no manifest (written before manifests)."""
    problems = manifest_problems(folder)
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{problems[0]}{more}"


def verified_latest(found: Checkpoints) -> Path | None:
    """The newest complete checkpoint whose files match its manifest; each newer one that does not is skipped with
    one warning naming the file."""
    for folder in reversed(found.complete):
        problem = corruption(folder)
        if problem is None:
            return folder
        logger.warning("skipping checkpoint %s: %s; never resumed from", folder, problem)
    return None


def report_incomplete(found: Checkpoints) -> None:
    """One warning per incomplete checkpoint: it is skipped (never resumed from, measured or exported)."""
    for folder in found.incomplete:
        logger.warning("skipping incomplete checkpoint %s (a save that was interrupted); it is never resumed from, "
                       "measured or exported", folder)


def finished_step(checkpoint: str | Path) -> int | None:
    """The step of a checkpoint that ends its run (global_step >= max_steps in its trainer_state.json), else None."""
    state = json.loads(read_text(Path(checkpoint) / TRAINER_STATE))
    step, max_steps = state.get("global_step", 0), state.get("max_steps", 0)
    return step if max_steps and step >= max_steps else None


def partial_folder(output_dir: str | Path) -> Path:
    """Where checkpoint-N is written before it is renamed into output_dir."""
    return Path(output_dir) / PARTIAL_DIR


def clear_partial(output_dir: str | Path) -> None:
    """Delete what an interrupted save left in OUTPUT_DIR/.partial (rank 0, before a save)."""
    shutil.rmtree(partial_folder(output_dir), ignore_errors=True)


def publish(output_dir: str | Path, name: str) -> Path:
    """Move OUTPUT_DIR/.partial/NAME to OUTPUT_DIR/NAME (one rename; an older folder of that name is replaced)."""
    source, final = partial_folder(output_dir) / name, Path(output_dir) / name
    crash_point("checkpoint-save")  # test hook: killed with the checkpoint written but not yet renamed
    if final.exists():  # a checkpoint of an abandoned part of an earlier run, or an incomplete one
        shutil.rmtree(final)
    os.replace(source, final)
    return final
