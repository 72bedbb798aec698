"""DFlash drafts trained by a recipe (kinds/dflash/): the block loss and its gradients equal a plain per-block
reference, anchors are drawn where a loss token follows, recipe refusals are one line before any weight loads, and a
whole run on a tiny pair exports vLLM's dflash layout, which our decoder runs losslessly, the deployment check passes
and a resumed run continues bit for bit."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from distill.models import load
from kinds import kind_named, kind_of_source
from kinds.dflash.loss import (
    BlockTraining,
    position_weights,
    sample_anchors,
    slot_labels,
    slot_sums,
    slot_token_counts,
    weighted_block_loss,
)
from kinds.dflash.model import DFlashDraft, dflash_config_for
from specdistill.drafts import check_deploy
from specdistill.recipes import DistillConfig

from helpers import ROOT, cli_error, learnt_tiny_pair, train_script
from tiny import tiny_model, tiny_tokenizer

RECIPE = str(ROOT / "recipes" / "tiny_dflash.yaml")
IGNORE = -100


def reference_loss(draft: DFlashDraft, target, ids, labels, attention_mask, anchors, kept, weights, loss: str):
    """sum_k w_k l_k / sum_k w_k over every kept slot, each block run alone by DFlashDraft.forward (its context: the
    target's hidden states of positions < a; its queries [x_a, mask, ...] at positions a..a+S-1)."""
    with torch.no_grad():
        out = target(ids, attention_mask=attention_mask, output_hidden_states=True)
    aux = torch.cat([out.hidden_states[i] for i in draft.context_layers], dim=-1)
    size, total, count = draft.block_size, 0.0, 0.0
    for b in range(ids.shape[0]):
        for a, keep in zip(anchors[b].tolist(), kept[b].tolist()):
            if not keep:
                continue
            block = torch.tensor([[ids[b, a].item()] + [draft.mask_token_id] * (size - 1)])
            logits = draft(aux[b:b + 1, :a], block)[0]  # [S, V]
            for k in range(1, size):
                if a + k >= ids.shape[1] or labels[b, a + k] == IGNORE or not attention_mask[b, a + k]:
                    continue
                log_q = F.log_softmax(logits[k], -1)
                if loss == "ce":
                    value = -log_q[labels[b, a + k]]
                else:  # forward KL(p || q), p the target's at a + k - 1
                    log_p = F.log_softmax(out.logits[b, a + k - 1], -1)
                    value = (log_p.exp() * (log_p - log_q)).sum()
                total = total + weights[k - 1] * value
                count += weights[k - 1]
    return total / count


@pytest.mark.parametrize("loss", ["forward_kl", "ce"])
def test_the_block_loss_and_its_gradients_equal_one_block_at_a_time(loss):
    target = tiny_model("llama", layers=4, vocab_size=97)
    draft = DFlashDraft(dflash_config_for(target.config, mask_token_id=96, block_size=4)).bind_target(target)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 90, (2, 14), generator=g)
    attention_mask = torch.ones_like(ids)
    attention_mask[1, 11:] = 0  # right padding
    labels = ids.clone()
    labels[:, :4] = IGNORE  # a prompt
    labels[attention_mask == 0] = IGNORE
    anchors, kept = sample_anchors(labels, attention_mask, 6, g)
    weights = position_weights(4, 2.0)
    with torch.no_grad():
        out = target.base_model(ids, attention_mask=attention_mask, output_hidden_states=True)
    aux = torch.cat([out.hidden_states[i] for i in draft.context_layers], dim=-1)
    hidden = BlockTraining(draft)(ids, aux, anchors, attention_mask)
    slots = slot_labels(labels, attention_mask, anchors, kept, 4)
    sums = slot_sums(hidden, out.last_hidden_state, target.get_output_embeddings(), slots, anchors,
                     DistillConfig(loss=loss, chunk_size=5))
    weighted = (torch.tensor(weights, dtype=torch.float64) * slot_token_counts(slots).double()).sum()
    ours = weighted_block_loss(sums, weights, weighted.float())
    ours.backward()
    ours_grad = draft.fc.weight.grad.clone()
    draft.zero_grad()
    plain = reference_loss(draft, target, ids, labels, attention_mask, anchors, kept, weights, loss)
    plain.backward()
    torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours_grad, draft.fc.weight.grad, rtol=1e-4, atol=1e-6)


def test_anchors_sit_where_a_loss_token_follows_and_repeat_with_the_seed():
    labels = torch.full((2, 10), IGNORE)
    labels[0, 5:] = 7
    labels[1, 8] = 7  # one loss token: one anchor (7)
    mask = torch.ones_like(labels)
    anchors, kept = sample_anchors(labels, mask, 3, torch.Generator().manual_seed(1))
    assert kept[0].all() and all(4 <= a <= 8 for a in anchors[0].tolist()) and len(set(anchors[0].tolist())) == 3
    assert kept[1].tolist() == [True, False, False] and anchors[1, 0] == 7
    again, _ = sample_anchors(labels, mask, 3, torch.Generator().manual_seed(1))
    assert torch.equal(anchors, again)
    assert position_weights(4, 2.0) == pytest.approx([1.0, math.exp(-0.5), math.exp(-1.0)])
    assert position_weights(3, None) == [1.0, 1.0]


# ---------------------------------------------------------------------------------------------------------------
# A whole run on a tiny pair
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """target/ (a 4-layer tiny Llama that has learnt TINY_TEXT; its embedding has a spare row for the mask token)
    and code.txt."""
    return learnt_tiny_pair(tmp_path_factory.mktemp("dflash"))


def run(workdir: Path, out: str, *overrides: str) -> Path:
    output_dir = workdir / out
    train_script.main([RECIPE, f"model.target={workdir / 'target'}", f"data.dataset={workdir / 'code.txt'}",
                       f"train.output_dir={output_dir}", "train.report_to=[]", *overrides])
    return output_dir


@pytest.fixture(scope="module")
def trained(workdir) -> Path:
    return run(workdir, "run")


def test_a_recipe_trains_a_dflash_draft_that_serves_losslessly(trained, workdir):
    last = max(trained.glob("checkpoint-*"), key=lambda folder: int(folder.name.split("-")[1]))
    state = json.loads((last / "trainer_state.json").read_text())
    losses = [e["loss"] for e in state["log_history"] if "loss" in e]
    assert losses[-1] < 0.7 * losses[0], losses
    assert all(f"dflash/slot{k}_tv" in e for e in state["log_history"] if "loss" in e for k in (1, 4))
    config = json.loads((trained / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["dflash_config"]["mask_token_id"] == 320
    assert kind_of_source(trained).name == "dflash" and (trained / "tokenizer.json").is_file()
    assert not any(name.startswith(("embed", "lm_head")) for name in load_file(trained / "model.safetensors"))
    rows = [json.loads(line) for line in (trained / "acceptance.jsonl").read_text().splitlines()]
    assert rows and all(r["greedy_match"] == 1.0 for r in rows)  # our decoder: exactly the target's greedy text
    assert max(r["mean_accepted_tokens"] for r in rows) > 1.15  # it learnt something: more than one token per step
    report = check_deploy(str(workdir / "target"), trained)
    assert report.passed and report.kind == "dflash", report.problems
    assert '"method": "dflash"' in kind_named("dflash").serving_commands(report)


def test_the_deploy_check_names_what_a_broken_dflash_folder_lacks(trained, workdir, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(trained, broken)
    config = json.loads((broken / "config.json").read_text())
    config["dflash_config"]["mask_token_id"] = 5000
    (broken / "config.json").write_text(json.dumps(config))
    report = check_deploy(str(workdir / "target"), broken)
    assert set(report.problems) == {"mask_token", "manifest"}, report.problems  # edited after export: both named
    assert "mask_token_id=5000" in report.problems["mask_token"]


def test_a_resumed_dflash_run_continues_bit_for_bit(workdir):
    """Anchors are drawn from the step, the micro-batch and the process: resuming draws the same ones."""
    whole = run(workdir, "whole", "train.max_steps=8", "train.save_steps=4", "eval.at_checkpoints=false")
    first = run(workdir, "part", "train.max_steps=8", "train.save_steps=4", "eval.at_checkpoints=false")
    import shutil

    shutil.rmtree(first / "checkpoint-8")
    for name in ("train_results.json", "model.safetensors", "config.json"):
        (first / name).unlink(missing_ok=True)
    resumed = run(workdir, "part", "train.max_steps=8", "train.save_steps=4", "eval.at_checkpoints=false",
                  "train.resume_from_checkpoint=true")
    a, b = load_file(whole / "checkpoint-8" / "model.safetensors"), load_file(resumed / "checkpoint-8" /
                                                                               "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------------------------------------------------
# Refusals: one line, before any weights load
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture
def no_weights(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("model weights were loaded before the error")
    monkeypatch.setattr(load, "load_target", refuse)


@pytest.mark.parametrize("override, expected", [
    ("lora.enabled=true", "lora.enabled: got True; allowed: false with model.draft_kind dflash"),
    ("distill.teacher_cache=cache", "distill.teacher_cache: got 'cache'; allowed: null with model.draft_kind dflash"),
    ("eval.gammas=[2, 6]", "eval.gammas: got [2, 6]; allowed: gammas <= 4 with model.dflash_block_size 5"),
    ("model.aux_layers=[0, 1, 2]", "model.aux_layers: got [0, 1, 2]; allowed: null with model.draft_kind dflash (it "
                                   "is a key of EAGLE-3 heads: model.draft_kind eagle3)"),
    ("distill.ttt_steps=3", "distill.ttt_steps: got 3; allowed: 1 with model.draft_kind dflash"),
    ("model.dflash_block_size=1", "model.dflash_block_size: got 1; allowed: an integer >= 2"),
    ("model.dflash_init_layers=[0, 1]", "model.dflash_init_layers: got [0, 1]; allowed: 1 target layer ids"),
    ("model.dflash_target_layers=[3]", "model.dflash_target_layers: dflash_config.target_layer_ids [3] must be"),
])
def test_dflash_recipe_refusals_are_one_line(monkeypatch, capsys, no_weights, workdir, tmp_path, override, expected):
    message = cli_error(monkeypatch, capsys, RECIPE, f"model.target={workdir / 'target'}",
                        f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={tmp_path / 'out'}", override)
    assert expected in message, message
    assert "\n" not in message.strip()


def test_a_target_without_a_spare_row_needs_a_named_mask_token(monkeypatch, capsys, no_weights, workdir, tmp_path):
    tokenizer = tiny_tokenizer()
    tiny_model("llama", vocab_size=len(tokenizer), hidden=32, layers=4).save_pretrained(tmp_path / "full")
    tokenizer.save_pretrained(tmp_path / "full")
    message = cli_error(monkeypatch, capsys, RECIPE, f"model.target={tmp_path / 'full'}",
                        f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={tmp_path / 'out'}")
    assert "model.dflash_mask_token_id: the embedding has no spare row" in message, message


def test_standalone_recipes_refuse_dflash_keys(monkeypatch, capsys, no_weights):
    message = cli_error(monkeypatch, capsys, str(ROOT / "recipes" / "tiny_distill.yaml"), "model.target=t",
                        "data.dataset=x.txt", "model.dflash_layers=2")
    assert "model.dflash_layers: got 2; allowed: 1 with model.draft_kind standalone (it is a key of DFlash drafts" \
        in message
