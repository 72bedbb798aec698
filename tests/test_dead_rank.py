"""Faults of one process among two. A dead rank: one of two processes is killed (-9) in the middle of training. The
other stops within seconds with one line naming the dead rank (exit 76; or the launcher's SIGTERM ends it first, its
summary naming the dead rank), not a traceback or a hang; the run resumed on two processes ends equal, bit for
bit, to one that was never interrupted. The kill lands at an exact step on one rank only:
SPECDISTILL_KILL_AT=train-step:K with SPECDISTILL_KILL_RANK=1. A full disk met by one rank while saving a checkpoint
(SPECDISTILL_FULL_DISK_AT=checkpoint-save:K, the same rank filter): that rank stops in one line, the other does not
hang, the complete checkpoints stay, resume ends bit for bit."""
from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_kill_resume import (
    RUN,
    STEPS,
    workdir,  # noqa: F401 - module fixture: the tiny pair
)

from distill.utils import FULL_DISK_ENV, KILL_ENV, RANK_ENV

from helpers import CHILD_ENV, ROOT, TINY_RECIPE, accelerate_command

pytestmark = pytest.mark.integration


def launch(workdir: Path, out: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The tiny run on 2 CPU processes (DDP over gloo), as the docs launch it."""
    command = accelerate_command(ROOT / "scripts" / "train.py", TINY_RECIPE, f"model.target={workdir / 'target'}",
                                 f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={workdir / out}", *RUN,
                                 *extra)
    return subprocess.run(command, env={**CHILD_ENV, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1",
                                        **(env or {})}, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def whole(workdir) -> Path:
    """The run on two processes, never interrupted."""
    done = launch(workdir, "dead_whole")
    assert done.returncode == 0, done.stderr[-3000:]
    return workdir / "dead_whole"


def assert_same_checkpoints(run: Path, reference: Path) -> None:
    for step in STEPS:
        ours, theirs = (load_file(folder / f"checkpoint-{step}" / "model.safetensors") for folder in (run, reference))
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs), step


def test_a_dead_rank_stops_the_other_in_one_line_and_resume_ends_bit_for_bit(workdir, whole):
    started = time.monotonic()
    killed = launch(workdir, "dead_killed", env={KILL_ENV: "train-step:6", RANK_ENV: "1"})
    elapsed = time.monotonic() - started
    assert killed.returncode != 0 and elapsed < 120, (elapsed, killed.stderr[-3000:])
    ours = [line for line in killed.stderr.splitlines() if line.startswith("specdistill-train: error:")]
    root_cause = killed.stderr.split("Root Cause", 1)[-1]
    assert "rank      : 1" in root_cause and "SIGKILL" in root_cause  # the launcher names the dead rank
    if ours:  # rank 0 saw the failed collective before the launcher's SIGTERM reached it
        assert ours == ["specdistill-train: error: rank 0 of 2: rank 1 stopped or stopped answering in a collective, "
                        "so this process stops too (RuntimeError); the complete checkpoints are intact: continue "
                        "with train.resume_from_checkpoint=true, on as many processes"], killed.stderr[-3000:]
    assert "distill/" not in killed.stderr  # no frame of ours: no traceback
    assert [p.name for p in (workdir / "dead_killed").glob("checkpoint-*")] == ["checkpoint-4"]
    resumed = launch(workdir, "dead_killed", "train.resume_from_checkpoint=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_checkpoints(workdir / "dead_killed", whole)


def test_a_full_disk_on_one_rank_stops_both_in_bounded_time_and_resume_ends_bit_for_bit(workdir, whole):
    """Rank 1 finds the disk full writing its part of checkpoint-8 (its RNG state): it stops with the one line of a
    full disk; rank 0, waiting for it to finish the save, stops too (one line naming rank 1, or the launcher's
    SIGTERM) instead of waiting forever; checkpoint-4 is whole, nothing of checkpoint-8 is published."""
    started = time.monotonic()
    full = launch(workdir, "full_one_rank", env={FULL_DISK_ENV: "checkpoint-save:2", RANK_ENV: "1"})
    elapsed = time.monotonic() - started
    assert full.returncode != 0 and elapsed < 120, (elapsed, full.stderr[-3000:])
    ours = [line for line in re.split(r"[\r\n]", full.stderr) if line.startswith("specdistill-train: error:")]
    disk = [line for line in ours if "no space left on the device of " in line]
    assert len(disk) == 1 and "checkpoint-4 is intact" in disk[0], full.stderr[-3000:]
    assert all("rank 0 of 2: rank 1 stopped" in line for line in ours if line not in disk), ours
    assert "distill/" not in full.stderr  # no frame of ours: no traceback
    out = workdir / "full_one_rank"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4"]
    resumed = launch(workdir, "full_one_rank", "train.resume_from_checkpoint=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_checkpoints(out, whole)
