"""EAGLE-3 heads through scripts/train.py: recipe refusals (one line, before any weight loads), a whole run
(acceptance measured by the head drafter, the best checkpoint exported in vLLM's layout with the same logits),
2 processes = 1 process x accumulation 2 = one big batch, resumed and killed (kill -9) runs bit for bit, and the
target's responses as training rows."""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from distill.data.dataset import build_data
from distill.models import load
from distill.outputs.acceptance_log import read_records
from distill.outputs.checkpoints import KILL_ENV
from distill.utils import ModelSetupError
from kinds.draft_vocab import label_token_counts, most_frequent
from kinds.eagle3.build import build_head, freeze_parts, head_at_checkpoint, init_from_target, plan_head
from kinds.eagle3.model import Eagle3Head, is_eagle3_folder, target_aux_hidden
from specdistill.drafts import push_to_hub
from specdistill.recipes import ModelConfig, load_recipe

from helpers import ROOT, accelerate_launch, cli_error, train_script
from tiny import TINY_TEXT, tiny_model, tiny_tokenizer

HEAD_RECIPE = str(ROOT / "recipes" / "tiny_eagle3.yaml")
LINES = TINY_TEXT.split("\n\n")[:4]
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """target/ (a 4-layer tiny Llama that has learnt TINY_TEXT, with its tokenizer), code.txt, chat.jsonl."""
    root = tmp_path_factory.mktemp("heads")
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    target = tiny_model("llama", vocab_size=len(tokenizer), hidden=32, layers=4).train()
    ids = torch.tensor(tokenizer(TINY_TEXT)["input_ids"])
    optimizer = torch.optim.AdamW(target.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(60):
        starts = torch.randint(0, len(ids) - 65, (8,), generator=generator)
        batch = torch.stack([ids[s:s + 65] for s in starts])  # [8, 65]
        target(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    target.eval().save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    (root / "code.txt").write_text(TINY_TEXT)
    # conversations of different lengths: micro-batches hold different numbers of loss tokens per TTT step
    rows = [{"messages": [{"role": "user", "content": f"show {i}"},
                          {"role": "assistant", "content": "\n".join(LINES[: 1 + i % 4])}]} for i in range(36)]
    (root / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def run(workdir: Path, out: str, *overrides: str) -> Path:
    output_dir = workdir / out
    train_script.main([HEAD_RECIPE, f"model.target={workdir / 'target'}", f"data.dataset={workdir / 'code.txt'}",
                       f"train.output_dir={output_dir}", "train.report_to=[]", *overrides])
    return output_dir


def train_losses(folder: Path) -> list[float]:
    state = json.loads((folder / "trainer_state.json").read_text())
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry]


# ---------------------------------------------------------------------------------------------------------------
# Refusals: one line, before any weights load
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture
def no_weights(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("model weights were loaded before the error")
    monkeypatch.setattr(load, "load_target", refuse)


@pytest.mark.parametrize("override, expected", [
    ("model.draft_config={num_hidden_layers: 1}", "model.draft_config: got {'num_hidden_layers': 1}; allowed: null "
                                                  "with model.draft_kind eagle3"),
    ("lora.enabled=true", "lora.enabled: got True; allowed: false with model.draft_kind eagle3"),
    ("distill.teacher_cache=cache", "distill.teacher_cache: got 'cache'; allowed: null with model.draft_kind eagle3"),
    ("distill.on_policy_fraction=0.5", "distill.on_policy_fraction: got 0.5; allowed: 0 with model.draft_kind"),
    ("train.activation_checkpointing=true", "train.activation_checkpointing: got True; allowed: false with model"),
    ("distill.ttt_steps=0", "distill.ttt_steps: got 0; allowed: an integer >= 1"),
    ("distill.ttt_decay=1.5", "distill.ttt_decay: got 1.5; allowed: a finite number in (0, 1]"),
    ("model.aux_layers=[0, 1]", "model.aux_layers: got [0, 1]; allowed: null or 3 distinct, ascending layer ids"),
    ("model.aux_layers=[2, 1, 0]", "model.aux_layers: got [2, 1, 0]; allowed: null or 3 distinct, ascending"),
    ("model.aux_layers=[0, 1, 4]", "model.aux_layers: aux layer ids [0, 1, 4] must lie in 0..3"),
    ("model.draft_vocab_size=100000", "model.draft_vocab_size: got 100000; allowed: an integer in [1, 320]"),
])
def test_head_recipe_refusals_are_one_line(monkeypatch, capsys, no_weights, workdir, tmp_path, override, expected):
    message = cli_error(monkeypatch, capsys, HEAD_RECIPE, f"model.target={workdir / 'target'}",
                        f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={tmp_path / 'out'}", override)
    assert expected in message, message


def test_standalone_recipes_refuse_head_keys(monkeypatch, capsys, no_weights, workdir):
    message = cli_error(monkeypatch, capsys, str(ROOT / "recipes" / "tiny_distill.yaml"), "model.target=t",
                        "data.dataset=x.txt", "distill.ttt_steps=3")
    assert "distill.ttt_steps: got 3; allowed: 1 with model.draft_kind standalone" in message
    message = cli_error(monkeypatch, capsys, str(ROOT / "recipes" / "tiny_distill.yaml"), "model.target=t",
                        "data.dataset=x.txt", "model.head_init=random")
    assert "model.head_init: got 'random'; allowed: target with model.draft_kind standalone" in message
    # model.draft_vocab_size is both kinds' key (a standalone draft's readout: tests/test_draft_vocab.py)


def test_a_head_is_built_from_the_target_config_and_shares_its_embedding():
    target = tiny_model("qwen2", layers=6)
    head = build_head(ModelConfig(target="t", draft_kind="eagle3", draft_vocab_size=40), target, torch.float32)
    assert head.aux_layers == [2, 3, 4] and head.lm_head.weight.shape == (40, 32)  # (2, 3, 3) made distinct
    assert head.bound_embeddings is target.get_input_embeddings()
    assert not any(name.startswith("embed") for name in head.state_dict())  # shared, never saved
    assert head.training and all(p.requires_grad for p in head.parameters())
    with pytest.raises(ModelSetupError, match="3 distinct target layers .* the target has 2"):
        plan_head(ModelConfig(target="t", draft_kind="eagle3"), tiny_model("llama", layers=2).config)
    with pytest.raises(ModelSetupError, match="needs a Llama-like target with rotary positions.*GPT2Config"):
        plan_head(ModelConfig(target="t", draft_kind="eagle3"), tiny_model("gpt2").config)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_head_init_target_reads_out_like_the_target(arch):
    """model.head_init target: on any hidden state the head's readout (norm, lm_head) gives the target's logits of
    the draft vocabulary, and its MLP is the target's last layer's; nothing else is touched."""
    target = tiny_model(arch, layers=4)
    head = build_head(ModelConfig(target="t", draft_kind="eagle3", draft_vocab_size=40), target, torch.float32)
    ids = torch.tensor(sorted(torch.randperm(96, generator=torch.Generator().manual_seed(0))[:40].tolist()))
    head.set_vocab(ids)
    fc_before = head.fc.weight.clone()
    assert init_from_target(head, target) == ["lm_head", "norm", "midlayer.mlp"]
    x = torch.randn(3, 5, 32)
    expected = target.lm_head(target.model.norm(x))[..., ids]  # [3, 5, 40]
    torch.testing.assert_close(head.logits(head.norm(x)), expected)
    last = target.model.layers[-1]
    torch.testing.assert_close(head.midlayer.mlp(x), last.mlp(x))
    torch.testing.assert_close(head.midlayer.post_attention_layernorm(x), last.post_attention_layernorm(x))
    assert torch.equal(head.fc.weight, fc_before)
    narrow = build_head(ModelConfig(target="t", draft_kind="eagle3", head_intermediate_size=16), target,
                        torch.float32)
    assert init_from_target(narrow, target) == ["lm_head", "norm"]  # a narrower MLP starts fresh


def test_head_fc_init_last_aux_passes_the_deepest_aux_layer_through():
    """model.head_fc_init last_aux: fuse(aux hidden states) is the target's hidden state at the deepest aux layer,
    exactly; a head narrower than its target is refused in one line."""
    from distill.data.hidden_cache import target_features
    from kinds.eagle3.build import fc_from_last_aux

    target = tiny_model("llama", layers=5)
    head = build_head(ModelConfig(target="t", draft_kind="eagle3", draft_vocab_size=40), target, torch.float32)
    fc_from_last_aux(head)
    ids = torch.randint(3, 96, (2, 7), generator=torch.Generator().manual_seed(1))
    aux, _ = target_features(target, ids, torch.ones_like(ids), head.aux_layers)
    deepest = target(input_ids=ids, output_hidden_states=True).hidden_states[head.aux_layers[-1]]
    torch.testing.assert_close(head.fuse(aux), deepest, rtol=0, atol=0)
    head.config.target_hidden_size = 16
    with pytest.raises(ModelSetupError, match=r"^model.head_fc_init: last_aux needs the head's hidden size \(32\) "
                                              r"to be the target's \(16\); use random$"):
        fc_from_last_aux(head)


def test_head_attn_init_target_starts_the_head_as_the_targets_layer(caplog):
    """model.head_attn_init target with head_fc_init last_aux: the head's first layer, whatever the token, computes the
    target's layer L - 1 on the deepest aux layer's stream, attention and MLP (causal, at the same positions); a
    target whose layer has other attention shapes is refused in one line where the recipe asks for it, and warned
    about, the attention left random, where it is the kind's default."""
    from kinds.eagle3.build import attention_from_target, fc_from_last_aux

    target = tiny_model("llama", layers=4)
    head = build_head(ModelConfig(target="t", draft_kind="eagle3", draft_vocab_size=40), target, torch.float32)
    init_from_target(head, target)
    attention_from_target(head, target)
    fc_from_last_aux(head)
    ids = torch.randint(3, 96, (2, 6), generator=torch.Generator().manual_seed(2))
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(3))
    position_ids = torch.arange(6).expand(2, 6)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    _, stream = head.run(ids, x, position_ids, lambda i, q, k, v: head.attend(q, k, v, causal[None, None], layer=i))
    layer = target.model.layers[-1]
    mask = torch.zeros(1, 1, 6, 6).masked_fill(~causal, float("-inf"))
    expected = layer(x, attention_mask=mask, position_ids=position_ids,
                     position_embeddings=target.model.rotary_emb(x, position_ids))
    expected = expected[0] if isinstance(expected, tuple) else expected
    torch.testing.assert_close(stream, expected)
    target.model.layers[-1].self_attn.k_proj = torch.nn.Linear(32, 8, bias=False)  # one key head fewer
    with pytest.raises(ModelSetupError, match=r"^model.head_attn_init: target needs the target's layer 3 attention "
                                              r"in the head's shapes \(its heads, head size and width\); use random$"):
        attention_from_target(head, target)
    fresh = build_head(ModelConfig(target="t", draft_kind="eagle3", draft_vocab_size=40), target, torch.float32)
    before = fresh.midlayer.self_attn.q_proj.weight.clone()
    assert attention_from_target(fresh, target, required=False) is False
    assert torch.equal(fresh.midlayer.self_attn.q_proj.weight, before)
    assert caplog.messages[-1] == ("model.head_attn_init: target needs the target's layer 3 attention in the head's "
                                   "shapes (its heads, head size and width) (the kind's default: the attention starts "
                                   "random)")


def test_a_deeper_head_starts_from_the_targets_last_layers():
    """model.head_layers 2 with head_init target: the first layer's MLP is the target's layer L - 2's, layer 1 is the
    target's last decoder layer whole (attention, MLP, both norms), so it computes that layer's output."""
    target = tiny_model("llama", layers=4)
    head = build_head(ModelConfig(target="t", draft_kind="eagle3", head_layers=2), target, torch.float32)
    assert init_from_target(head, target) == ["lm_head", "norm", "midlayer.mlp", "layers.1"]
    x = torch.randn(3, 5, 32)
    torch.testing.assert_close(head.midlayer.mlp(x), target.model.layers[2].mlp(x))
    last, layer = target.model.layers[3], head.layer(1)
    for name, value in layer.state_dict().items():
        assert torch.equal(value, last.state_dict()[name]), name
    too_deep = build_head(ModelConfig(target="t", draft_kind="eagle3", head_layers=5), target, torch.float32)
    assert init_from_target(too_deep, target) == ["lm_head", "norm"]  # more layers than the target: fresh


def test_frozen_parts_train_no_further_and_a_part_left_random_is_refused():
    target = tiny_model("llama", layers=4)
    head = build_head(ModelConfig(target="t", draft_kind="eagle3", draft_vocab_size=40), target, torch.float32)
    freeze_parts(head, ["lm_head", "mlp"], init_from_target(head, target))
    frozen = {name for name, p in head.named_parameters() if not p.requires_grad}
    assert frozen == {"lm_head.weight", "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight",
                      "midlayer.mlp.down_proj.weight", "midlayer.post_attention_layernorm.weight"}
    narrow = build_head(ModelConfig(target="t", draft_kind="eagle3", head_intermediate_size=16), target,
                        torch.float32)
    with pytest.raises(ModelSetupError, match="model.head_frozen: mlp was not copied from the target"):
        freeze_parts(narrow, ["norm", "mlp"], init_from_target(narrow, target))


def test_head_frozen_needs_a_head_started_from_the_target(monkeypatch, capsys, no_weights, workdir, tmp_path):
    message = cli_error(monkeypatch, capsys, HEAD_RECIPE, f"model.target={workdir / 'target'}",
                        f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={tmp_path / 'out'}",
                        "model.head_init=random", "model.head_frozen=[lm_head]")
    assert "model.head_frozen: got ['lm_head']; allowed: [] with model.head_init random" in message, message


@pytest.mark.parametrize("loss", ["reverse_kl", "{forward_kl: 0.5, reverse_kl: 0.5}"])
def test_a_top_k_teacher_refuses_reverse_kl(monkeypatch, capsys, no_weights, workdir, tmp_path, loss):
    message = cli_error(monkeypatch, capsys, HEAD_RECIPE, f"model.target={workdir / 'target'}",
                        f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={tmp_path / 'out'}",
                        f"distill.loss={loss}", "distill.soft_target_top_k=8")
    assert "distill.soft_target_top_k: got 8; allowed: null with reverse KL in distill.loss" in message, message


# ---------------------------------------------------------------------------------------------------------------
# Whole runs
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.integration
def test_a_trained_head_is_accepted_more_and_exports_the_served_folder(workdir):
    out = run(workdir, "run", "model.draft_vocab_size=200", "train.save_steps=8", "train.save_total_limit=null")
    records = read_records(out)
    assert sorted({r["step"] for r in records}) == [8, 16, 24]
    rate = {step: sum(r["acceptance_rate"] for r in records if r["step"] == step) / 3 for step in (8, 24)}
    assert rate[24] > rate[8] + 0.1, rate
    assert all(r["greedy_match"] == 1.0 for r in records)  # the head drafter stays lossless

    # the best checkpoint, exported in vLLM's eagle3 layout; reloaded, it computes the trained head's logits
    results = json.loads((out / "train_results.json").read_text())
    best = results["best"]
    assert results["deploy_check"]["passed"] is True, results["deploy_check"]  # specdistill-check knows heads
    assert is_eagle3_folder(out) and (out / "tokenizer.json").is_file()
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 200
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # (2, 2, 1) made distinct
    assert set(load_file(out / "model.safetensors")) >= {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
                                                          "midlayer.hidden_norm.weight"}
    assert json.loads((out / "generation_config.json").read_text())["num_assistant_tokens"] == best["gamma"]
    target = AutoModelForCausalLM.from_pretrained(workdir / "target").eval()
    trained = head_at_checkpoint(out / best["checkpoint"], Eagle3Head.from_pretrained(out).bind_embeddings(
        target.get_input_embeddings()))
    exported = Eagle3Head.from_pretrained(out, target.get_input_embeddings())
    ids = torch.tensor([[1, 40, 50, 60, 70, 80, 90]])
    aux = target_aux_hidden(target(ids, output_hidden_states=True).hidden_states, exported.aux_layers)
    positions = torch.arange(ids.shape[1]).view(1, -1)
    with torch.no_grad():
        expected = trained(ids, trained.fuse(aux), positions)[0]
        got = exported(ids, exported.fuse(aux), positions)[0]
    assert torch.equal(got, expected)
    # the draft vocabulary: the 200 most frequent label tokens of the training rows (held-out prompts excluded)
    recipe = load_recipe(out / "recipe.yaml")
    rows = build_data(recipe.data, tiny_tokenizer(), seed=recipe.train.seed).train
    assert torch.equal(exported.target_ids, most_frequent(label_token_counts(rows, config["vocab_size"]), 200))

    # card and push as for standalone drafts: the card says what it is and how vLLM and SGLang serve it
    plan = push_to_hub(out, repo_id="someone/tiny-head", dry_run=True)
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= set(plan.files)
    card = (out / "README.md").read_text()
    assert "An EAGLE-3 draft head" in card and "- eagle3" in card
    assert '"method": "eagle3", "model": "someone/tiny-head"' in card and "--speculative-algorithm EAGLE3" in card

    state = json.loads((out / "checkpoint-24" / "trainer_state.json").read_text())
    logs = [entry for entry in state["log_history"] if "loss" in entry]
    assert all({"ttt/step0_kd", "ttt/step2_tv", "kd", "tv", "tokens_per_s"} <= set(e) for e in logs)
    assert logs[-1]["ttt/step0_tv"] < logs[0]["ttt/step0_tv"] and logs[-1]["ttt/step2_tv"] < logs[0]["ttt/step2_tv"]


@pytest.mark.integration
def test_a_head_trained_with_frozen_parts_exports_the_targets_weights_there(workdir):
    """model.head_frozen=[lm_head, norm] with feature noise, a top-k teacher, feature regression and fc started on
    the deepest aux layer: the exported head's readout is still the target's (its lm_head rows of the draft
    vocabulary, its final norm) while the rest of the head has trained; every logged loss finite, the feature
    regression's logged at every step."""
    out = run(workdir, "frozen", "model.draft_vocab_size=200", "model.head_frozen=[lm_head, norm]",
              "distill.feature_noise=0.1", "distill.soft_target_top_k=10", "distill.feature_weight=0.5",
              "model.head_fc_init=last_aux",
              "train.max_steps=4", "train.save_steps=4", "train.logging_steps=1", "data.num_eval_prompts=0")
    losses = train_losses(out / "checkpoint-4")
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses), losses
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    features = [entry["ttt/step0_feature"] for entry in state["log_history"] if "loss" in entry]
    assert len(features) == 4 and all(math.isfinite(x) and x > 0 for x in features), features
    target = AutoModelForCausalLM.from_pretrained(workdir / "target")
    head = Eagle3Head.from_pretrained(out, target.get_input_embeddings())
    assert torch.equal(head.lm_head.weight, target.lm_head.weight[head.target_ids])
    assert torch.equal(head.norm.weight, target.model.norm.weight)
    fresh = build_head(ModelConfig(target="t", draft_kind="eagle3", draft_vocab_size=200), target, torch.float32)
    fresh.set_vocab(head.target_ids)
    init_from_target(fresh, target)
    assert not torch.equal(head.midlayer.mlp.up_proj.weight, fresh.midlayer.mlp.up_proj.weight)  # it trained


CHAT_RUN = ("data.dataset={chat}", "data.format=chat", "data.max_length=48", "data.num_eval_prompts=0",
            "train.max_steps=4", "train.logging_steps=1", "train.save_steps=4", "train.per_device_train_batch_size=3",
            "model.draft_vocab_size=150")


@pytest.mark.integration
def test_two_processes_match_one_process_and_one_big_batch(workdir):
    args = [a.format(chat=workdir / "chat.jsonl") for a in CHAT_RUN]
    big = run(workdir, "one_batch", *args, "train.per_device_train_batch_size=6")
    single = run(workdir, "one_process", *args, "train.gradient_accumulation_steps=2")
    two = workdir / "two_processes"
    accelerate_launch(ROOT / "scripts" / "train.py", HEAD_RECIPE, f"model.target={workdir / 'target'}",
                      f"train.output_dir={two}", "train.report_to=[]", *args, "train.gradient_accumulation_steps=1",
                      timeout=300)
    reference = train_losses(big / "checkpoint-4")
    assert len(reference) == 4
    for folder in (single, two):
        assert train_losses(folder / "checkpoint-4") == pytest.approx(reference, rel=2e-5)
        ours, theirs = load_file(folder / "model.safetensors"), load_file(big / "model.safetensors")
        assert ours.keys() == theirs.keys()
        for key in ours:
            torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-6, msg=lambda m: f"{key}: {m}")


@pytest.mark.integration
@pytest.mark.parametrize("bf16", [False, True])
def test_bf16_on_cpu_puts_the_loss_heads_under_autocast(workdir, monkeypatch, bf16):
    """train.bf16 with train.use_cpu: the whole loss (the head's and the teacher's lm_head matmuls, most of a head's
    step) runs under bfloat16 autocast, not only the head's forward; without it, float32 throughout."""
    import distill.losses.distill_loss as losses
    fused, seen = losses.fused_head_loss, []

    def spy(*args, **kwargs):
        seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
        return fused(*args, **kwargs)
    monkeypatch.setattr(losses, "fused_head_loss", spy)
    precision = ["train.use_cpu=true", "train.bf16=true"] if bf16 else []
    out = run(workdir, f"bf16_{bf16}", *[a.format(chat=workdir / "chat.jsonl") for a in CHAT_RUN], *precision)
    assert len(seen) == 4 * 3 and set(seen) == {bf16}  # 4 steps x 3 TTT steps, one fused loss each
    logged = train_losses(out / "checkpoint-4")
    assert len(logged) == 4 and all(math.isfinite(x) for x in logged)


@pytest.mark.integration
def test_the_precision_benchmark_pairs_the_same_steps_of_both_runs(workdir, tmp_path, capsys):
    """scripts/bench_precision.py: runs of the recipe, float32 then bfloat16 autocast, compared step by step; with
    --repeats the pair runs again, alternating, and every repeat's ratio is kept."""
    from scripts import bench_precision
    result = bench_precision.main([HEAD_RECIPE, f"model.target={workdir / 'target'}",
                                   f"data.dataset={workdir / 'code.txt'}", "--steps", "4", "--warmup", "1",
                                   "--repeats", "2", "--out", str(tmp_path)])
    assert result["steps"] == 3 and result["ratio"] > 0 and len(result["ratios"]) == 2
    assert min(result["ratios"]) <= result["ratio"] <= max(result["ratios"])  # the median of both repeats' pairs
    assert sorted(f.name for f in tmp_path.iterdir()) == ["bfloat16-1", "bfloat16-2", "float32-1", "float32-2"]
    assert bench_precision.run_folder(tmp_path, "float32", 0, 1) == tmp_path / "float32"  # one pair: no suffix
    fp32, bf16 = result["float32"], result["bfloat16"]
    assert bf16["kd"] == pytest.approx(fp32["kd"], rel=0.05) and bf16["kd"] != fp32["kd"]  # bf16 ran, and trains alike
    table = capsys.readouterr().out
    assert "| bfloat16" in table and "speed vs float32" in table
    assert "2 repeats of the pair; each repeat's ratio" in table
    with pytest.raises(SystemExit):
        bench_precision.main([HEAD_RECIPE, "--repeats", "0"])
    assert "--repeats must be at least 1 (got 0)" in capsys.readouterr().err


@pytest.mark.integration
def test_resumed_head_run_is_the_same_run_bit_for_bit(workdir, monkeypatch, capsys):
    common = ("data.num_eval_prompts=0", "train.max_steps=6", "train.save_steps=3", "train.logging_steps=1",
              "train.lr_scheduler_type=cosine", "train.save_total_limit=null")
    whole = run(workdir, "whole", *common)
    resumed = workdir / "resumed"
    resumed.mkdir()
    shutil.copytree(whole / "checkpoint-3", resumed / "checkpoint-3")  # a run interrupted after step 3
    run(workdir, "resumed", *common, "train.resume_from_checkpoint=true")
    ours, theirs = (load_file(f / "checkpoint-6" / "model.safetensors") for f in (resumed, whole))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert train_losses(resumed / "checkpoint-6") == train_losses(whole / "checkpoint-6")
    exported, saved = load_file(resumed / "model.safetensors"), load_file(whole / "model.safetensors")
    assert all(torch.equal(exported[k], saved[k]) for k in saved)
    # a checkpoint of another head shape is named in one line before any weights load
    message = cli_error(monkeypatch, capsys, HEAD_RECIPE, f"model.target={workdir / 'target'}",
                        f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={resumed}", "train.report_to=[]",
                        *common, "train.max_steps=9", "train.resume_from_checkpoint=true", "model.draft_vocab_size=100")
    assert "holds no EAGLE-3 head of the recipe's shape (lm_head.weight: [320, 32], the recipe's head has [100, 32])" \
        in message, message
    message = cli_error(monkeypatch, capsys, HEAD_RECIPE, f"model.target={workdir / 'target'}",
                        f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={resumed}", "train.report_to=[]",
                        *common, "train.max_steps=9", "train.resume_from_checkpoint=true", "model.head_layers=2")
    assert "holds no EAGLE-3 head of the recipe's shape (layers.1.mlp.up_proj.weight: None, the recipe's head has " \
           "[64, 32])" in message, message


@pytest.mark.integration
def test_target_responses_train_a_head(workdir):
    """Sequence-level KD rows (the target's responses) are token rows: a head trains on them mixed with the
    dataset's, and its vocabulary is counted over the mixed rows."""
    out = run(workdir, "responses", "data.num_eval_prompts=0", "train.max_steps=2", "train.logging_steps=1",
              "train.save_steps=2", "data.target_weight=1.0", f"data.target_data_dir={workdir / 'responses'}",
              "data.target_max_new_tokens=16", "data.prompt_tokens=8")
    logs = [e for e in json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
            if "loss" in e]
    assert len(logs) == 2 and all(e["ttt/step0_kd"] > 0 for e in logs)
    assert is_eagle3_folder(out) and any((workdir / "responses").iterdir())


@pytest.mark.integration
def test_a_two_layer_head_trains_measures_and_exports(workdir):
    """model.head_layers=2 through the whole run: the training-time test, the checkpoint's acceptance measured by our
    decoder (lossless), the export (layers.1.* beside midlayer.*, num_hidden_layers 2 in both configs) that the deploy
    check passes and reads back to the trained head; its card and serving commands say SGLang serves one layer."""
    from kinds.eagle3.deploy import head_serving_commands

    out = run(workdir, "two_layers", "model.head_layers=2", "distill.ttt_steps=2", "train.max_steps=4",
              "train.save_steps=4", "train.logging_steps=1", "data.num_eval_prompts=2", "eval.gammas=[2]",
              "eval.max_new_tokens=8")
    assert all(r["greedy_match"] == 1.0 for r in read_records(out))
    results = json.loads((out / "train_results.json").read_text())
    assert results["deploy_check"]["passed"] is True, results["deploy_check"]
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == config["transformer_layer_config"]["num_hidden_layers"] == 2
    names = set(load_file(out / "model.safetensors"))
    assert {"midlayer.hidden_norm.weight", "layers.1.self_attn.q_proj.weight",
            "layers.1.input_layernorm.weight"} <= names
    assert not any(name.startswith("layers.1.hidden_norm") for name in names)
    target = AutoModelForCausalLM.from_pretrained(workdir / "target").eval()
    exported = Eagle3Head.from_pretrained(out, target.get_input_embeddings())
    trained = head_at_checkpoint(out / "checkpoint-4", exported)
    assert all(torch.equal(exported.state_dict()[k], v) for k, v in trained.state_dict().items())
    push_to_hub(out, repo_id="someone/two-layer-head", dry_run=True)  # writes the card
    assert "2 decoder layers (vLLM serves it; SGLang one-layer heads only)" in (out / "README.md").read_text()
    commands = head_serving_commands("t", str(out), 2, layers=2)
    assert "vllm serve" in commands and "not served: SGLang's EAGLE3 runs one-layer heads only" in commands


KILL_RUN = ("train.max_steps=12", "train.save_steps=4", "train.save_total_limit=null", "train.logging_steps=4",
            "data.num_eval_prompts=2", "eval.gammas=[2]", "eval.max_new_tokens=8")
MEASURED = ("step", "checkpoint", "gamma", "acceptance_rate", "mean_accepted_tokens", "greedy_match")


def killed_run(workdir: Path, out: str, point: str) -> Path:
    """scripts/train.py in a real process that SIGKILLs itself at `point` (distill.outputs.checkpoints.crash_point)."""
    env = {**os.environ, KILL_ENV: point, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, str(ROOT / "scripts" / "train.py"), HEAD_RECIPE, f"model.target={workdir / 'target'}",
               f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={workdir / out}", "train.report_to=[]",
               *KILL_RUN]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    return workdir / out


@pytest.mark.integration
@pytest.mark.parametrize("point", ["acceptance:2", "export"])
def test_a_killed_head_run_resumes_to_the_same_run(workdir, point):
    """kill -9 while measuring checkpoint-8 (measured from its folder on resume) or while exporting (nothing is
    trained again: the last checkpoint's head is read back and exported): the same weights and measurements."""
    reference = workdir / "kill_reference"
    if not (reference / "train_results.json").is_file():
        run(workdir, "kill_reference", *KILL_RUN)
    out = killed_run(workdir, f"killed_{point.split(':')[0]}", point)
    run(workdir, out.name, *KILL_RUN, "train.resume_from_checkpoint=true")
    for step in (4, 8, 12):
        ours, theirs = (load_file(f / f"checkpoint-{step}" / "model.safetensors") for f in (out, reference))
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours), step
    measured = [sorted(tuple(json.dumps(r[k]) for k in MEASURED) for r in read_records(f)) for f in (out, reference)]
    assert measured[0] == measured[1] and {r["step"] for r in read_records(out)} == {4, 8, 12}
    exported, expected = load_file(out / "model.safetensors"), load_file(reference / "model.safetensors")
    assert exported.keys() == expected.keys() and all(torch.equal(exported[k], expected[k]) for k in expected)
