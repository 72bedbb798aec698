"""scripts/bench_distill.py: every row is a valid recipe that differs from the ce row only in its objective; when a
target counts as trained; seeds merged into a mean and a spread; and (integration) a smoke run end to end."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from scripts.bench_distill_rows import (
    PAIRS,
    ROWS,
    SEEDS,
    Sizes,
    draft_overrides,
    format_pair_table,
    over_seeds,
    row_key,
    target_converged,
    target_overrides,
    top_rows,
    winners,
)
from specdistill.recipes import load_recipe

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "quickstart" / "draft_kd.yaml"


@pytest.mark.parametrize("pair", list(PAIRS))
def test_rows_share_data_steps_and_optimiser(pair, tmp_path):
    sizes = Sizes()
    recipes = {row: load_recipe(RECIPE, draft_overrides(PAIRS[pair], row, tmp_path / "target", tmp_path / "d.jsonl",
                                                        tmp_path, sizes)) for row in ROWS}
    base = recipes["ce"]
    for row, recipe in recipes.items():
        same_model = recipe.model.draft_kind == "eagle3" if row.startswith("head_") else recipe.model == base.model
        assert recipe.train == base.train and same_model and recipe.eval == base.eval, row
        assert recipe.data.dataset == base.data.dataset and recipe.data.max_length == sizes.max_length
    assert base.train.max_steps == sizes.draft_steps and base.data.num_eval_prompts == 0
    assert {r: recipes[r].distill.loss for r in ("ce", "reverse_kl", "jsd", "tv", "nla", "lk_hybrid", "seq_kd")} == \
        {"ce": "ce", "reverse_kl": "reverse_kl", "jsd": "jsd", "tv": "tv", "nla": "nla", "lk_hybrid": "lk_hybrid",
         "seq_kd": "ce"}
    assert recipes["ce_to_tv"].distill.loss_at(0, 10) == {"ce": 1.0, "tv": 0.0}
    assert recipes["ce_to_tv"].distill.loss_at(10, 10) == {"ce": 0.0, "tv": 1.0}
    assert recipes["jsd"].distill.beta == 0.5
    assert recipes["forward_kl+on_policy0.5"].distill.on_policy_fraction == 0.5
    assert recipes["seq_kd"].data.target_weight == 1 and recipes["forward_kl_top32"].distill.teacher_topk == 32
    assert (base.model.draft_layers == [0, 7]) == (pair == "deep")


def test_tables_and_winners():
    row = {"tf_acceptance": 0.5, "greedy_agreement": 0.4, "speedup_greedy": 1.0, "speedup_sampled": 1.0}
    results = {"a": {"ce": {**row, "tau_greedy": 1.5, "tau_sampled": 2.0},
                     "jsd": {**row, "tau_greedy": 2.4, "tau_sampled": 2.2}},
               "b": {"ce": {**row, "tau_greedy": 1.0, "tau_sampled": 1.0},
                     "jsd": {**row, "tau_greedy": 1.5, "tau_sampled": 1.2}}}
    table = format_pair_table(results["a"])
    assert "| `jsd` | 1 | 0.500 | 0.400 | 2.40 | 1.60x | 2.20 | 1.10x |" in table
    lines = winners(results)
    assert any("greedy (gamma 4), standalone: **`jsd`**, mean_accepted_tokens 1.60x, 1.50x" in line for line in lines)
    # a head row is ranked among heads only: the standalone winner stays jsd
    results["a"]["head_tv"] = {**row, "tau_greedy": 3.0, "tau_sampled": 3.0, "tf_acceptance": None,
                               "greedy_agreement": None}
    lines = winners(results)
    assert any("greedy (gamma 4), standalone: **`jsd`**" in line for line in lines)
    assert any("greedy (gamma 4), head: **`head_tv`**, mean_accepted_tokens 2.00x" in line for line in lines)
    assert "| `head_tv` | 1 | - | - | 3.00 | 2.00x |" in format_pair_table(results["a"])
    assert top_rows(results["a"], 2) == ["jsd"]
    assert asdict(Sizes())["draft_steps"] > 0


def test_the_issue_rows_are_all_there():
    assert set(ROWS) >= {"ce", "forward_kl", "reverse_kl", "jsd", "tv", "nla", "lk_hybrid", "ce_to_tv",
                         "forward_kl+on_policy0.5", "seq_kd", "forward_kl_top32", "head_forward_kl", "head_tv"}
    sizes = Sizes()
    assert sizes.num_prompts >= 40 and sizes.max_new_tokens >= 64


def test_a_second_seed_changes_only_the_seed(tmp_path):
    pair, sizes = PAIRS["quickstart"], Sizes()
    first = load_recipe(RECIPE, draft_overrides(pair, "nla", tmp_path / "t", tmp_path / "d.jsonl", tmp_path, sizes))
    second = load_recipe(RECIPE, draft_overrides(pair, "nla", tmp_path / "t", tmp_path / "d.jsonl", tmp_path, sizes,
                                                 seed=SEEDS[1]))
    assert first.train.seed == SEEDS[0] and second.train.seed == SEEDS[1]
    assert (first.model, first.data, first.distill) == (second.model, second.data, second.distill)
    assert row_key("nla", SEEDS[0]) == "nla" and row_key("nla", SEEDS[1]) == f"nla@seed{SEEDS[1]}"


def test_target_rounds_continue_from_the_previous_round(tmp_path):
    target_recipe = RECIPE.parent / "target.yaml"
    sizes = Sizes()
    first = load_recipe(target_recipe, target_overrides(tmp_path / "seed", tmp_path / "t.jsonl", sizes, 1))
    third = load_recipe(target_recipe, target_overrides(tmp_path / "round2", tmp_path / "t.jsonl", sizes, 3))
    assert first.model.draft_config == {} and first.model.draft is None
    assert third.model.draft == str(tmp_path / "round2") and third.model.draft_config is None
    assert third.train.learning_rate == pytest.approx(sizes.learning_rate * sizes.target_lr_decay ** 2)
    assert first.train.max_steps == third.train.max_steps == sizes.target_steps
    assert first.train.seed != third.train.seed  # each round sees other rows first


@pytest.mark.parametrize("history, converged", [
    ([], False),
    ([(100, 6.0)], False),                                     # nothing 80% back to compare with
    ([(100, 6.0), (200, 5.0)], False),                         # 17% better
    ([(100, 6.0), (200, 5.0), (300, 4.96), (400, 4.95)], True),  # 4.96 (step 300 <= 320) -> 4.95: 0.2%
    ([(100, 6.0), (200, 5.0), (300, 4.96), (400, 4.90)], False),  # 1.2%
    ([(100, 5.0), (500, 4.96)], True),                        # 0.8% over far more than the last fifth
])
def test_a_target_is_trained_when_held_out_ce_improves_less_than_1_percent_over_the_last_fifth(history, converged):
    assert target_converged(history) is converged


def test_seeds_give_a_mean_and_a_spread_and_the_top_rows_are_picked_by_both_modes():
    base = {"tf_acceptance": 0.5, "greedy_agreement": 0.4, "speedup_greedy": 1.0, "speedup_sampled": 1.0}
    runs = [{**base, "tau_greedy": 2.0, "tau_sampled": 3.0}, {**base, "tau_greedy": 2.2, "tau_sampled": 2.9}]
    merged = over_seeds(runs)
    assert merged["tau_greedy"] == pytest.approx(2.1) and merged["spread_tau_greedy"] == pytest.approx(0.2)
    assert merged["spread_tau_sampled"] == pytest.approx(0.1) and merged["seeds"] == 2
    assert over_seeds(runs[:1])["spread_tau_greedy"] is None
    table = format_pair_table({"ce": over_seeds(runs), "tv": over_seeds(runs[:1])})
    assert "| `ce` | 2 | 0.500 | 0.400 | 2.10 ±0.10 | 1.00x | 2.95 ±0.05 | 1.00x |" in table
    rows = {"ce": {"tau_greedy": 1.0, "tau_sampled": 1.0}, "a": {"tau_greedy": 2.0, "tau_sampled": 1.0},
            "b": {"tau_greedy": 1.2, "tau_sampled": 1.2}, "c": {"tau_greedy": 1.0, "tau_sampled": 1.7}}
    assert top_rows(rows, 2) == ["a", "c"] and top_rows({}, 2) == []


@pytest.mark.integration
def test_a_smoke_run_end_to_end(tmp_path):
    """--fast sizes, one pair, three rows and a second seed for the best: targets in rounds, rows, seeds, the doc."""
    import json

    from scripts import bench_distill

    doc = tmp_path / "distill.md"
    bench_distill.main(["--fast", "--out", str(tmp_path / "out"), "--doc", str(doc), "--pairs", "quickstart",
                        "--rows", "ce", "nla", "ce_to_tv", "--seed-rows", "1"])
    rounds = json.loads((tmp_path / "out" / "targets" / "fast" / "quickstart" / "rounds.json").read_text())
    assert 2 <= len(rounds) <= 3 and all(r["heldout_ce"] > 0 for r in rounds)
    text = doc.read_text()
    assert "| `ce` | 2 |" in text and "| `nla` |" in text and "| `ce_to_tv` |" in text and "Budget per row" in text
    assert "held-out CE after each round" in text
    # a re-run measures nothing new
    before = {p: p.stat().st_mtime for p in (tmp_path / "out" / "fast" / "quickstart").glob("*.json")}
    bench_distill.main(["--fast", "--out", str(tmp_path / "out"), "--doc", str(doc), "--pairs", "quickstart",
                        "--rows", "ce", "nla", "ce_to_tv", "--seed-rows", "1"])
    assert {p: p.stat().st_mtime for p in before} == before
