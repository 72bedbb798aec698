"""Small things several modules share: the ignored-label id, eval mode for a while, parameter counts (of a model
in memory and of a saved folder), and the error for a target and draft that cannot be set up together."""
from __future__ import annotations

import contextlib
import math
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from torch import nn

from decode.inputs.checks import safetensors_header

# labels equal to this id are not trained on (transformers' and torch's cross-entropy convention)
IGNORE_INDEX = -100


class ModelSetupError(ValueError):
    """Target and draft cannot be used together (bad layer list, unknown config key, too small a vocabulary)."""


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


# test hook: SPECDISTILL_KILL_AT=name[:K] SIGKILLs the process the K-th time it reaches crash_point(name);
# SPECDISTILL_KILL_SIGNAL=TERM (INT, USR1, ...) sends that signal instead (a preemption at an exact moment)
KILL_ENV = "SPECDISTILL_KILL_AT"
SIGNAL_ENV = "SPECDISTILL_KILL_SIGNAL"
_crash_counts: dict[str, int] = {}


def crash_point(name: str) -> None:
    """SIGKILL this process here when SPECDISTILL_KILL_AT names this point (test hook; a no-op otherwise); another
    signal with SPECDISTILL_KILL_SIGNAL."""
    wanted = os.environ.get(KILL_ENV)
    if not wanted:
        return
    point, _, nth = wanted.partition(":")
    if point != name:
        return
    _crash_counts[name] = _crash_counts.get(name, 0) + 1
    if _crash_counts[name] == int(nth or 1):
        os.kill(os.getpid(), signal.Signals["SIG" + os.environ.get(SIGNAL_ENV, "KILL")])
