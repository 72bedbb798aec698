"""scripts/bench_distill.py's rows: every row is a valid recipe that differs from the ce row only in its objective."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from distill.recipe_loader import load_recipe
from scripts.bench_distill_rows import PAIRS, ROWS, Sizes, draft_overrides, format_pair_table, winners

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "quickstart" / "draft_kd.yaml"


@pytest.mark.parametrize("pair", list(PAIRS))
def test_rows_share_data_steps_and_optimiser(pair, tmp_path):
    sizes = Sizes()
    recipes = {row: load_recipe(RECIPE, draft_overrides(PAIRS[pair], row, tmp_path / "target", tmp_path / "d.jsonl",
                                                        tmp_path, sizes)) for row in ROWS}
    base = recipes["ce"]
    for row, recipe in recipes.items():
        assert recipe.train == base.train and recipe.model == base.model and recipe.eval == base.eval, row
        assert recipe.data.dataset == base.data.dataset and recipe.data.max_length == sizes.max_length
    assert base.train.max_steps == sizes.draft_steps and base.data.num_eval_prompts == 0
    assert {r: recipes[r].distill.loss for r in ("ce", "reverse_kl", "jsd", "tv", "seq_kd")} == \
        {"ce": "ce", "reverse_kl": "reverse_kl", "jsd": "jsd", "tv": "tv", "seq_kd": "ce"}
    assert recipes["jsd"].distill.beta == 0.5 and recipes["forward_kl+ce0.1"].distill.ce_weight == 0.1
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
    assert "| `jsd` | 0.500 | 0.400 | 2.40 | 1.60x | 2.20 | 1.10x |" in table
    lines = winners(results)
    assert any("greedy (gamma 4): **`jsd`**, mean_accepted_tokens 1.60x, 1.50x" in line for line in lines)
    assert asdict(Sizes())["draft_steps"] > 0
