"""The quickstart's wiring without its training: each step's command, --fast, --seeds, reuse of what a run left,
and the mean / spread over seeds with the headline margin (distill.publish.seed_spread)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from distill.publish.seed_spread import seed_rows, tau_margin
from scripts import quickstart_tiny as quickstart


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
    measured = {"results": [{"num_prompts": quickstart.NUM_PROMPTS}]}  # on the prompts this run uses
    (tmp_path / "eval" / "prompt_lookup.json").write_text(json.dumps(measured))
    result = quickstart.evaluate(tmp_path, "prompt-lookup", "prompt_lookup", tmp_path / "prompts.jsonl", fast=False)
    assert result == tmp_path / "eval" / "prompt_lookup.json"
    assert capsys.readouterr().out.splitlines() == [f"reusing {tmp_path / 'draft_ce'}", f"reusing {result}"]


def test_help_names_the_options_and_seeds_default_to_two(capsys):
    with pytest.raises(SystemExit) as exit_:
        quickstart.parse_args(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--fast" in out and "--seeds" in out
    args = quickstart.parse_args(["--fast", "--out", "x"])
    assert args.fast and str(args.out) == "x" and args.seeds == [42]  # --fast: one seed unless given
    default = quickstart.parse_args([])
    assert default.out == quickstart.ROOT / "quickstart_tiny_out" and not default.fast and default.seeds == [42, 43]
    assert quickstart.parse_args(["--fast", "--seeds", "42", "7", "9"]).seeds == [42, 7, 9]
    with pytest.raises(SystemExit):
        quickstart.parse_args(["--seeds", "43", "43"])
    assert "--seeds must differ from each other, got 43 43" in capsys.readouterr().err


def test_run_names_keep_the_recipe_seed_in_the_old_folder():
    assert quickstart.run_name("draft_kd", 42) == "draft_kd"  # what a single-seed run left is reused
    assert quickstart.run_name("draft_kd", 43) == "draft_kd@seed43"


def test_an_eval_on_other_prompts_is_measured_again(tmp_path, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr("specdistill.cli.eval.main", lambda argv: ran.append(argv))
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "draft_ce.json").write_text(json.dumps({"results": [{"num_prompts": 16}]}))
    quickstart.evaluate(tmp_path, str(tmp_path / "draft_ce"), "draft_ce", tmp_path / "p.jsonl", fast=False)
    assert ran and ran[0][ran[0].index("--num-prompts") + 1] == str(quickstart.NUM_PROMPTS)
    assert capsys.readouterr().out == (f"re-evaluating {tmp_path / 'eval' / 'draft_ce.json'}: it was measured on 16 "
                                       f"prompts, this run uses {quickstart.NUM_PROMPTS}\n")


# ---- mean and spread over seeds ---------------------------------------------------------------------------------

def result(gamma: int, tau: float, speedup: float) -> dict:
    return {"gamma": gamma, "temperature": 0.0, "num_prompts": 4, "acceptance_rate": (tau - 1) / gamma,
            "mean_accepted_tokens": tau, "speedup": speedup, "predicted_speedup": speedup + 0.1,
            "per_position_acceptance": [tau / 5, tau / 10]}


def test_two_seeds_give_mean_and_spread_per_setting():
    rows = seed_rows({"draft_kd": {42: [result(2, 2.0, 0.8), result(4, 2.4, 0.7)],
                                   43: [result(2, 2.2, 0.9), result(4, 2.8, 0.9)]}})
    assert [(r["drafter"], r["gamma"], r["seeds"]) for r in rows] == [("draft_kd", 2, 2), ("draft_kd", 4, 2)]
    four = rows[1]
    assert four["mean_accepted_tokens"] == pytest.approx(2.6)  # (2.4 + 2.8) / 2
    assert four["mean_accepted_tokens_spread"] == pytest.approx(0.4)  # 2.8 - 2.4
    assert four["mean_accepted_tokens_range"] == pytest.approx((2.4, 2.8))
    assert four["speedup"] == pytest.approx(0.8) and four["speedup_spread"] == pytest.approx(0.2)
    assert four["acceptance_rate"] == pytest.approx((0.35 + 0.45) / 2)
    assert four["per_position_acceptance"] == pytest.approx([0.52, 0.26])  # mean position by position


def test_margin_line_says_whether_the_margin_beats_the_spread():
    ce = {42: [result(4, 2.0, 0.7)], 43: [result(4, 2.3, 0.7)]}  # spread 0.3
    clear = seed_rows({"draft_kd": {42: [result(4, 2.7, 0.8)], 43: [result(4, 2.8, 0.8)]}, "draft_ce": ce})
    margin = tau_margin(clear, "draft_kd", "draft_ce", gamma=4)
    assert margin.margin == pytest.approx(0.6) and margin.spread == pytest.approx(0.3) and margin.exceeds
    assert margin.sentence() == (
        "draft_kd vs draft_ce, mean_accepted_tokens at gamma 4, temperature 0, mean of 2 seed(s): 2.75 vs 2.15, "
        "margin +0.60 (1.28x); seed spread (max - min, the larger of the two) 0.30: the margin is larger than the "
        "spread, so it holds.")
    close = seed_rows({"draft_kd": {42: [result(4, 2.2, 0.8)], 43: [result(4, 2.6, 0.8)]}, "draft_ce": ce})
    margin = tau_margin(close, "draft_kd", "draft_ce", gamma=4)
    assert margin.spread == pytest.approx(0.4) and not margin.exceeds  # margin 0.25 < 0.4: the kd spread counts
    assert "is NOT larger than the spread, so no difference is claimed" in margin.sentence()
    one = tau_margin(seed_rows({"a": {42: [result(4, 3.0, 1)]}, "b": {42: [result(4, 2.0, 1)]}}), "a", "b", 4)
    assert not one.exceeds and "one seed only" in one.sentence()
    with pytest.raises(ValueError, match="no mean_accepted_tokens for a at gamma 2"):
        tau_margin(seed_rows({"a": {42: [result(4, 3.0, 1)]}}), "a", "b", 2)


def test_two_seed_run_end_to_end_without_training(tmp_path, monkeypatch, capsys):
    """main() with --seeds 42 43: each drafter trained and evaluated at both seeds into its own folder, and the
    report and terminal show the mean, spread and headline (training and eval replaced by files they would write)."""
    class Corpus:
        train, eval_prompts = tmp_path / "train.jsonl", tmp_path / "prompts.jsonl"

    taus = {"draft_ce": 2.0, "draft_kd": 2.6, "head": 3.0, "prompt_lookup": 1.9}
    trained, evaluated = [], []

    def fake_train(recipe: str, output_dir: Path, overrides: list[str], fast: bool) -> None:
        trained.append((output_dir.name, overrides[-1]))
        output_dir.mkdir(parents=True)
        (output_dir / "acceptance.jsonl").write_text(json.dumps({"step": 8, **result(4, 2.0, 0.5)}) + "\n")

    def fake_evaluate(out: Path, drafter: str, name: str, prompts: Path, fast: bool) -> Path:
        evaluated.append(name)
        bump = 0.1 if "@seed43" in name else 0.0
        path = out / "eval" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tau = taus[name.split("@")[0]] + bump
        path.write_text(json.dumps({"draft": drafter, "results": [result(g, tau, 0.8) for g in (1, 4)]}))
        return path

    monkeypatch.setattr(quickstart, "corpus_and_tokenizer", lambda out: (Corpus, None))
    monkeypatch.setattr(quickstart, "pretrain_target", lambda *args: None)
    monkeypatch.setattr(quickstart, "train", fake_train)
    monkeypatch.setattr(quickstart, "evaluate", fake_evaluate)
    quickstart.main(["--fast", "--seeds", "42", "43", "--out", str(tmp_path / "out")])
    assert trained == [(name, "train.seed=42") for name in quickstart.DRAFTS] + \
        [(f"{name}@seed43", "train.seed=43") for name in quickstart.DRAFTS]
    assert evaluated == [f"{n}{s}" for n in quickstart.DRAFTS for s in ("", "@seed43")] + ["prompt_lookup"]
    headline = ("draft_kd vs draft_ce, mean_accepted_tokens at gamma 4, temperature 0, mean of 2 seed(s): 2.65 vs "
                "2.05, margin +0.60 (1.29x); seed spread (max - min, the larger of the two) 0.10: the margin is "
                "larger than the spread, so it holds.")
    assert headline in capsys.readouterr().out
    report = (tmp_path / "out" / "report" / "report.md").read_text()
    assert headline in report
    lines = [line.split() for line in report.splitlines()]
    # drafter, seeds, gamma, temperature, acceptance_rate, spread, tau, spread, speedup, spread, predicted
    assert ["draft_kd", "2", "4", "0", "0.413", "0.025", "2.65", "0.10", "0.80x", "0.00", "0.90x"] in lines
    assert ["prompt_lookup", "1", "4", "0", "0.225", "0.000", "1.90", "0.00", "0.80x", "0.00", "0.90x"] in lines
    assert ["draft_kd", "seed", "43", "4", "0", "0.425", "2.70", "0.80x", "0.90x"] in lines  # each seed too
    assert (tmp_path / "out" / "report" / "acceptance_vs_step.png").is_file()
