"""Models, trainer maths, acceptance callback and the whole run: recipe -> train -> acceptance -> export.

Integration tests (marked) run scripts/train.py on tiny models saved to a temporary folder: one process, two
processes (gloo on CPU) and a resumed run. Everything uses one CPU thread: tiny matmuls lose to threading.
"""
from __future__ import annotations

import contextlib
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, TrainerControl, TrainerState, TrainingArguments

from decode.inputs.vocab import TokenizerMismatchError
from distill.models import load
from distill.models.load import ModelSetupError, check_model_plan, draft_from_layers, load_draft, load_target
from distill.outputs.acceptance_log import ACCEPTANCE_LOG, read_records
from distill.publish.export import best_record
from distill.run.callbacks import AcceptanceCallback
from distill.run.trainer import DistillTrainer
from kinds import STANDALONE
from specdistill.recipes import EvalConfig, ModelConfig, load_recipe

from helpers import ROOT, SMOOTH_LOSS, TINY_RECIPE, accelerate_launch, assert_same_weights, cli_error, torchrun
from helpers import run_train as run
from tiny import TINY_TEXT, tiny_model, tiny_tokenizer

VOCAB = 320
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
LINES = [line for line in TINY_TEXT.split("\n\n")[:4]]


@contextlib.contextmanager
def single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def one_thread():
    with single_thread():
        yield


def trained_target(path: Path, steps: int = 60) -> Path:
    """A tiny Llama that has learnt TINY_TEXT (so its greedy continuations are text a draft can learn)."""
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    target = tiny_model("llama", vocab_size=VOCAB, hidden=64, layers=2).train()
    ids = torch.tensor(tokenizer(TINY_TEXT)["input_ids"])
    optimizer = torch.optim.AdamW(target.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        starts = torch.randint(0, len(ids) - 65, (8,), generator=generator)
        batch = torch.stack([ids[s:s + 65] for s in starts])  # [8, 65]
        target(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    target.eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """target/ (trained tiny Llama + tokenizer with a chat template), code.txt, chat.jsonl."""
    root = tmp_path_factory.mktemp("distill")
    with single_thread():
        trained_target(root / "target")
    (root / "code.txt").write_text(TINY_TEXT)
    # conversations of different lengths, so micro-batches hold different numbers of loss tokens
    rows = [{"messages": [{"role": "user", "content": f"show {i}"},
                          {"role": "assistant", "content": "\n".join(LINES[: 1 + i % 4])}]} for i in range(36)]
    (root / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def checkpoint_state(folder: Path) -> dict:
    return json.loads((folder / "trainer_state.json").read_text())


def losses(folder: Path) -> list[float]:
    return [entry["loss"] for entry in checkpoint_state(folder)["log_history"] if "loss" in entry]


# ---------------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gpt2"])
def test_draft_from_layers_copies_the_kept_layers(arch, tmp_path):
    target = tiny_model(arch, layers=3)
    draft = draft_from_layers(target, [0, 2], torch.float32)
    assert draft.config.num_hidden_layers == 2 and target.config.num_hidden_layers == 3
    target_state, draft_state = target.state_dict(), draft.state_dict()
    assert len(draft_state) < len(target_state)
    for key, value in draft_state.items():
        source = key.replace("layers.1.", "layers.2.").replace("h.1.", "h.2.")
        assert torch.equal(value, target_state[source]), key
    # all layers kept, in order: the very same function as the target
    full = draft_from_layers(target, [0, 1, 2], torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 7, 3]])
    assert torch.equal(full(ids).logits, target(ids).logits)
    # round-trips through save_pretrained / from_pretrained
    draft.save_pretrained(tmp_path / "draft")
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "draft").config.num_hidden_layers == 2


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gpt2"])
def test_final_hidden_states_give_the_models_logits(arch):
    """What DistillTrainer relies on: hidden_states[-1] (draft) and base_model's last_hidden_state (target) are
    the normed states that the lm_head turns into the model's logits."""
    model = tiny_model(arch, layers=2)
    ids = torch.tensor([[1, 5, 9, 7, 3, 8]])
    logits = model(ids).logits  # [1, T, V]
    hidden = model(ids, output_hidden_states=True, logits_to_keep=1).hidden_states[-1]  # [1, T, H]
    torch.testing.assert_close(model.get_output_embeddings()(hidden), logits)
    base = model.base_model(input_ids=ids).last_hidden_state  # [1, T, H]
    torch.testing.assert_close(model.get_output_embeddings()(base), logits)


def test_target_is_frozen_and_drafts_are_trainable(workdir):
    cfg = ModelConfig(target=str(workdir / "target"), draft_config={"num_hidden_layers": 1})
    target = load_target(cfg)
    assert not target.training and not any(p.requires_grad for p in target.parameters())
    draft = load_draft(cfg, target)
    assert draft.training and all(p.requires_grad for p in draft.parameters())
    assert draft.config.num_hidden_layers == 1 and draft.config.hidden_size == target.config.hidden_size
    layered = load_draft(ModelConfig(target=cfg.target, draft_layers=[1]), target)
    assert torch.equal(layered.model.layers[0].mlp.up_proj.weight, target.model.layers[1].mlp.up_proj.weight)


def test_model_plan_errors_come_from_configs_alone(workdir, caplog):
    tokenizer = tiny_tokenizer()
    target = str(workdir / "target")
    with pytest.raises(ModelSetupError, match=r"layer 5 does not exist; the target has 2 layers \(0\.\.1\)"):
        check_model_plan(ModelConfig(target=target, draft_layers=[0, 5]), tokenizer)
    with pytest.raises(ModelSetupError, match="'num_hiden_layers' is not a key .* did you mean 'num_hidden_layers'"):
        check_model_plan(ModelConfig(target=target, draft_config={"num_hiden_layers": 1}), tokenizer)
    with pytest.raises(ModelSetupError, match="vocabulary .* smaller than the tokenizer"):
        check_model_plan(ModelConfig(target=target, draft_config={"vocab_size": 100}), tokenizer)
    with caplog.at_level(logging.WARNING, logger="distill.models.load"):
        check_model_plan(ModelConfig(target=target, draft_config={"num_hidden_layers": 4}), tokenizer)
    assert "more parameters" in caplog.text


def test_incompatible_draft_tokenizer_is_refused(workdir, tmp_path):
    other = tiny_tokenizer(text="completely different text " * 50 + TINY_TEXT[:100])
    draft = tiny_model("llama", vocab_size=VOCAB, hidden=32, layers=1)
    draft.save_pretrained(tmp_path / "draft")
    other.save_pretrained(tmp_path / "draft")
    cfg = ModelConfig(target=str(workdir / "target"), draft=str(tmp_path / "draft"))
    with pytest.raises(TokenizerMismatchError):
        check_model_plan(cfg, tiny_tokenizer())


# ---------------------------------------------------------------------------------------------------------------
# Acceptance callback (fake evaluator)
# ---------------------------------------------------------------------------------------------------------------

class FakeEvaluate:
    """Stands in for decode.measure.evaluate.evaluate_acceptance: scores rise with each call;
    records the draft's mode."""

    def __init__(self):
        self.calls, self.modes = 0, []

    def __call__(self, target, draft, prompts, settings, progress=True, cost_ratios=None, **by_category):
        self.calls += 1
        self.modes.append(draft.training)
        self.by_category = by_category
        # as evaluate_acceptance does: the caller's cost ratios and the predicted speedup in every row
        return [{"gamma": g, "temperature": settings.temperature, "acceptance_rate": 0.1 * self.calls,
                 "mean_accepted_tokens": 1.0 + self.calls, "speedup": 1.0 + 0.1 * self.calls * (g == 2),
                 "draft_cost_ratio": cost_ratios[g].draft_cost_ratio,
                 "verify_cost_ratio": cost_ratios[g].verify_cost_ratio,
                 "predicted_speedup": cost_ratios[g].predicted_speedup(1.0 + self.calls, g)}
                for g in settings.gammas]


def test_callback_records_each_checkpoint_and_protects_the_best(tmp_path):
    evaluate = FakeEvaluate()
    cfg = EvalConfig(gammas=[1, 2], temperatures=[0.0, 1.0])
    draft = tiny_model("llama", layers=1).train()
    callback = AcceptanceCallback(target=tiny_model("llama"), prompts=[torch.tensor([1, 2, 3])], cfg=cfg,
                                  kind=STANDALONE, evaluate=evaluate)
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none")
    state, control = TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control)
    for step in (2, 4):
        state.global_step = step
        (tmp_path / f"checkpoint-{step}").mkdir()
        callback.on_save(args, state, control, model=draft)
    callback.measure_remaining(args, state, draft)  # after training: step 4 already measured, no new lines
    records = read_records(tmp_path)
    assert len(records) == 2 * 2 * 2 and evaluate.calls == 4  # 2 checkpoints x 2 temperatures x 2 gammas
    assert {r["checkpoint"] for r in records} == {"checkpoint-2", "checkpoint-4"}
    assert all(set(r) >= {"step", "checkpoint", "gamma", "temperature", "acceptance_rate"} for r in records)
    assert evaluate.modes == [False] * 4 and draft.training  # eval mode while measured, train mode after
    best = best_record(records, 0.0)
    # the cost ratios are measured once per temperature: every record of a (temperature, gamma) carries the same;
    # the best is the highest tau / (gamma * c + v), i.e. checkpoint-4 (higher tau), at the gamma the cost model
    # prefers
    costs = {(t, g): {(r["draft_cost_ratio"], r["verify_cost_ratio"]) for r in records
                      if (r["temperature"], r["gamma"]) == (t, g)} for t in (0.0, 1.0) for g in (1, 2)}
    assert all(len(c) == 1 for c in costs.values())
    costs = {g: c for (t, g), c in costs.items() if t == 0.0}
    predicted = {g: 4.0 / (g * c + v) for g, ((c, v),) in costs.items()}  # tau 4: the 3rd call
    assert (best["checkpoint"], best["gamma"]) == ("checkpoint-4", max(predicted, key=predicted.get))
    assert state.best_model_checkpoint == str(tmp_path / "checkpoint-4")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path / "runs" / "acceptance"))
    events.Reload()
    assert "acceptance/temperature0.0/gamma2/acceptance_rate" in events.Tags()["scalars"]
    assert evaluate.by_category == {}  # no prompt has a category: evaluate is called as before
    categorized = AcceptanceCallback(target=tiny_model("llama"), prompts=[torch.tensor([1, 2])] * 2, cfg=cfg,
                                     kind=STANDALONE, evaluate=evaluate, tensorboard=False, categories=["code", None])
    categorized.measure(draft)
    assert evaluate.by_category == {"categories": ["code", None]}
    # a resumed run at step 2 forgets what an abandoned later part of the run measured
    state.global_step = 2
    callback.on_train_begin(args, state, control)
    assert {r["step"] for r in read_records(tmp_path)} == {2}


def test_cost_ratios_are_measured_under_each_temperature_and_reused_on_resume(tmp_path, monkeypatch):
    """Sampling adds work to every step, so c and v are measured per (temperature, gamma) with that temperature's
    sampling settings, once per run; a resumed run takes them from its log, and measures again if one is missing."""
    import distill.run.callbacks as callbacks
    from decode.loop.speedup import CostRatios

    calls = []

    def fake_measure(target, draft, prompt, gamma, sampling, **kwargs):
        calls.append((sampling.temperature, sampling.top_k, gamma))
        return CostRatios(0.1 * gamma, 1.0 + sampling.temperature)

    monkeypatch.setattr(callbacks, "measure_cost_ratios", fake_measure)
    cfg = EvalConfig(gammas=[1, 2], temperatures=[0.0, 1.0], top_k=5)
    callback = AcceptanceCallback(target=tiny_model("llama"), prompts=[torch.tensor([1, 2, 3])], cfg=cfg,
                                  kind=STANDALONE, evaluate=FakeEvaluate(), tensorboard=False)
    records = callback.measure(tiny_model("llama", layers=1))
    assert sorted(calls) == [(0.0, 5, 1), (0.0, 5, 2), (1.0, 5, 1), (1.0, 5, 2)]
    assert {(r["temperature"], r["gamma"], r["verify_cost_ratio"]) for r in records} == {
        (0.0, 1, 1.0), (0.0, 2, 1.0), (1.0, 1, 2.0), (1.0, 2, 2.0)}
    callback.measure(tiny_model("llama", layers=1))
    assert len(calls) == 4  # once per run
    logged = callbacks.logged_cost_ratios(records, cfg.gammas, cfg.temperatures)
    assert logged == {(0.0, 1): CostRatios(0.1, 1.0), (0.0, 2): CostRatios(0.2, 1.0),
                      (1.0, 1): CostRatios(0.1, 2.0), (1.0, 2): CostRatios(0.2, 2.0)}
    assert callbacks.logged_cost_ratios([r for r in records if r["temperature"] == 0.0], cfg.gammas,
                                        cfg.temperatures) is None  # T=1's are missing: measured again


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN is not built into torch")
def test_checkpoints_are_measured_on_packed_layers_tuned_once_per_run(monkeypatch):
    """Eager on CPU the target and the draft decode on oneDNN-packed layers while measured (specdistill-eval's
    default), tuned at the token counts up to the largest gamma + 1 at the first measurement only; the draft goes
    back to training as its own nn.Linear layers. Compiled measurements keep F.linear, as --compile does."""
    import decode.loop.packed_linear as packed_linear
    import distill.run.callbacks as callbacks
    from decode.loop.packed_linear import PackedLinear, packed_layers
    from decode.loop.speedup import CostRatios

    seen, tuned = [], []
    monkeypatch.setattr(callbacks, "measure_cost_ratios", lambda *a, **k: CostRatios(0.1, 1.0))
    real_tune = packed_linear.tune_plain_rows

    def tune(model, rows, rounds=5):
        tuned.append(list(rows))
        return real_tune(model, rows, rounds=1)

    monkeypatch.setattr(packed_linear, "tune_plain_rows", tune)

    class Looking(FakeEvaluate):
        def __call__(self, target, draft, prompts, settings, **kwargs):
            seen.append((isinstance(target.lm_head, PackedLinear), isinstance(draft.lm_head, PackedLinear)))
            return super().__call__(target, draft, prompts, settings, **kwargs)

    target, draft = tiny_model("llama"), tiny_model("llama", layers=1).train()
    head = draft.lm_head
    callback = AcceptanceCallback(target=target, prompts=[torch.tensor([1, 2, 3])], cfg=EvalConfig(gammas=[1, 3]),
                                  kind=STANDALONE, evaluate=Looking(), tensorboard=False)
    callback.measure(draft)
    callback.measure(draft)
    assert seen == [(True, True)] * 2 and tuned == [[1, 2, 3, 4]] * 2  # target and draft, at the first one only
    assert callback.plain_rows is not None and len(callback.plain_rows) == 2
    assert draft.lm_head is head and not packed_layers(draft) and not packed_layers(target)
    compiled = AcceptanceCallback(target=target, prompts=[torch.tensor([1, 2, 3])],
                                  cfg=EvalConfig(gammas=[1], compile=True), kind=STANDALONE, evaluate=Looking(),
                                  tensorboard=False)
    compiled.measure(draft)
    assert seen[-1] == (False, False)


# ---------------------------------------------------------------------------------------------------------------
# Bad input: one-line errors before any weights are loaded
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture
def no_weights(monkeypatch):
    """Fails the test if the script gets as far as loading model weights."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("model weights were loaded before the error")
    monkeypatch.setattr(load, "load_target", refuse)


def test_cli_unknown_key_and_wrong_type(monkeypatch, capsys, no_weights, workdir):
    message = cli_error(monkeypatch, capsys, TINY_RECIPE, "train.max_step=3")
    assert "train.max_step" in message and "did you mean 'train.max_steps'" in message
    message = cli_error(monkeypatch, capsys, TINY_RECIPE, f"model.target={workdir / 'target'}",
                        "data.dataset=x.txt", "train.per_device_train_batch_size=two")
    assert "train.per_device_train_batch_size" in message and "'two'" in message and "an integer" in message


def test_cli_resume_without_checkpoint_and_bad_repo_id(monkeypatch, capsys, no_weights, workdir, tmp_path):
    common = (TINY_RECIPE, f"model.target={workdir / 'target'}", f"data.dataset={workdir / 'code.txt'}")
    message = cli_error(monkeypatch, capsys, *common, "train.resume_from_checkpoint=true",
                        f"train.output_dir={tmp_path}")
    assert f"{tmp_path} holds no checkpoint-* folder" in message
    message = cli_error(monkeypatch, capsys, *common, "hub.push_to_hub=true", "hub.repo_id=no-slash")
    assert "hub.repo_id" in message and "'no-slash'" in message


def test_cli_missing_target_folder(monkeypatch, capsys, tmp_path):
    message = cli_error(monkeypatch, capsys, TINY_RECIPE, f"model.target={tmp_path / 'no_target'}",
                        "data.dataset=x.txt")
    assert f"model.target: no such folder: {tmp_path / 'no_target'}" in message


def test_cli_missing_dataset_and_no_usable_rows(monkeypatch, capsys, no_weights, workdir, tmp_path):
    target = f"model.target={workdir / 'target'}"
    message = cli_error(monkeypatch, capsys, TINY_RECIPE, target, f"data.dataset={tmp_path / 'missing.txt'}",
                        f"train.output_dir={tmp_path / 'out'}")
    assert f"file not found: {tmp_path / 'missing.txt'}" in message
    (tmp_path / "short.txt").write_text("a\nb\nc\nd\ne\nf\n")
    message = cli_error(monkeypatch, capsys, TINY_RECIPE, target, f"data.dataset={tmp_path / 'short.txt'}",
                        f"train.output_dir={tmp_path / 'out'}")
    assert "no usable rows" in message and "64-token block" in message


def test_cli_incompatible_tokenizers(monkeypatch, capsys, no_weights, workdir, tmp_path):
    draft = tiny_model("llama", vocab_size=VOCAB, hidden=32, layers=1)
    draft.save_pretrained(tmp_path / "draft")
    tiny_tokenizer(text="another corpus entirely " * 40).save_pretrained(tmp_path / "draft")
    message = cli_error(monkeypatch, capsys, TINY_RECIPE, f"model.target={workdir / 'target'}",
                        f"data.dataset={workdir / 'code.txt'}", "model.draft_config=null",
                        f"model.draft={tmp_path / 'draft'}", f"train.output_dir={tmp_path / 'out'}")
    assert "does not match target tokenizer" in message


# ---------------------------------------------------------------------------------------------------------------
# Whole runs
# ---------------------------------------------------------------------------------------------------------------

def mean_acceptance(records: list[dict], step: int) -> float:
    rates = [r["acceptance_rate"] for r in records if r["step"] == step]
    return sum(rates) / len(rates)


@pytest.mark.integration
def test_distillation_raises_acceptance_and_exports_a_working_assistant(workdir):
    out = run(workdir, "run")
    records = read_records(out)
    steps = sorted({r["step"] for r in records})
    assert steps == [4, 8, 12, 16, 20, 24]
    first, last = mean_acceptance(records, steps[0]), mean_acceptance(records, steps[-1])
    assert last > first + 0.2, (first, last)
    assert all(r["greedy_match"] == 1.0 for r in records)  # speculative greedy decoding stays lossless

    results = json.loads((out / "train_results.json").read_text())
    best = best_record(records, 0.0)
    assert results["best"]["checkpoint"] == best["checkpoint"] and results["best"]["gamma"] == best["gamma"]
    assert (out / best["checkpoint"]).is_dir()  # never rotated out by save_total_limit
    assert load_recipe(out / "recipe.yaml").train.output_dir == str(out)

    draft = AutoModelForCausalLM.from_pretrained(out).eval()
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert draft.generation_config.num_assistant_tokens == best["gamma"]
    assert draft.generation_config.assistant_confidence_threshold == 0.0
    exported = load_file(out / "model.safetensors")
    saved = load_file(out / best["checkpoint"] / "model.safetensors")
    assert all(torch.equal(exported[k], saved[k]) for k in saved)
    target = AutoModelForCausalLM.from_pretrained(workdir / "target").eval()
    prompt = torch.tensor([[1, 50, 60, 70]])
    plain = target.generate(prompt, do_sample=False, max_new_tokens=20, pad_token_id=0)
    assisted = target.generate(prompt, assistant_model=draft, do_sample=False, max_new_tokens=20, pad_token_id=0)
    assert torch.equal(plain, assisted)

    logged = checkpoint_state(out / f"checkpoint-{steps[-1]}")["log_history"]
    train_logs = [entry for entry in logged if "loss" in entry]
    assert all({"kd", "tv", "ce", "learning_rate", "tokens_per_s", "grad_norm"} <= set(e) for e in train_logs)
    assert train_logs[-1]["kd"] < train_logs[0]["kd"] and train_logs[-1]["tv"] < train_logs[0]["tv"]
    assert any((out / "runs").glob("*/events.out.tfevents.*"))


# Conversations of 1..4 code blocks: micro-batches hold different numbers of loss tokens, so a mean per micro-batch
# (instead of per token of the optimizer step) would not match the one-big-batch reference.
CHAT_RUN = ("data.dataset={chat}", "data.format=chat", "data.max_length=48", "data.num_eval_prompts=0",
            "train.max_steps=4", "train.logging_steps=1", "train.save_steps=4", "train.per_device_train_batch_size=3",
            "train.learning_rate=3e-3", "train.report_to=[]", SMOOTH_LOSS)


def chat_run_args(workdir: Path) -> list[str]:
    return [a.format(chat=workdir / "chat.jsonl") for a in CHAT_RUN]


@pytest.fixture(scope="module")
def one_big_batch(workdir) -> Path:
    """The reference: 1 process, all 6 rows of an optimizer step in one micro-batch (per-token mean over them)."""
    with single_thread():
        return run(workdir, "one_batch", *chat_run_args(workdir), "train.per_device_train_batch_size=6")


@pytest.mark.integration
def test_two_processes_match_one_process_with_double_accumulation(workdir, one_big_batch):
    args = chat_run_args(workdir)
    single = run(workdir, "one_process", *args, "train.gradient_accumulation_steps=2")
    big, two = one_big_batch, workdir / "two_processes"
    accelerate_launch(ROOT / "scripts" / "train.py", TINY_RECIPE, f"model.target={workdir / 'target'}",
                      f"train.output_dir={two}", *args, "train.gradient_accumulation_steps=1", timeout=300)

    reference = losses(big / "checkpoint-4")
    assert len(reference) == 4
    assert losses(single / "checkpoint-4") == pytest.approx(reference, rel=2e-5)
    assert losses(two / "checkpoint-4") == pytest.approx(reference, rel=2e-5)
    for folder in (single, two):
        assert_same_weights(big / "model.safetensors", folder / "model.safetensors")


@pytest.mark.integration
def test_push_to_hub_gets_the_exported_folder(workdir, monkeypatch):
    import distill.publish.hub
    pushed = []
    monkeypatch.setattr(distill.publish.hub, "push_to_hub", lambda folder, **kwargs: pushed.append((folder, kwargs)))
    out = run(workdir, "pushed", "train.max_steps=2", "train.save_steps=2", "data.num_eval_prompts=1",
              "eval.gammas=[2]", "hub.push_to_hub=true", "hub.repo_id=someone/tiny-draft", "hub.private=false")
    [(folder, kwargs)] = pushed
    assert (folder, {key: value for key, value in kwargs.items() if key != "card"}) == (
        out, {"repo_id": "someone/tiny-draft", "private": False, "step": 2})
    assert kwargs["card"] == STANDALONE.card  # the card text of the recipe's kind, handed down


@pytest.mark.integration
def test_cross_entropy_only_never_runs_the_target(workdir, monkeypatch):
    def refuse(self, inputs):
        raise AssertionError("the target ran for loss ce")
    monkeypatch.setattr(DistillTrainer, "target_hidden_states", refuse)
    out = run(workdir, "ce_only", "distill.loss=ce", "model.draft_config={}", "data.num_eval_prompts=0",
              "train.max_steps=2", "train.logging_steps=1", "train.report_to=[]")
    logs = [e for e in checkpoint_state(out / "checkpoint-2")["log_history"] if "loss" in e]
    assert logs and all(e["loss"] == pytest.approx(e["ce"], rel=1e-5) for e in logs)
    assert not any("kd" in e or "tv" in e for e in logs)  # no distribution to compare with: not logged as a 0
    results = json.loads((out / "train_results.json").read_text())
    assert results["best"]["checkpoint"] == "final"
    assert results["deploy_check"]["passed"] is True, results["deploy_check"]  # specdistill-check on the export


# DeepSpeed on CPU needs its process group set up with gloo before TrainingArguments (docs: shared/ENVIRONMENT.md);
# on GPUs `accelerate launch --config_file <deepspeed config>` needs none of this.
DEEPSPEED_ON_CPU = """
import functools, os, sys
os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
from accelerate import PartialState
PartialState(backend="gloo")
import distill.recipe.train_config
config = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto",
          "gradient_accumulation_steps": "auto", "train_batch_size": "auto", "gradient_clipping": "auto"}
distill.recipe.train_config.TrainingArguments = functools.partial(
    distill.recipe.train_config.TrainingArguments, accelerator_config={"use_configured_state": True}, deepspeed=config)
from specdistill.cli import train
train.cli(sys.argv[1:])  # as scripts/train.py: a finished process leaves before the teardown (launch.py)
"""


@pytest.mark.integration
def test_deepspeed_zero2_on_two_processes_matches_one_big_batch(workdir, one_big_batch, tmp_path):
    args, big = chat_run_args(workdir), one_big_batch
    launcher = tmp_path / "deepspeed_on_cpu.py"
    launcher.write_text(DEEPSPEED_ON_CPU)
    out = tmp_path / "zero2"
    torchrun(launcher, TINY_RECIPE, f"model.target={workdir / 'target'}", f"train.output_dir={out}", *args,
             timeout=300)
    assert losses(out / "checkpoint-4") == pytest.approx(losses(big / "checkpoint-4"), rel=2e-5)
    assert_same_weights(big / "model.safetensors", out / "model.safetensors")


@pytest.mark.integration
def test_resume_continues_the_same_run(workdir, monkeypatch):
    common = ("data.num_eval_prompts=0", "train.max_steps=6", "train.save_steps=3", "train.logging_steps=1",
              "train.lr_scheduler_type=cosine", "train.report_to=[]", "train.save_total_limit=null")
    whole = run(workdir, "whole", *common)
    resumed = workdir / "resumed"
    resumed.mkdir()
    shutil.copytree(whole / "checkpoint-3", resumed / "checkpoint-3")  # a run interrupted after step 3
    micro_batches = []
    original = DistillTrainer.compute_loss

    def counting(self, *args, **kwargs):
        micro_batches.append(self.state.global_step)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DistillTrainer, "compute_loss", counting)
    run(workdir, "resumed", *common, "train.resume_from_checkpoint=true")
    assert micro_batches == [3, 4, 5]  # only the steps after the checkpoint were trained
    assert losses(resumed / "checkpoint-6") == pytest.approx(losses(whole / "checkpoint-6"), rel=1e-5)
    assert_same_weights(whole / "model.safetensors", resumed / "model.safetensors")
    assert not (resumed / ACCEPTANCE_LOG).read_text()  # no prompts: nothing measured, the file is still there


def test_log_sums_add_by_name_reduce_once_and_start_again():
    """The trainers' named log accumulators: sums by name, one all-reduce over processes, zero after a log."""
    from distill.run.trainer import LogSums

    class TwoProcesses:  # accelerate's reduce over 2 processes holding the same sums
        num_processes, reduced = 2, 0

        def reduce(self, tensor, reduction):
            assert reduction == "sum"
            self.reduced += 1
            return tensor * 2

    sums = LogSums(["kd", "tokens", "rows"], "cpu")
    sums.add(kd=torch.tensor(1.5), tokens=3)
    sums.add(tokens=torch.tensor(4), kd=0.25)
    accelerator = TwoProcesses()
    assert sums.take(accelerator) == {"kd": 3.5, "tokens": 14.0, "rows": 0.0} and accelerator.reduced == 1
    assert sums.values.tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(KeyError):
        sums.add(typo=1.0)
