"""Helpers shared by the trainer's tests (the tiny models themselves are in tiny.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from scripts import train as train_script

TINY_RECIPE = str(Path(__file__).resolve().parents[1] / "recipes" / "tiny_distill.yaml")


def run_train(workdir: Path, out: str, *overrides: str, target: str = "target") -> Path:
    """scripts/train.py main() on the tiny recipe with workdir's target and code.txt, in this process; returns the
    output folder."""
    output_dir = workdir / out
    train_script.main([TINY_RECIPE, f"model.target={workdir / target}", f"data.dataset={workdir / 'code.txt'}",
                       f"train.output_dir={output_dir}", *overrides])
    return output_dir


def cli_error(monkeypatch, capsys, *argv: str) -> str:
    """The one line specdistill-train prints for a user error (exit status 1, no traceback)."""
    monkeypatch.setattr(sys, "argv", ["specdistill-train", *argv])
    with pytest.raises(SystemExit) as exit_info:
        train_script.cli()
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]  # earlier lines: progress bars and logs
    assert last.startswith("specdistill-train: error: "), err
    return last
