"""What every command's parser shares: a usage error as one line (`OneLineArgumentParser`), number flags that are
finite (`finite_float`), a `~` the shell left in a path expanded (`home_expanded`), Ctrl-C as one line
(`interrupted_in_one_line`) and the choices the flags offer. The choices live here, in a module that imports no
torch, so that a command's parser, its `--help` and its usage errors answer before any model code loads; the modules
that act on them import them from here."""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path

CHAT_TEMPLATE_MODES = ("auto", "on", "off")  # --chat-template: auto = conversations only (decode.inputs.prompts)
# --cpu-linear (decode.loop.packed_linear): packed then tuned per row count, packed at every row count, or as loaded
CPU_LINEAR_MODES = ("auto", "packed", "plain")
PARITY_TOLERANCE = 0.05  # --parity-tolerance: |tau(vLLM) / tau(ours) - 1| allowed (decode.serving.parity)
# vLLM's draft_sample_method: "greedy" (its default) drafts argmax tokens and accepts d with probability p(d) (q taken
# as one-hot); "probabilistic" samples d ~ q and accepts with min(1, p(d) / q(d)), as our decoder does. Same at T=0.
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")
# vLLM's dtype for the target and the draft (LLM(dtype=...)): float32 by default, so CPU results match our float32 run;
# "auto" becomes one of these by the one dtype rule (decode.serving.vllm_engine.resolve_vllm_dtype): bfloat16 on CUDA,
# else float32
VLLM_DTYPES = ("float32", "bfloat16", "float16")
VLLM_DTYPE_CHOICES = ("auto", *VLLM_DTYPES)  # what --vllm-dtype and eval.vllm_dtype take
REQUEST_TIMEOUT_S = 600.0  # a request whose answer stalls this long fails (the greedy check's; GuideLLM's load's)


def finite_float(text: str) -> float:
    """argparse type of every number flag (OneLineArgumentParser uses it for type=float): NaN and infinities are
    refused, since no flag of ours means anything with them."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def home_expanded(text: str) -> str:
    """A path whose `~` the shell left as it was (`--target=~/models/x`, `model.target=~/models/x`, a quoted
    '~/x', a recipe's YAML) with the home folder in its place, as the shell writes `~/x`; any other text unchanged
    (only `~` and `~/...` are taken for the home folder)."""
    return os.path.expanduser(text) if text == "~" or text.startswith("~/") else text


class OneLineArgumentParser:
    """Mixin for argparse.ArgumentParser: a usage error is one line `PROG: error: ...` and exit status 1
    (argparse prints the usage block and exits 2), `type=float` flags are read by `finite_float`, and string and
    `type=Path` flags by `home_expanded`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.register("type", float, finite_float)  # argparse looks a flag's type up in this registry first
        self.register("type", None, home_expanded)  # a flag without a type: its string
        self.register("type", Path, lambda text: Path(home_expanded(text)))

    def error(self, message: str):  # noqa: D102 - argparse's hook
        import sys

        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(1)


INTERRUPTED_EXIT = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped


@contextlib.contextmanager
def interrupted_in_one_line(prog: str, what_is_left: str) -> Iterator[None]:
    """Ctrl-C (KeyboardInterrupt) inside the block: one line, `PROG: interrupted; WHAT_IS_LEFT`, and exit 130, not
    a traceback from wherever the command was (a forward pass, an upload). The training and data commands stop at a
    step or shard boundary instead (distill.run.preemption)."""
    try:
        yield
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; {what_is_left}", file=sys.stderr)
        sys.exit(INTERRUPTED_EXIT)
