"""One rule picks the best (checkpoint, gamma): cost-model speedup from measured acceptance, never wall-clock noise."""
from __future__ import annotations

import json

import pytest

from distill.outputs.acceptance_log import best_checkpoint, cost_model_speedup
from distill.publish.model_card import best_gamma

from helpers import run_train
from tiny import TINY_TEXT, tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """target/ (tiny Llama + tokenizer) and code.txt."""
    root = tmp_path_factory.mktemp("choice")
    tiny_model("llama", vocab_size=320, hidden=32, layers=2).save_pretrained(root / "target")
    tiny_tokenizer(320).save_pretrained(root / "target")
    (root / "code.txt").write_text(TINY_TEXT * 3)
    return root


def row(step: int, gamma: int, tau: float, speedup: float, temperature: float = 0.0, c: float = 0.2,
        v: float = 1.1) -> dict:
    return {"step": step, "checkpoint": f"checkpoint-{step}", "gamma": gamma, "temperature": temperature,
            "mean_accepted_tokens": tau, "speedup": speedup, "draft_cost_ratio": c, "verify_cost_ratio": v}


def test_cost_model_speedup_is_tau_over_gamma_c_plus_v():
    assert cost_model_speedup(row(1, 4, 3.0, 9.9)) == pytest.approx(3.0 / (4 * 0.2 + 1.1))
    assert cost_model_speedup({"gamma": 4, "mean_accepted_tokens": 3.0}) is None


def test_best_is_ranked_by_cost_model_not_by_measured_speedup():
    rows = [row(10, 2, 2.2, speedup=1.9), row(10, 4, 2.9, speedup=1.2),   # noise made step 10 gamma 2 look fast
            row(20, 2, 2.4, speedup=1.1), row(20, 4, 3.3, speedup=1.3)]
    choice = best_checkpoint(rows)
    # 3.3 / (4 * 0.2 + 1.1) = 1.74 beats 2.4 / (2 * 0.2 + 1.1) = 1.60 and step 10's rows
    assert (choice.step, choice.checkpoint, choice.gamma, choice.temperature) == (20, "checkpoint-20", 4, 0.0)
    assert choice.cost_model_speedup == pytest.approx(3.3 / 1.9) and choice.row is rows[3]
    # a costly draft makes the short block win at the same acceptance
    costly = [dict(r, draft_cost_ratio=0.9) for r in rows]
    assert best_checkpoint(costly).gamma == 2
    assert best_gamma(rows) == 4 and best_gamma([]) is None


def test_temperature_ties_and_rows_without_costs():
    rows = [row(10, 4, 3.0, 1.0), row(20, 4, 3.0, 1.5), row(20, 4, 3.5, 2.0, temperature=1.0)]
    assert best_checkpoint(rows).step == 10  # equal tau and costs: the earlier checkpoint
    assert best_checkpoint(rows, temperature=1.0).step == 20
    assert best_checkpoint(rows, temperature=0.7) is None
    plain = [{"gamma": g, "temperature": 0.0, "mean_accepted_tokens": t} for g, t in ((1, 1.5), (2, 1.9), (4, 1.9))]
    choice = best_checkpoint(plain)  # an eval JSON without cost ratios: tau, then the smaller gamma
    assert (choice.gamma, choice.step, choice.checkpoint, choice.cost_model_speedup) == (2, None, None, None)


@pytest.mark.integration
def test_two_identical_runs_export_the_same_checkpoint_and_gamma(workdir, monkeypatch):
    """Selection depends on tau (deterministic, greedy) and on the run's cost ratios, measured once per run. The
    ratios are a timing of the hardware (on a loaded machine two runs can time two gammas in a different order), so
    here they are the same known numbers in both runs: then nothing else may make the exports differ."""
    import distill.run.callbacks
    from decode.loop.speedup import CostRatios

    calls = []

    def fixed_cost_ratios(target, draft, prompt, gamma, **kwargs):
        calls.append(gamma)
        return CostRatios(draft_cost_ratio=0.3, verify_cost_ratio=1.0 + 0.15 * gamma)

    monkeypatch.setattr(distill.run.callbacks, "measure_cost_ratios", fixed_cost_ratios)
    keys = ("train.max_steps=12", "train.save_steps=4", "eval.gammas=[1,2,4]", "eval.max_new_tokens=12")
    bests = []
    for name in ("first", "second"):
        calls.clear()
        out = run_train(workdir, name, *keys)
        assert sorted(calls) == [1, 2, 4]  # measured once per run (not at every checkpoint)
        bests.append(json.loads((out / "train_results.json").read_text())["best"])
        rows = [json.loads(line) for line in (out / "acceptance.jsonl").read_text().splitlines()]
        costs = {(r["gamma"], r["draft_cost_ratio"], r["verify_cost_ratio"]) for r in rows}
        assert len(costs) == 3  # one (c, v) per gamma, the same at every checkpoint
        choice = best_checkpoint(rows, 0.0)
        assert (bests[-1]["checkpoint"], bests[-1]["gamma"]) == (choice.checkpoint, choice.gamma)
    assert (bests[0]["checkpoint"], bests[0]["gamma"]) == (bests[1]["checkpoint"], bests[1]["gamma"])
