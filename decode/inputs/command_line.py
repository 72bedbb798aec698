"""What every command's parser shares: a usage error as one line (`OneLineArgumentParser`) and number flags that
are finite (`finite_float`)."""
from __future__ import annotations

import argparse
import math


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


class OneLineArgumentParser:
    """Mixin for argparse.ArgumentParser: a usage error is one line `PROG: error: ...` and exit status 1
    (argparse prints the usage block and exits 2), and `type=float` flags are read by `finite_float`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.register("type", float, finite_float)  # argparse looks a flag's type up in this registry first

    def error(self, message: str):  # noqa: D102 - argparse's hook
        import sys

        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(1)
