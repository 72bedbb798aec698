"""Small things several modules share: the ignored-label id, eval mode for a while, parameter counts (of a model
in memory and of a saved folder), and the error for a target and draft that cannot be set up together."""
from __future__ import annotations

import contextlib
import errno
import math
import os
import shutil
import signal
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

from torch import nn

from decode.inputs.checks import safetensors_header

# labels equal to this id are not trained on (transformers' and torch's cross-entropy convention)
IGNORE_INDEX = -100


class ModelSetupError(ValueError):
    """Target and draft cannot be used together (bad layer list, unknown config key, too small a vocabulary)."""


class OutOfSpaceError(OSError):
    """A write found the disk full (ENOSPC, EDQUOT): one line naming the path, the free space and what was kept."""

    def __str__(self) -> str:
        return self.strerror or ""


SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def out_of_space(err: BaseException) -> bool:
    """Whether `err` is a write that found the disk (or the quota) full."""
    return isinstance(err, OSError) and err.errno in SPACE_ERRNOS


def free_bytes(path: str | Path) -> int:
    """Free bytes on the device holding `path` (or its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def no_space(path: str | Path, what: str, kept: str, needed: int | None = None) -> OutOfSpaceError:
    """The one-line error of a write of `what` into `path` that found the disk full: the free space there, about how
    much the write needs (when known), and `kept` (what is intact and how to go on)."""
    need = f", about {human_bytes(needed)} needed" if needed else ""
    return OutOfSpaceError(errno.ENOSPC, f"no space left on the device of {path} while writing {what} "
                           f"({human_bytes(free_bytes(path))} free{need}); {kept}")


def human_bytes(size: int) -> str:
    """A size as people read it: 512 B, 96 KiB, 312 MiB, 1.2 GiB."""
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if size >= scale:
            value = size / scale
            return f"{value:,.1f} {unit}" if value < 10 else f"{value:,.0f} {unit}"
    return f"{size} B"


def folder_bytes(folder: str | Path) -> int:
    """The bytes of every file under `folder` (0 when it does not exist; a file deleted meanwhile counts 0)."""
    total = 0
    for f in Path(folder).rglob("*"):
        with contextlib.suppress(OSError):
            total += f.stat().st_size if f.is_file() else 0
    return total


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """`model` in eval mode inside the block; its previous train/eval mode is restored after (also on error)."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def parameter_count(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters of `model` (only those that require gradients with trainable_only)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def saved_parameter_count(folder: Path) -> int:
    """Number of parameters stored in the *.safetensors files of `folder`, read from their headers (no weights are
    loaded): the counter for a saved model folder, as parameter_count is for a model in memory."""
    return sum(math.prod(tensor["shape"]) for path in sorted(Path(folder).glob("*.safetensors"))
               for tensor in safetensors_header(path).tensors.values())


def plain_class(module: nn.Module) -> type:
    """The class `module` had before fully_shard (which swaps in a subclass FSDP<name>)."""
    from torch.distributed.fsdp import FSDPModule

    cls = type(module)
    return cls.__mro__[2] if issubclass(cls, FSDPModule) and cls.__mro__[1] is FSDPModule else cls


# The signals that stop a run or a cache build cleanly: a scheduler's preemption, Ctrl-C, SLURM's --signal and the
# terminal closing (a dropped SSH session); handled as stop_signals() says
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)
PREEMPTED_EXIT = 75  # EX_TEMPFAIL: "try again later"; schedulers' requeue hooks can key on it
INTERRUPTED_TWICE_EXIT = 130


def stop_signals() -> tuple[int, ...]:
    """The STOP_SIGNALS this process handles: all of them, but SIGHUP where it is ignored (nohup ignores it, and so
    may a parent that wants its child to outlive the terminal): such a process goes on when its terminal closes, as
    nohup promises."""
    return tuple(sig for sig in STOP_SIGNALS if sig != signal.SIGHUP or signal.getsignal(sig) is not signal.SIG_IGN)


class TerminalStream:
    """sys.stdout or sys.stderr while it is a terminal: a write the terminal refuses because it hung up (EIO; a
    dropped SSH session often stalls output first, so a write may be waiting when the terminal goes, and fails
    before SIGHUP's handler runs) sends the stream to /dev/null (leave_a_closed_terminal) instead of ending the
    process; any other error is raised. Everything else is the stream's own."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as err:
            if err.errno != errno.EIO:
                raise
            leave_a_closed_terminal(signal.SIGHUP)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as err:
            if err.errno != errno.EIO:
                raise
            leave_a_closed_terminal(signal.SIGHUP)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def outlive_the_terminal() -> None:
    """sys.stdout and sys.stderr, where they are a terminal, as TerminalStreams (once; the logging handlers and
    progress bars made after write through them)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, TerminalStream) and stream.isatty():
            setattr(sys, name, TerminalStream(stream))


def leave_a_closed_terminal(signum: int) -> None:
    """On SIGHUP: the terminal is gone and every write to it fails (EIO), so the progress bar's next line, a log
    line or the closing one would end the process before it saves. stdout and stderr that are a terminal (a
    character device) write to /dev/null from here on; files and pipes stay as they are (a run started with
    `> log 2>&1` goes on logging there). Nothing for other signals."""
    if signum != signal.SIGHUP:
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                if stat.S_ISCHR(os.fstat(fd).st_mode):
                    os.dup2(null, fd)
    finally:
        os.close(null)


# test hook: SPECDISTILL_KILL_AT=name[:K] SIGKILLs the process the K-th time it reaches crash_point(name);
# SPECDISTILL_KILL_SIGNAL=TERM (INT, USR1, ...) sends that signal instead (a preemption at an exact moment)
KILL_ENV = "SPECDISTILL_KILL_AT"
SIGNAL_ENV = "SPECDISTILL_KILL_SIGNAL"
# the kill and full-disk hooks act in the process of this RANK only; unset: every one
RANK_ENV = "SPECDISTILL_KILL_RANK"
_crash_counts: dict[str, int] = {}


FULL_DISK_ENV = "SPECDISTILL_FULL_DISK_AT"  # test hook: name[:K] -> the K-th write at fault_point(name) finds ENOSPC


def fault_point(name: str) -> None:
    """Raise OSError(ENOSPC) here when SPECDISTILL_FULL_DISK_AT names this point (test hook; a no-op otherwise): a
    full disk at an exact write, in a process the test cannot patch."""
    wanted = os.environ.get(FULL_DISK_ENV)
    if not wanted:
        return
    point, _, nth = wanted.partition(":")
    if point != name or not _this_rank_is_chosen():
        return
    _crash_counts["full-disk:" + name] = _crash_counts.get("full-disk:" + name, 0) + 1
    if _crash_counts["full-disk:" + name] == int(nth or 1):
        raise OSError(errno.ENOSPC, "No space left on device (SPECDISTILL_FULL_DISK_AT)")


def _this_rank_is_chosen() -> bool:
    """SPECDISTILL_KILL_RANK unset, or naming this process's RANK (the test hooks' rank filter)."""
    return os.environ.get(RANK_ENV, os.environ.get("RANK", "0")) == os.environ.get("RANK", "0")


def crash_point(name: str) -> None:
    """SIGKILL this process here when SPECDISTILL_KILL_AT names this point (test hook; a no-op otherwise); another
    signal with SPECDISTILL_KILL_SIGNAL."""
    wanted = os.environ.get(KILL_ENV)
    if not wanted:
        return
    point, _, nth = wanted.partition(":")
    if point != name or not _this_rank_is_chosen():
        return
    _crash_counts[name] = _crash_counts.get(name, 0) + 1
    if _crash_counts[name] == int(nth or 1):
        os.kill(os.getpid(), signal.Signals["SIG" + os.environ.get(SIGNAL_ENV, "KILL")])
