"""A mask token whose embedding row is all zeros (a padding token's: transformers zeroes the padding_idx row and
nn.Embedding never updates it) gives every mask slot the same zero input; DFlash, PARD and P-EAGLE refuse it in one
line naming the key, and a recipe's `data.eval_prompts: ""` placeholder means "not given"."""
from __future__ import annotations

import pytest
import torch

from kinds.dflash.model import zero_mask_row

from helpers import ROOT, cli_error
from tiny import TINY_TEXT, tiny_model, tiny_tokenizer


def test_zero_mask_row_names_a_zero_row_only():
    weight = torch.randn(8, 4)
    assert zero_mask_row(weight, 3) is None
    weight[3] = 0.0
    assert "token 3's embedding row is all zeros" in zero_mask_row(weight, 3)
    assert zero_mask_row(weight, 2) is None
    assert zero_mask_row(torch.empty(0), 3) is None  # sharded away (ZeRO-3): not checked here
    padded = torch.nn.Embedding(8, 4, padding_idx=0)  # what a Llama's pad_token_id row starts as
    assert zero_mask_row(padded.weight, 0) is not None


@pytest.fixture(scope="module")
def zero_row_pair(tmp_path_factory):
    """A tiny Llama target whose spare row (the tiny recipes' default mask token) is zeros, and a text file."""
    root = tmp_path_factory.mktemp("zero_row")
    tokenizer = tiny_tokenizer()
    target = tiny_model("llama", vocab_size=len(tokenizer) + 1, hidden=32, layers=4)
    with torch.no_grad():
        target.get_input_embeddings().weight[len(tokenizer)] = 0.0
    target.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    (root / "code.txt").write_text(TINY_TEXT)
    return root


@pytest.mark.parametrize("recipe, key", [("tiny_dflash.yaml", "model.dflash_mask_token_id"),
                                         ("tiny_pard.yaml", "model.pard_token"),
                                         ("tiny_p_eagle.yaml", "model.ptd_token_id")])
def test_a_mask_token_with_a_zero_row_is_refused_in_one_line(monkeypatch, capsys, zero_row_pair, tmp_path, recipe,
                                                            key):
    out = tmp_path / "out"
    message = cli_error(monkeypatch, capsys, str(ROOT / "recipes" / recipe), f"model.target={zero_row_pair / 'target'}",
                        f"data.dataset={zero_row_pair / 'code.txt'}", f"train.output_dir={out}", "train.report_to=[]")
    assert f"{key}: token {len(tiny_tokenizer())}'s embedding row is all zeros" in message, message
    assert not list(out.glob("checkpoint-*")) and not (out / "model.safetensors").exists()


def test_an_empty_eval_prompts_placeholder_holds_out_rows(tmp_path):
    from distill.data.dataset import build_data
    from specdistill.recipes import load_recipe

    (tmp_path / "code.txt").write_text(TINY_TEXT)
    recipe = load_recipe(ROOT / "recipes" / "tiny_distill.yaml",
                         ["model.target=t", f"data.dataset={tmp_path / 'code.txt'}", "data.eval_prompts=",
                          "data.num_eval_prompts=2"])
    assert recipe.data.eval_prompts in ("", None)
    data = build_data(recipe.data, tiny_tokenizer(), seed=0)
    assert len(data.eval_prompts) == 2 and len(data.train) > 0
