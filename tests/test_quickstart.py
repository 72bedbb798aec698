"""The quickstart's wiring without its training: each step's command, --fast, and reuse of what a run left."""
from __future__ import annotations

import sys

import pytest

from scripts import quickstart


@pytest.fixture
def commands(monkeypatch) -> list[list[str]]:
    """The commands quickstart.train would run (nothing is run)."""
    ran: list[list[str]] = []
    monkeypatch.setattr(quickstart.subprocess, "run", lambda cmd, **kwargs: ran.append(cmd))
    return ran


def test_train_runs_the_recipe_with_fast_overrides_last(commands, tmp_path):
    overrides = ["model.target=T", "data.dataset=D"]
    quickstart.train("draft_kd.yaml", tmp_path / "draft_kd", overrides, fast=True)
    quickstart.train("draft_kd.yaml", tmp_path / "draft_kd", overrides, fast=False)
    fast, full = commands
    recipe = quickstart.ROOT / "recipes" / "quickstart" / "draft_kd.yaml"
    head = [sys.executable, str(quickstart.ROOT / "scripts" / "train.py"), str(recipe),
            f"train.output_dir={tmp_path / 'draft_kd'}", *overrides]
    assert full == head
    assert fast == head + quickstart.FAST_TRAIN  # later overrides win, so --fast's sizes are the ones used
    assert overrides == ["model.target=T", "data.dataset=D"]  # the caller's list is left alone


def test_train_and_evaluate_reuse_what_a_previous_run_left(commands, tmp_path, capsys):
    (tmp_path / "draft_ce").mkdir()
    (tmp_path / "draft_ce" / "train_results.json").write_text("{}")
    quickstart.train("draft_ce.yaml", tmp_path / "draft_ce", [], fast=False)
    assert commands == []
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "prompt_lookup.json").write_text("{}")
    result = quickstart.evaluate(tmp_path, "prompt-lookup", "prompt_lookup", tmp_path / "prompts.jsonl", fast=False)
    assert result == tmp_path / "eval" / "prompt_lookup.json"
    assert capsys.readouterr().out.splitlines() == [f"reusing {tmp_path / 'draft_ce'}", f"reusing {result}"]


def test_help_names_the_two_options(capsys):
    with pytest.raises(SystemExit) as exit_:
        quickstart.parse_args(["--help"])
    assert exit_.value.code == 0
    assert "--fast" in capsys.readouterr().out
    args = quickstart.parse_args(["--fast", "--out", "x"])
    assert args.fast and str(args.out) == "x"
    assert quickstart.parse_args([]).out == quickstart.ROOT / "quickstart_out" and not quickstart.parse_args([]).fast
