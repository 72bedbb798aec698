"""distill.loss as a weighted combination of losses: schedules, recipe validation, the trainer's use of it (each term
logged on its own, the weights of each optimizer step) and the on-policy path."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import TrainingArguments

from distill.data.onpolicy import OnPolicySettings
from distill.data.rows import IGNORE_INDEX, DistillCollator
from distill.losses.distill_loss import distill_loss
from distill.losses.loss_mix import LinearWeight, LossMix, LossSpecError
from distill.run.trainer import DistillTrainer
from specdistill.recipes import DistillConfig, RecipeError, load_recipe

from helpers import cli_error
from helpers import run_train as run
from tiny import TINY_TEXT, tiny_model, tiny_tokenizer

MINIMAL = "model:\n  target: t\n  draft: d\ndata:\n  dataset: data.txt\n"
PAD, EOS = 0, 2


# ---------------------------------------------------------------------------------------------------------------
# Schedules and parsing
# ---------------------------------------------------------------------------------------------------------------

def test_a_linear_weight_goes_from_start_to_end_then_holds():
    w = LinearWeight(start=1.0, end=0.2, steps=4)
    assert [w.at(t, total_steps=100) for t in range(7)] == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2, 0.2, 0.2])
    whole_run = LinearWeight(start=0.0, end=1.0)  # steps left out: the run's total optimizer steps
    assert [whole_run.at(t, total_steps=10) for t in (0, 5, 10, 12)] == pytest.approx([0.0, 0.5, 1.0, 1.0])


def test_a_mix_gives_the_weights_of_each_step():
    mix = LossMix.parse({"ce": 0.5, "tv": {"start": 0.0, "end": 1.0, "steps": 2}})
    assert mix.at(0, 10) == {"ce": 0.5, "tv": 0.0}
    assert mix.at(1, 10) == {"ce": 0.5, "tv": 0.5}
    assert mix.at(9, 10) == {"ce": 0.5, "tv": 1.0}
    assert mix.divergences == ("tv",)


def test_a_plain_name_is_unchanged():
    cfg = DistillConfig(loss="tv", ce_weight=0.2)
    assert cfg.loss_at(7, 10) == "tv" and cfg.needs_teacher
    assert not DistillConfig(loss="ce").needs_teacher and not DistillConfig(loss={"ce": 1}).needs_teacher
    mixed = DistillConfig(loss={"ce": {"start": 1, "end": 0}, "nla": 1.0})
    assert mixed.loss_at(5, 10) == {"ce": 0.5, "nla": 1.0} and mixed.needs_teacher


@pytest.mark.parametrize("override, message", [
    ("distill.loss={ce: 0.5, tvd: 0.5}", "distill.loss.tvd: unknown loss 'tvd' (did you mean 'tv'?)"),
    ("distill.loss={ce: -1}", "distill.loss.ce: got -1; allowed: a weight >= 0"),
    ("distill.loss={ce: high}", "distill.loss.ce: got 'high'; allowed: a number >= 0 or {start, end, steps}"),
    ("distill.loss={tv: {start: 0}}", "distill.loss.tv: got {'start': 0}; allowed: a schedule {start: w0, end: w1"),
    ("distill.loss={tv: {start: 0, end: 1, step: 5}}", "distill.loss.tv: got {'start': 0, 'end': 1, 'step': 5}"),
    ("distill.loss={tv: {start: 0, end: 1, steps: 0}}", "distill.loss.tv.steps: got 0; allowed: an integer > 0"),
    ("distill.loss={tv: {start: 0, end: -1}}", "distill.loss.tv.end: got -1; allowed: a weight >= 0"),
    ("distill.loss={}", "distill.loss: got {}; allowed: a loss name or a mapping"),
    ("distill.loss={tv: 0, ce: 0.0}", "distill.loss: got {'tv': 0, 'ce': 0.0}; allowed: at least one weight > 0"),
    ("distill.loss=[ce, tv]", "distill.loss: got ['ce', 'tv'] (list); allowed: one of 'forward_kl'"),
    ("distill.loss=tvd",
     "distill.loss: got 'tvd'; allowed: one of 'forward_kl', 'reverse_kl', 'jsd', 'tv', 'nla', 'lk_hybrid'"),
])
def test_bad_combinations_are_one_line_errors_naming_the_key(tmp_path, override, message):
    path = tmp_path / "recipe.yaml"
    path.write_text(MINIMAL)
    with pytest.raises(RecipeError) as err:
        load_recipe(path, [override])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_ce_weight_with_a_combination_is_refused(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(MINIMAL + "distill:\n  loss: {tv: 1.0}\n  ce_weight: 0.2\n")
    with pytest.raises(RecipeError, match=r"distill\.ce_weight: got 0.2; allowed: 0 when distill.loss is a comb"):
        load_recipe(path)


def test_a_combination_loads_from_yaml_and_a_bad_one_is_a_cli_error(tmp_path, monkeypatch, capsys):
    path = tmp_path / "recipe.yaml"
    path.write_text(MINIMAL + "distill:\n  loss:\n    ce: 0.5\n    tv: {start: 0.0, end: 1.0, steps: 100}\n")
    assert load_recipe(path).distill.loss == {"ce": 0.5, "tv": {"start": 0.0, "end": 1.0, "steps": 100}}
    line = cli_error(monkeypatch, capsys, str(path), "distill.loss={ce: 0.5, lk_hybird: 0.5}")
    assert "distill.loss.lk_hybird: unknown loss 'lk_hybird' (did you mean 'lk_hybrid'?)" in line


def test_loss_spec_error_carries_the_key():
    with pytest.raises(LossSpecError) as err:
        LossMix.parse({"nla": {"start": 1, "end": 0, "steps": 2.5}})
    assert err.value.key == "loss.nla.steps"


# ---------------------------------------------------------------------------------------------------------------
# The trainer: the weights of each optimizer step, each term logged; on-policy rows
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("loss_mix")
    tokenizer = tiny_tokenizer(320)
    tiny_model("llama", seed=0, vocab_size=320, hidden=32, layers=2).save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    (root / "code.txt").write_text(TINY_TEXT)
    return root


@pytest.mark.integration
def test_a_scheduled_combination_trains_and_logs_each_term(workdir):
    out = run(workdir, "mix", "distill.loss={ce: {start: 1.0, end: 0.0, steps: 2}, tv: {start: 0.0, end: 1.0, "
              "steps: 2}, nla: 0.5}", "data.num_eval_prompts=0", "train.max_steps=4", "train.logging_steps=1",
              "train.save_steps=4", "train.report_to=[]")
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    logs = [e for e in state["log_history"] if "loss" in e and "train_runtime" not in e]
    assert [e["weight/ce"] for e in logs] == pytest.approx([1.0, 0.5, 0.0, 0.0])
    assert [e["weight/tv"] for e in logs] == pytest.approx([0.0, 0.5, 1.0, 1.0])
    assert [e["weight/nla"] for e in logs] == [0.5] * 4
    for e in logs:  # one step per log line: the loss is the weighted sum of the logged terms
        assert e["loss"] == pytest.approx(sum(e[f"weight/{n}"] * e[f"loss/{n}"] for n in ("ce", "tv", "nla")),
                                          rel=1e-4)
        assert e["loss/tv"] == pytest.approx(e["tv"], rel=1e-5) and e["loss/ce"] == pytest.approx(e["ce"], rel=1e-5)
        assert e["kd"] == pytest.approx((e["weight/tv"] * e["loss/tv"] + 0.5 * e["loss/nla"])
                                        / (e["weight/tv"] + 0.5), rel=1e-4)


def text_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    rows = []
    for n, prompt in ((12, 4), (9, 0), (16, 7)):
        ids = torch.randint(4, 96, (n,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": [IGNORE_INDEX] * prompt + ids[prompt:]})
    return DistillCollator(PAD)(rows)


@pytest.mark.parametrize("loss", ["nla", "lk_hybrid", {"ce": 0.3, "lk_hybrid": 0.5, "nla": 0.2}], ids=str)
def test_on_policy_rows_take_the_same_loss_as_a_reference_on_their_logits(loss, tmp_path):
    target = tiny_model("llama", vocab_size=96, layers=1)
    draft = tiny_model("llama", vocab_size=96, layers=1, seed=4).train()
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    on_policy = OnPolicySettings(fraction=1.0, max_new_tokens=6, temperature=1.0, prompt_tokens=3, max_length=18,
                                 eos_token_id=EOS, pad_token_id=PAD, vocab_size=96, seed=0)
    trainer = DistillTrainer(model=draft, target=target, args=args, distill=DistillConfig(loss=loss, chunk_size=5),
                             train_dataset=[], data_collator=DistillCollator(PAD), on_policy=on_policy)
    original = text_batch()
    (batch,), _ = trainer.get_batch_samples(iter([text_batch()]), 1, torch.device("cpu"))
    assert not torch.equal(batch["input_ids"][:, :8], original["input_ids"][:, :8])  # rows were replaced
    sums = trainer.distill_sums(draft, batch)
    with torch.no_grad():
        target_logits = target(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    draft_logits = draft(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    reference = distill_loss(draft_logits[:, :-1].flatten(0, 1), target_logits[:, :-1].flatten(0, 1),
                             batch["labels"][:, 1:].flatten(), batch["attention_mask"][:, 1:].flatten().bool(),
                             loss=loss)
    assert sums.num_tokens == reference.num_tokens > 0
    for field in ("loss", "kd", "ce", "tv"):
        torch.testing.assert_close(getattr(sums, field), getattr(reference, field), rtol=1e-4, atol=1e-5,
                                   msg=field)
    params = [p for p in draft.parameters() if p.requires_grad]
    for got, want in zip(torch.autograd.grad(sums.loss, params, allow_unused=True),
                         torch.autograd.grad(reference.loss, params, allow_unused=True)):
        if want is not None:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("rule", ["installed", "before 5.20"])
def test_trainer_never_divides_the_step_loss_by_the_accumulation_steps_again(rule, tmp_path):
    """compute_loss already divides by N, the loss tokens of the whole optimizer step: the Trainer must pass it to
    backward unchanged with gradient_accumulation_steps 2. transformers 5.20+ asks loss_is_scaled_for_ga; older
    releases (5.17 on GPU images) model_accepts_loss_kwargs, which was False for a draft and halved every gradient."""
    target = tiny_model("llama", vocab_size=96, layers=1)
    draft = tiny_model("llama", vocab_size=96, layers=1, seed=4).train()
    draft.accepts_loss_kwargs = False  # as an EAGLE-3 head's forward: no loss keywords
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, gradient_accumulation_steps=2)
    trainer = DistillTrainer(model=draft, target=target, args=args, distill=DistillConfig(chunk_size=5),
                             train_dataset=[], data_collator=DistillCollator(PAD))
    if rule != "installed":
        trainer.loss_is_scaled_for_ga = None  # 5.20+ then falls back to the older releases' rule
    (batch,), num_items = trainer.get_batch_samples(iter([text_batch()]), 1, torch.device("cpu"))
    trainer.current_gradient_accumulation_steps = 2
    expected = trainer.distill_sums(draft, batch).loss / num_items
    stepped = trainer.training_step(trainer.model, batch, num_items)
    torch.testing.assert_close(stepped, expected.detach(), rtol=1e-5, atol=1e-6)
