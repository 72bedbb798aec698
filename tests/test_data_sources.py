"""Where the training rows come from: the dataset, the target's responses, the draft's own samples (on-policy), and
the cached teacher; each end to end through scripts/train.py on tiny models, plus the bad inputs.

Integration tests (marked) run specdistill.cli.train.main() in this process (and one 2-process launch) on a tiny Llama
target saved to a temporary folder; the rest are unit tests of the pieces.
"""
from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments

import distill.data.target_data as target_data
from decode import autoregressive_generate
from decode.loop.sampling import SamplingConfig
from distill.data.dataset import build_data
from distill.data.onpolicy import (
    OnPolicySettings,
    micro_batch_generator,
    on_policy_batch,
    prompt_length,
    sample_continuations,
    select_rows,
)
from distill.data.rows import IGNORE_INDEX, DistillCollator
from distill.data.sources import mix_sources
from distill.data.target_data import load_target_data
from distill.models import load
from distill.run.trainer import DistillTrainer
from distill.utils import eval_mode
from specdistill.recipes import DataConfig, DistillConfig, RecipeError, load_recipe

from helpers import ROOT, TINY_RECIPE, accelerate_launch, cli_error
from helpers import run_train as run
from tiny import TINY_TEXT, tiny_model, tiny_tokenizer

VOCAB = 320
EOS, PAD = 2, 0
# short runs, nothing measured (the acceptance callback would run the target)
QUICK = ("data.num_eval_prompts=0", "train.max_steps=2", "train.logging_steps=1", "train.save_steps=2",
         "train.report_to=[]")


# ---------------------------------------------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """target/ (tiny Llama + tokenizer), other_target/ (other weights, same tokenizer), other_tokenizer/ (the
    target's weights with another tokenizer) and code.txt."""
    root = tmp_path_factory.mktemp("sources")
    tokenizer = tiny_tokenizer(VOCAB)
    for name, seed, tok in (("target", 0, tokenizer), ("other_target", 5, tokenizer),
                            ("other_tokenizer", 0, tiny_tokenizer(VOCAB, text="another corpus entirely " * 40))):
        tiny_model("llama", seed=seed, vocab_size=VOCAB, hidden=32, layers=2).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    (root / "code.txt").write_text(TINY_TEXT)
    return root


def logged(out: Path, key: str) -> list[float]:
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    return [entry[key] for entry in state["log_history"] if key in entry and "train_runtime" not in entry]


class TargetForwards:
    """Counts forward passes of the target's base model (every use of the target goes through it), split into
    those before trainer.train() and those during it."""

    def __init__(self, monkeypatch):
        self.calls, self.during_training = 0, None
        load_target, train = load.load_target, DistillTrainer.train

        def counted_target(cfg):
            model = load_target(cfg)
            model.base_model.register_forward_pre_hook(self._count)
            return model

        def counted_train(trainer, *args, **kwargs):
            before = self.calls
            try:
                return train(trainer, *args, **kwargs)
            finally:
                self.during_training = self.calls - before

        monkeypatch.setattr(load, "load_target", counted_target)
        monkeypatch.setattr(DistillTrainer, "train", counted_train)

    def _count(self, *_args):
        self.calls += 1


def greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy decoding (an independent reference), eos kept."""
    ids = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=EOS,
                         pad_token_id=PAD)
    return ids[0, len(prompt):].tolist()


def draft_samples(draft, prompt: list[int], max_new_tokens: int, temperature: float, seed: int) -> list[int]:
    """The draft's own sample (decode's single-sequence sampler) for one prompt and seed."""
    generator = torch.Generator().manual_seed(seed)
    return autoregressive_generate(draft, torch.tensor([prompt]), max_new_tokens=max_new_tokens,
                                   temperature=temperature, eos_token_id=EOS, generator=generator).new_tokens


# ---------------------------------------------------------------------------------------------------------------
# Recipe keys: bad values are named
# ---------------------------------------------------------------------------------------------------------------

REQUIRED = ("model.target=t", "data.dataset=x.txt")


@pytest.mark.parametrize("value", ["-0.1", "1.5"])
def test_lambda_outside_0_1_is_refused_naming_the_key(value):
    with pytest.raises(RecipeError, match=r"distill\.on_policy_fraction: got .*; allowed: a finite number in \[0, 1\]"):
        load_recipe(TINY_RECIPE, [*REQUIRED, f"distill.on_policy_fraction={value}"])


@pytest.mark.parametrize("overrides, key, allowed", [
    (("data.dataset_weight=0",), "data.target_weight", "data.dataset_weight + data.target_weight > 0"),
    (("data.dataset_weight=-1", "data.target_weight=2"), "data.dataset_weight", ">= 0"),
    (("data.target_weight=0.5",), "data.target_data_dir", "a folder"),
    (("data.target_top_p=0",), "data.target_top_p", "(0, 1]"),
    (("data.target_batch_size=0",), "data.target_batch_size", "an integer > 0"),
    (("data.target_gamma=4", "data.target_batch_size=8"), "data.target_batch_size", "1 with data.target_gamma"),
    (("distill.teacher_cache=c", "distill.temperature=2"), "distill.temperature", "1.0 with distill.teacher_cache"),
    (("distill.teacher_cache=c", "distill.on_policy_fraction=0.5"), "distill.on_policy_fraction", "0 with"),
    (("distill.on_policy_fraction=0.5", "distill.loss=ce"), "distill.on_policy_fraction", "loss ce"),
    (("distill.teacher_topk=0",), "distill.teacher_topk", "> 0"),
    (("data.loss_tokens=all", "distill.on_policy_fraction=0.5"), "data.loss_tokens",
     "assistant with distill.on_policy_fraction > 0"),
    (("data.loss_tokens=prompt",), "data.loss_tokens", "one of 'assistant', 'all'"),
])
def test_bad_source_settings_are_named(overrides, key, allowed):
    with pytest.raises(RecipeError) as err:
        load_recipe(TINY_RECIPE, [*REQUIRED, *overrides])
    assert key in str(err.value) and allowed in str(err.value), str(err.value)


def test_k_larger_than_the_vocabulary_stops_before_any_weights(monkeypatch, capsys, workdir, tmp_path):
    monkeypatch.setattr(load, "load_target", lambda *a: pytest.fail("weights were loaded"))
    message = cli_error(monkeypatch, capsys, TINY_RECIPE, f"model.target={workdir / 'target'}",
                        f"data.dataset={workdir / 'code.txt'}", f"distill.teacher_cache={tmp_path / 'cache'}",
                        f"distill.teacher_topk={VOCAB + 1}")
    assert f"distill.teacher_topk: got {VOCAB + 1}; allowed: an integer in [1, {VOCAB}]" in message
    assert not (tmp_path / "cache").exists()


# ---------------------------------------------------------------------------------------------------------------
# Mixing the dataset and the target's responses
# ---------------------------------------------------------------------------------------------------------------

def source_rows(source: int, n: int) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"input_ids": [[source, i] for i in range(n)],
                                       "labels": [[IGNORE_INDEX, i] for i in range(n)]})


def test_sources_are_mixed_row_by_row_in_proportion_to_their_weights():
    dataset, target = source_rows(0, 4000), source_rows(1, 4000)
    cfg = DataConfig(dataset="x.txt", dataset_weight=3.0, target_weight=1.0, target_data_dir="d")
    mixed = mix_sources(dataset, target, cfg, seed=0)
    sources = [ids[0] for ids in mixed["input_ids"]]
    share = sum(sources) / len(sources)
    # binomial: the target's share is 1/4 within 5 standard deviations
    assert abs(share - 0.25) < 5 * (0.25 * 0.75 / len(sources)) ** 0.5, share
    assert len(set(map(tuple, mixed["input_ids"]))) == len(mixed)  # no row drawn twice
    assert mixed["input_ids"] == mix_sources(dataset, target, cfg, seed=0)["input_ids"]  # seeded
    assert mixed["input_ids"] != mix_sources(dataset, target, cfg, seed=1)["input_ids"]
    only_target = DataConfig(dataset="x.txt", dataset_weight=0.0, target_weight=1.0, target_data_dir="d")
    assert mix_sources(dataset, target, only_target, seed=0) is target
    assert mix_sources(dataset, None, DataConfig(dataset="x.txt"), seed=0) is dataset


def packed_blocks(workdir: Path) -> datasets.Dataset:
    """The training blocks of code.txt under the tiny recipe's data settings (no held-out prompts, as in QUICK)."""
    cfg = DataConfig(dataset=str(workdir / "code.txt"), max_length=load_recipe(
        TINY_RECIPE, [f"model.target={workdir / 'target'}", f"data.dataset={workdir / 'code.txt'}"]).data.max_length,
        num_eval_prompts=0)
    return build_data(cfg, AutoTokenizer.from_pretrained(workdir / "target")).train


@pytest.mark.integration
def test_target_responses_end_to_end_and_reused_by_a_second_run(workdir, monkeypatch, rows_seen):
    settings = ("data.dataset_weight=0", "data.target_weight=1", f"data.target_data_dir={workdir / 'responses'}",
                "data.prompt_tokens=6", "data.target_max_new_tokens=10", "data.target_gamma=3", *QUICK)
    run(workdir, "target_rows", *settings)

    # every training row is a prompt (the block's first 6 tokens) + the target's greedy continuation of it,
    # generated by the speculative decoder and equal to transformers' own greedy decoding of the target
    target = AutoModelForCausalLM.from_pretrained(workdir / "target").eval()
    responses = load_target_data(workdir / "responses")
    rows = rows_seen[0]
    assert len(rows) == len(responses) == len(packed_blocks(workdir)) > 0  # one response per training block
    assert sum(len(r) for r in responses["response_ids"]) > 5 * len(responses)  # real responses, not eos at once
    for row, response in zip(rows, responses):
        prompt = response["prompt_ids"]
        assert len(prompt) == 6 and response["response_ids"] == greedy(target, prompt, 10)
        assert row["input_ids"] == prompt + response["response_ids"]
        assert row["labels"] == [IGNORE_INDEX] * 6 + response["response_ids"]

    # a second run reads the stored responses: the target generates nothing
    monkeypatch.setattr(target_data, "generate_response", lambda *a: pytest.fail("responses were regenerated"))
    run(workdir, "target_rows_again", *settings)
    assert rows_seen[1]["input_ids"] == rows["input_ids"]


@pytest.mark.integration
def test_dataset_and_target_rows_mixed_in_one_run(workdir, rows_seen, monkeypatch):
    batch_sizes, real = [], target_data.batched_generate
    monkeypatch.setattr(target_data, "batched_generate",
                        lambda model, prompts, **kw: batch_sizes.append(len(prompts)) or real(model, prompts, **kw))
    run(workdir, "mixed", "data.dataset_weight=1", "data.target_weight=1", "data.prompt_tokens=6",
        f"data.target_data_dir={workdir / 'responses_mixed'}", "data.target_max_new_tokens=10",
        "data.target_batch_size=4", *QUICK)
    assert max(batch_sizes) == 4 and sum(batch_sizes) == len(load_target_data(workdir / "responses_mixed"))
    prompted = [row[0] == IGNORE_INDEX for row in rows_seen[0]["labels"]]  # target rows mask their prompt
    assert any(prompted) and not all(prompted)  # text blocks are trained from their first token


@pytest.mark.integration
def test_loss_tokens_all_trains_on_the_prompts_of_target_rows_too(workdir, monkeypatch):
    from kinds import kind_named

    seen = []  # (rows, collator) of each run

    class Recording(DistillTrainer):
        def __init__(self, *args, **kwargs):
            seen.append((kwargs["train_dataset"], kwargs["data_collator"]))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(kind_named("standalone"), "trainer", lambda: Recording)
    settings = ("data.dataset_weight=0", "data.target_weight=1", f"data.target_data_dir={workdir / 'responses_all'}",
                "data.prompt_tokens=6", "data.target_max_new_tokens=10", *QUICK)
    run(workdir, "prompt_masked", *settings)
    run(workdir, "every_token", *settings, "data.loss_tokens=all")
    (rows, masked), (same_rows, every) = seen
    assert rows["input_ids"] == same_rows["input_ids"] and rows["labels"] == same_rows["labels"]
    examples = [rows[i] for i in range(len(rows))]
    assert all(r["labels"][:6] == [IGNORE_INDEX] * 6 for r in examples)  # target rows mask their prompt
    by_default, with_all = masked(examples), every(examples)
    assert torch.equal(by_default["labels"], DistillCollator(PAD)(examples)["labels"])
    real = with_all["attention_mask"].bool()
    assert torch.equal(with_all["labels"][real], with_all["input_ids"][real])  # the prompt tokens are targets too
    assert (with_all["labels"][~real] == IGNORE_INDEX).all()
    assert (with_all["labels"] != IGNORE_INDEX).sum() > (by_default["labels"] != IGNORE_INDEX).sum()


# ---------------------------------------------------------------------------------------------------------------
# Cached teacher
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cached_run(workdir):
    """A run from a full-width (k = V) float32 cache, with the target's forward passes counted."""
    monkeypatch = pytest.MonkeyPatch()
    try:
        forwards = TargetForwards(monkeypatch)
        out = run(workdir, "cached", f"distill.teacher_cache={workdir / 'cache'}", f"distill.teacher_topk={VOCAB}",
                  "distill.teacher_cache_dtype=float32", *QUICK)
        return out, forwards
    finally:
        monkeypatch.undo()


@pytest.mark.integration
def test_training_from_the_cache_never_runs_the_target(cached_run, workdir, monkeypatch):
    out, forwards = cached_run
    assert forwards.calls > 0 and forwards.during_training == 0  # the cache was built, then never the target
    metadata = json.loads((workdir / "cache" / "teacher_cache.json").read_text())
    assert metadata["complete"] and metadata["k"] == VOCAB and metadata["num_rows"] == len(packed_blocks(workdir))
    # a second run reuses the cache: not one forward pass of the target, and the same losses
    again = TargetForwards(monkeypatch)
    out_again = run(workdir, "cached_again", f"distill.teacher_cache={workdir / 'cache'}",
                    f"distill.teacher_topk={VOCAB}", "distill.teacher_cache_dtype=float32", *QUICK)
    assert again.calls == 0
    assert logged(out_again, "loss") == logged(out, "loss")


@pytest.mark.integration
def test_full_width_cache_gives_the_online_first_step_loss(cached_run, workdir):
    out, _ = cached_run
    online = run(workdir, "online", *QUICK)
    for key in ("loss", "kd", "tv", "ce"):
        assert logged(out, key)[0] == pytest.approx(logged(online, key)[0], rel=1e-5), key


@pytest.mark.integration
@pytest.mark.parametrize("other, difference", [("other_target", "target weights"),
                                               ("other_tokenizer", "tokenizer vocabulary")])
def test_a_cache_of_another_target_or_tokenizer_is_a_one_line_error(cached_run, workdir, monkeypatch, capsys,
                                                                    other, difference):
    message = cli_error(monkeypatch, capsys, TINY_RECIPE, f"model.target={workdir / other}",
                        f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={workdir / ('bad_' + other)}",
                        f"distill.teacher_cache={workdir / 'cache'}", f"distill.teacher_topk={VOCAB}",
                        "distill.teacher_cache_dtype=float32", *QUICK)
    assert "distill.teacher_cache:" in message and difference in message, message


# ---------------------------------------------------------------------------------------------------------------
# On-policy: the pieces
# ---------------------------------------------------------------------------------------------------------------

def test_rows_are_chosen_one_by_one_with_probability_lambda():
    lam, batch, draws = 0.3, 8, 2000
    counts = [len(select_rows(batch, lam, micro_batch_generator(42, 0, step, 0)).selected) for step in range(draws)]
    share = sum(counts) / (batch * draws)
    assert abs(share - lam) < 5 * (lam * (1 - lam) / (batch * draws)) ** 0.5, share
    assert sum(0 < c < batch for c in counts) > draws / 2  # per row, not one coin flip per batch
    other_rank = [select_rows(batch, lam, micro_batch_generator(42, 1, step, 0)).selected for step in range(50)]
    assert other_rank != [select_rows(batch, lam, micro_batch_generator(42, 0, step, 0)).selected
                          for step in range(50)]
    assert select_rows(batch, 1.0, micro_batch_generator(0, 0, 0, 0)).selected == list(range(batch))
    assert select_rows(batch, 0.0, micro_batch_generator(0, 0, 0, 0)).selected == []


def test_prompt_is_what_precedes_the_first_trained_label():
    chat = torch.tensor([IGNORE_INDEX] * 4 + [7, 8, 9] + [IGNORE_INDEX] * 3)  # 3 pads at the end
    assert prompt_length(chat, length=7, prompt_tokens=2) == 4
    text = torch.arange(10)
    assert prompt_length(text, length=10, prompt_tokens=3) == 3
    assert prompt_length(text, length=10, prompt_tokens=30) == 9  # at least one token left to continue


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_batched_samples_equal_the_drafts_own_decoder_row_by_row(arch):
    draft = tiny_model(arch, vocab_size=96, layers=1)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 96, (n,), generator=g) for n in (3, 9, 1, 6)]  # left padding of 0..8 tokens
    seeds = [11, 22, 33, 44]
    for temperature in (0.0, 1.0):
        batched = sample_continuations(draft, prompts, max_new_tokens=10, sampling=SamplingConfig(temperature),
                                       seeds=seeds, eos_token_id=EOS, pad_token_id=PAD)
        alone = [draft_samples(draft, p.tolist(), 10, temperature, s) for p, s in zip(prompts, seeds)]
        assert batched == alone, temperature
    again = sample_continuations(draft, prompts, max_new_tokens=10, sampling=SamplingConfig(1.0), seeds=seeds,
                                 eos_token_id=EOS, pad_token_id=PAD)
    other = sample_continuations(draft, prompts, max_new_tokens=10, sampling=SamplingConfig(1.0),
                                 seeds=[s + 1 for s in seeds], eos_token_id=EOS, pad_token_id=PAD)
    assert again == batched and other != batched


def chat_and_text_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    rows = []
    for n, prompt in ((12, 4), (9, 0), (16, 7), (10, 0)):  # prompt 0: trained from the first token (text)
        ids = torch.randint(4, 96, (n,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": [IGNORE_INDEX] * prompt + ids[prompt:]})
    return DistillCollator(PAD)(rows)


def settings(fraction: float, temperature: float = 1.0) -> OnPolicySettings:
    return OnPolicySettings(fraction=fraction, max_new_tokens=8, temperature=temperature, prompt_tokens=3,
                            max_length=18, eos_token_id=EOS, pad_token_id=PAD, vocab_size=96, seed=0)


def test_every_row_becomes_prompt_plus_the_drafts_seeded_sample_at_lambda_1():
    draft = tiny_model("llama", vocab_size=96, layers=1)
    batch = chat_and_text_batch()
    new, rows = on_policy_batch(batch, draft, settings(1.0), micro_batch_generator(0, 0, 0, 0))
    assert rows.selected == [0, 1, 2, 3]
    for i, (prompt_len, seed) in enumerate(zip((4, 3, 7, 3), rows.seeds)):
        prompt = batch["input_ids"][i, :prompt_len].tolist()
        room = min(8, 18 - prompt_len)  # on_policy_max_new_tokens, and the row stays within max_length
        expected = draft_samples(draft, prompt, room, 1.0, seed)
        n = int(new["attention_mask"][i].sum())
        assert new["input_ids"][i, :n].tolist() == prompt + expected
        assert new["labels"][i, :n].tolist() == [IGNORE_INDEX] * prompt_len + expected
        assert (new["labels"][i, n:] == IGNORE_INDEX).all() and (new["attention_mask"][i, n:] == 0).all()
    again, _ = on_policy_batch(batch, draft, settings(1.0), micro_batch_generator(0, 0, 0, 0))
    assert all(torch.equal(again[k], new[k]) for k in new)  # seeded


def test_lambda_0_leaves_the_batch_untouched():
    batch = chat_and_text_batch()
    draft = tiny_model("llama", vocab_size=96, layers=1)
    same, rows = on_policy_batch(batch, draft, settings(0.0), micro_batch_generator(0, 0, 0, 0))
    assert same is batch and rows.selected == []


@pytest.mark.parametrize("fraction", [0.0, 1.0])
def test_the_token_count_is_taken_after_the_replacement(fraction, tmp_path):
    target = tiny_model("llama", vocab_size=96, layers=1)
    draft = tiny_model("llama", vocab_size=96, layers=1, seed=4).train()
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    trainer = DistillTrainer(model=draft, target=target, args=args, distill=DistillConfig(), train_dataset=[],
                             data_collator=DistillCollator(PAD), on_policy=settings(fraction, temperature=0.0))
    batches = [chat_and_text_batch(), chat_and_text_batch()]
    originals = [{k: v.clone() for k, v in b.items()} for b in batches]
    got, count = trainer.get_batch_samples(iter(batches), 2, torch.device("cpu"))
    assert int(count) == sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in got)
    if fraction == 0.0:
        assert all(torch.equal(g[k], o[k]) for g, o in zip(got, originals) for k in o)
    else:  # greedy: each row continues with the draft's own argmax tokens
        for g, o in zip(got, originals):
            for i, prompt_len in enumerate((4, 3, 7, 3)):
                n = int(g["attention_mask"][i].sum())
                prompt = o["input_ids"][i, :prompt_len].tolist()
                assert g["input_ids"][i, :n].tolist() == prompt + greedy(draft, prompt, min(8, 18 - prompt_len))


# ---------------------------------------------------------------------------------------------------------------
# On-policy: whole runs
# ---------------------------------------------------------------------------------------------------------------

class RecordOnPolicy:
    """Wraps DistillTrainer.compute_loss: checks every row of every micro-batch against the draft's own sample of
    its prompt with the seed the row was given (lambda = 1, one micro-batch per step), before the step changes
    the draft. Records the rows."""

    def __init__(self, monkeypatch, temperature: float, max_new_tokens: int, prompt_tokens: int, seed: int = 42):
        self.rows, self.checked = [], 0
        original = DistillTrainer.compute_loss

        def compute_loss(trainer, model, inputs, *args, **kwargs):
            draft = trainer.accelerator.unwrap_model(model)
            generator = micro_batch_generator(seed, 0, trainer.state.global_step, 0)
            chosen = select_rows(inputs["input_ids"].shape[0], 1.0, generator)
            with eval_mode(draft):
                for i, row_seed in zip(chosen.selected, chosen.seeds):
                    n = int(inputs["attention_mask"][i].sum())
                    ids, labels = inputs["input_ids"][i, :n].tolist(), inputs["labels"][i, :n].tolist()
                    assert labels[:prompt_tokens] == [IGNORE_INDEX] * prompt_tokens
                    expected = draft_samples(draft, ids[:prompt_tokens], max_new_tokens, temperature, row_seed)
                    assert ids[prompt_tokens:] == expected and labels[prompt_tokens:] == expected
                    self.rows.append(ids)
                    self.checked += 1
            return original(trainer, model, inputs, *args, **kwargs)

        monkeypatch.setattr(DistillTrainer, "compute_loss", compute_loss)


ON_POLICY = ("distill.on_policy_fraction=1", "distill.on_policy_max_new_tokens=6", "data.prompt_tokens=5",
             "train.per_device_train_batch_size=4")


@pytest.mark.integration
def test_on_policy_rows_are_the_drafts_seeded_samples(workdir, monkeypatch):
    sampled = RecordOnPolicy(monkeypatch, temperature=1.0, max_new_tokens=6, prompt_tokens=5)
    out = run(workdir, "on_policy", *ON_POLICY, "distill.on_policy_temperature=1", *QUICK)
    assert sampled.checked == 8  # 2 steps x 4 rows, each one checked
    assert logged(out, "on_policy") == [1.0, 1.0]
    monkeypatch.undo()
    greedy_rows = RecordOnPolicy(monkeypatch, temperature=0.0, max_new_tokens=6, prompt_tokens=5)
    run(workdir, "on_policy_greedy", *ON_POLICY, "distill.on_policy_temperature=0", *QUICK)
    assert greedy_rows.checked == 8 and greedy_rows.rows != sampled.rows


@pytest.mark.integration
def test_on_policy_on_two_processes_finishes(workdir, tmp_path):
    out = tmp_path / "two_processes"
    accelerate_launch(ROOT / "scripts" / "train.py", TINY_RECIPE, f"model.target={workdir / 'target'}",
                      f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={out}", *QUICK,
                      "distill.on_policy_fraction=0.5", "distill.on_policy_max_new_tokens=6",
                      "train.per_device_train_batch_size=3", timeout=55)
    shares = logged(out, "on_policy")
    assert len(shares) == 2 and all(0.0 <= s <= 1.0 for s in shares)
    assert (out / "model.safetensors").is_file()
