"""Helpers shared by the trainer's tests (the tiny models themselves are in tiny.py)."""
from __future__ import annotations

import sys

import pytest

from scripts import train as train_script


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
