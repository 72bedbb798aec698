"""What a command does first and last under `accelerate launch`: refuse a GPU launch on a machine without one, print
an error every process would print the same way once, and leave without the interpreter's teardown.

Light on purpose (os and torch only): scripts/train.py calls check_launch before importing the trainer, so the
8 processes of `accelerate launch --config_file recipes/accelerate/ddp.yaml ...` started on a CPU machine stop in
about a second each instead of loading transformers 8 times to say so.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator

# The launch that works on CPU processes (DDP over gloo): what the tests and docs/guides/scaling-out.md use.
CPU_LAUNCH = ("ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 --num_machines 1 "
              "--mixed_precision no --dynamo_backend no scripts/train.py RECIPE.yaml")
_TRUE = ("1", "true", "yes")


def launched_for_gpus() -> str | None:
    """The device mode (DDP, DeepSpeed, FSDP) when `accelerate launch` started several processes without being told
    to use the CPU (its config's use_cpu: false, no ACCELERATE_USE_CPU); None otherwise. accelerate's launcher sets
    ACCELERATE_MIXED_PRECISION for every multi-process mode; a plain torchrun does not."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2 or "ACCELERATE_MIXED_PRECISION" not in os.environ:
        return None
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() in _TRUE or os.environ.get("DS_ACCELERATOR") == "cpu":
        return None
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in _TRUE:
        return "DeepSpeed"
    return "FSDP" if os.environ.get("ACCELERATE_USE_FSDP", "").lower() in _TRUE else "DDP"


def check_launch(prog: str) -> None:
    """Exit 1 with one line when several processes were launched for GPUs and none is visible: accelerate would
    otherwise run them all on the CPU (DDP over gloo, 8 processes on a laptop) or fail deep inside DeepSpeed."""
    mode = launched_for_gpus()
    if mode is None:
        return
    import torch

    if torch.accelerator.is_available():
        return
    world = os.environ["WORLD_SIZE"]
    print_once(f"{prog}: error: accelerate launched {world} processes for GPUs ({mode}: the accelerate config says "
               f"use_cpu: false) and this machine has no GPU; try a recipe on CPU processes (DDP over gloo) with: "
               f"{CPU_LAUNCH}")
    raise SystemExit(1)


def print_once(line: str) -> None:
    """Print `line` to stderr on a line of its own, once per machine when several processes of one launch print the
    same line (the launcher is their common parent); any other line, or a single process, is printed as it is.

    A progress bar of this process is closed first (it ends its line); under several processes the line starts with
    a newline, as another process's bar may hold the shared terminal line."""
    _close_progress_bars()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    if local < 2:
        print(line, file=sys.stderr)
        return
    launcher = os.getppid()
    try:  # the launcher's start time too: a later launcher may get the same pid
        launcher_id = f"{launcher}-{os.stat(f'/proc/{launcher}').st_mtime_ns}"
    except OSError:
        launcher_id = str(launcher)
    key = hashlib.sha256(f"{launcher_id}\x00{line}".encode()).hexdigest()[:20]
    marker = os.path.join(tempfile.gettempdir(), f"specdistill-said-{key}")
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return  # another process of this launch said it
    except OSError:
        pass  # no temporary folder to coordinate through: say it
    print("\n" + line, file=sys.stderr)


def _close_progress_bars() -> None:
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", None) or ()):
        try:
            bar.close()
        except Exception:  # noqa: BLE001 - a bar that cannot close must not hide the error line
            pass


@contextlib.contextmanager
def leave_launch_directly(statuses: tuple[int, ...] = (0,)) -> Iterator[None]:
    """In one of several processes of a launch (WORLD_SIZE >= 2): when the body ends (status 0) or exits with one of
    `statuses` (SystemExit), flush what was printed and logged and end the process there with that status, without
    the interpreter's teardown. Any other status or exception ends as usual (a traceback stays a traceback; an
    error's process is not hurried out ahead of the launcher seeing which process failed first), and so does a
    single process.

    Why: a gloo process group's worker threads may still drop the last reference to a tensor after the process
    group is destroyed; when that happens while Python is finalizing, the thread cannot take the GIL and the process
    aborts ("terminate called without an active exception", SIGABRT: pytorch/pytorch#190489) after every file of
    the run was written, so the launcher reports a failed run. Leaving before the teardown has nothing left to
    lose: the command's outputs are closed files by then (the trainer meets every process at a barrier, closes
    TensorBoard and destroys the process group first)."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        yield
        return
    try:
        yield
    except SystemExit as stop:
        if stop.code not in statuses and not (stop.code is None and 0 in statuses):
            raise
        status = stop.code or 0
    else:
        status = 0
    _close_progress_bars()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)
