"""Sequence-level KD data: the target's responses, generated in resumable shards, reused, turned into rows."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import datasets
import pytest
import torch
from transformers import AutoModelForCausalLM

import distill.data.target_data as target_data
from distill.data.shard_store import CacheMismatchError
from distill.data.target_data import (
    IGNORE_INDEX,
    generate_target_data,
    load_target_data,
    prompts_from_rows,
    to_training_rows,
)
from kinds import STANDALONE

from helpers import CHILD_ENV, ROOT, record_packing
from tiny import TINY_TEXT, perturbed_copy, save_and_load, tiny_config, tiny_model, tiny_tokenizer

EOS = 2
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def target(tmp_path_factory, tokenizer):
    return save_and_load(tiny_model(vocab_size=len(tokenizer), seed=0), tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="module")
def prompts(tokenizer):
    lines = [line for line in TINY_TEXT.splitlines() if line.strip()][:7]
    return [tokenizer(line)["input_ids"] for line in lines]


def run(target, tokenizer, prompts, path, **kwargs):
    settings = dict(max_new_tokens=NEW_TOKENS, temperature=1.0, top_k=20, top_p=None, seed=0, shard_size=3,
                    target_id="tiny-target", progress=False)
    return generate_target_data(target, tokenizer, prompts, path, **{**settings, **kwargs})


@pytest.fixture(scope="module")
def sampled_dir(target, tokenizer, prompts, tmp_path_factory):
    """The folder of one uninterrupted sampled run (temperature 1, top-k 20, seed 0, shards of 3 prompts)."""
    path = tmp_path_factory.mktemp("sampled")
    run(target, tokenizer, prompts, path)
    return path


@pytest.fixture(scope="module")
def sampled(sampled_dir):
    return load_target_data(sampled_dir)


def plain_greedy(model, prompt: list[int], max_new_tokens: int, eos: int) -> list[int]:
    """Reference greedy decoding: the full sequence through the model at every step, no KV cache."""
    ids = list(prompt)
    for _ in range(max_new_tokens):
        with torch.no_grad():
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        ids.append(token)
        if token == eos:
            break
    return ids[len(prompt):]


class CountingGenerate:
    """Stands in for target_data.generate_response: counts calls and raises on call `fail_at` (an interruption)."""

    def __init__(self, fail_at: int | None = None):
        self.calls, self.fail_at, self.real = 0, fail_at, target_data.generate_response

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.fail_at:
            raise KeyboardInterrupt("simulated interruption")
        return self.real(*args, **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# What is generated
# ---------------------------------------------------------------------------------------------------------------

def test_rows_hold_prompts_responses_and_their_text(sampled, prompts, tokenizer):
    assert sampled.column_names == ["index", "prompt_ids", "response_ids", "prompt_text", "response_text",
                                    "stopped_at_eos"]
    assert sampled["index"] == list(range(len(prompts)))
    assert sampled["prompt_ids"] == prompts
    for row in sampled:
        assert 0 < len(row["response_ids"]) <= NEW_TOKENS
        assert row["response_text"] == tokenizer.decode(row["response_ids"], skip_special_tokens=True)
        assert row["stopped_at_eos"] == (row["response_ids"][-1] == EOS)


@pytest.mark.parametrize("use_draft", [False, True])
def test_greedy_responses_equal_plain_greedy_decoding_of_the_target(target, tokenizer, prompts, tmp_path,
                                                                    use_draft):
    draft = perturbed_copy(target, 0.3) if use_draft else None
    ds = run(target, tokenizer, prompts, tmp_path, temperature=0.0, top_k=None, draft=draft, draft_kind=STANDALONE)
    for row, prompt in zip(ds, prompts):
        assert row["response_ids"] == plain_greedy(target, prompt, NEW_TOKENS, EOS)


def test_decoding_stops_at_the_tokenizers_eos(target, tokenizer, prompts, tmp_path):
    # Swap the lm_head rows of EOS and of the 4th greedy token X of prompt 0: greedy decoding now emits EOS where
    # it emitted X before, so the response is the old one up to the first X, with EOS there, and nothing after.
    before = plain_greedy(target, prompts[0], NEW_TOKENS, EOS)
    x = before[3]
    swapped = perturbed_copy(target, 0.0)
    with torch.no_grad():
        head = swapped.get_output_embeddings().weight
        head[[EOS, x]] = head[[x, EOS]].clone()
    ds = run(swapped, tokenizer, prompts[:1], tmp_path, temperature=0.0, top_k=None)
    first_x = before.index(x)
    assert ds[0]["response_ids"] == before[:first_x] + [EOS]
    assert ds[0]["stopped_at_eos"] and first_x + 1 < NEW_TOKENS


def test_a_seed_fixes_the_samples_whatever_the_sharding(sampled, target, tokenizer, prompts, tmp_path):
    again = run(target, tokenizer, prompts, tmp_path / "again", shard_size=5)
    assert again["response_ids"] == sampled["response_ids"]
    other_seed = run(target, tokenizer, prompts, tmp_path / "seed1", seed=1)
    assert other_seed["response_ids"] != sampled["response_ids"]


# ---------------------------------------------------------------------------------------------------------------
# Resume and reuse
# ---------------------------------------------------------------------------------------------------------------

def test_an_interrupted_run_resumes_after_its_last_complete_shard(sampled, target, tokenizer, prompts, tmp_path,
                                                                  monkeypatch):
    # 7 prompts in shards of 3: interrupted while generating prompt 4 (the second shard)
    interrupted = CountingGenerate(fail_at=5)
    monkeypatch.setattr(target_data, "generate_response", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(target, tokenizer, prompts, tmp_path)
    with pytest.raises(FileNotFoundError, match="unfinished"):
        load_target_data(tmp_path)

    resumed = CountingGenerate()
    monkeypatch.setattr(target_data, "generate_response", resumed)
    ds = run(target, tokenizer, prompts, tmp_path)
    assert resumed.calls == len(prompts) - 3  # the first shard was kept
    assert ds.to_dict() == sampled.to_dict()


def test_a_finished_run_is_reused_without_generating(sampled, sampled_dir, target, tokenizer, prompts,
                                                     monkeypatch):
    counter = CountingGenerate(fail_at=1)  # any generation would raise
    monkeypatch.setattr(target_data, "generate_response", counter)
    assert run(target, tokenizer, prompts, sampled_dir).to_dict() == sampled.to_dict()
    assert counter.calls == 0


def test_other_settings_in_the_same_folder_are_refused(sampled_dir, target, tokenizer, prompts):
    out_dir = sampled_dir
    with pytest.raises(CacheMismatchError, match="temperature") as err:
        run(target, tokenizer, prompts, out_dir, temperature=0.5)
    assert "seed" not in str(err.value)
    with pytest.raises(CacheMismatchError, match="prompts_hash"):
        run(target, tokenizer, prompts[:-1] + [prompts[-1] + [5]], out_dir)
    with pytest.raises(CacheMismatchError, match="target_fingerprint"):
        run(perturbed_copy(target, 0.1), tokenizer, prompts, out_dir)


def test_prompts_can_be_a_dataset_column_and_empty_prompts_are_refused(sampled, target, tokenizer, prompts,
                                                                       tmp_path):
    ds = run(target, tokenizer, datasets.Dataset.from_dict({"prompt_ids": prompts}), tmp_path)
    assert ds["response_ids"] == sampled["response_ids"]
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        run(target, tokenizer, [prompts[0], []], tmp_path / "empty")
    with pytest.raises(ValueError, match="no 'prompt_ids' column"):
        run(target, tokenizer, datasets.Dataset.from_dict({"text": ["a"]}), tmp_path / "column")


# ---------------------------------------------------------------------------------------------------------------
# Training rows
# ---------------------------------------------------------------------------------------------------------------

def test_training_rows_mask_the_prompt_and_truncate():
    responses = datasets.Dataset.from_dict({
        "prompt_ids": [[10, 11, 12], [20, 21], [30, 31, 32, 33, 34, 35]],
        "response_ids": [[13, 14, EOS], [22, 23, 24, 25, 26], [36]],
    })
    rows = to_training_rows(responses, max_length=5)
    assert rows.column_names == ["input_ids", "labels"]
    assert rows["input_ids"] == [[10, 11, 12, 13, 14], [20, 21, 22, 23, 24]]  # third row: only prompt fits
    assert rows["labels"] == [[IGNORE_INDEX] * 3 + [13, 14], [IGNORE_INDEX] * 2 + [22, 23, 24]]
    assert to_training_rows(responses, max_length=64)["labels"][2] == [IGNORE_INDEX] * 6 + [36]
    with pytest.raises(ValueError, match="max_length must be >= 2"):
        to_training_rows(responses, max_length=1)


def test_training_rows_from_generated_data(sampled):
    rows = to_training_rows(sampled, max_length=256)
    for row, source in zip(rows, sampled):
        assert row["input_ids"] == source["prompt_ids"] + source["response_ids"]
        assert row["labels"][len(source["prompt_ids"]):] == source["response_ids"]
        assert set(row["labels"][:len(source["prompt_ids"])]) == {IGNORE_INDEX}


def test_prompts_from_rows_end_before_the_first_trained_label():
    rows = datasets.Dataset.from_dict({
        "input_ids": [[5, 6, 7, 8, 9], [10, 11, 12, 13]],
        "labels": [[IGNORE_INDEX, IGNORE_INDEX, 7, IGNORE_INDEX, 9], [10, 11, 12, 13]],  # chat row, packed text
    })
    assert prompts_from_rows(rows, prompt_tokens=3)["prompt_ids"] == [[5, 6], [10, 11, 12]]


# ---------------------------------------------------------------------------------------------------------------
# Batched generation (batch_size > 1): the batch-1 rows, resumable, behind the engine seam
# ---------------------------------------------------------------------------------------------------------------

def with_early_eos(model, prompt: list[int]):
    """A copy of `model` with the lm_head rows of EOS and of `prompt`'s 4th greedy token swapped: greedy rows that
    would emit that token emit EOS there instead and stop early, the others run to NEW_TOKENS."""
    x = plain_greedy(model, prompt, NEW_TOKENS, EOS)[3]
    swapped = perturbed_copy(model, 0.0)
    with torch.no_grad():
        head = swapped.get_output_embeddings().weight
        head[[EOS, x]] = head[[x, EOS]].clone()
    return swapped


def untied_gpt2(vocab_size: int):
    """A tiny GPT-2 (absolute positions) with its own lm_head: tied to the input embeddings, swapping two lm_head
    rows would swap the tokens' input embeddings too."""
    config = tiny_config("gpt2", vocab_size=vocab_size)
    config.tie_word_embeddings = False
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)  # sharpened like tiny.tiny_model
    return model.eval()


@pytest.mark.parametrize("arch", ["llama", "gpt2"])  # gpt2: absolute positions, so pads must not advance them
def test_batched_greedy_rows_are_the_batch_1_rows(arch, target, tokenizer, prompts, tmp_path):
    model = with_early_eos(target if arch == "llama" else untied_gpt2(len(tokenizer)), prompts[0])
    one = run(model, tokenizer, prompts, tmp_path / "one", temperature=0.0, top_k=None)
    lengths = [len(r) for r in one["response_ids"]]
    assert min(lengths) < NEW_TOKENS and one["stopped_at_eos"].count(True) < len(prompts)  # early stops and full rows
    assert len({len(p) for p in prompts}) > 2  # prompts of different lengths: left padding in every batch
    for row, prompt in zip(one, prompts):
        assert row["response_ids"] == plain_greedy(model, prompt, NEW_TOKENS, EOS)
    for batch_size in (3, 4):
        batched = run(model, tokenizer, prompts, tmp_path / f"batch{batch_size}", temperature=0.0, top_k=None,
                      batch_size=batch_size)
        assert batched.to_dict() == one.to_dict(), batch_size


@pytest.mark.parametrize("batch_size", [3, 4])
def test_batched_sampled_rows_draw_from_the_same_per_prompt_seeds(sampled, target, tokenizer, prompts, tmp_path,
                                                                  batch_size):
    # Each row draws from its own generator (seed + index) in the batch-1 order. Equality holds as long as padded
    # shapes round no draw across a token boundary (decode/loop/batched.py); on these models none does.
    batched = run(target, tokenizer, prompts, tmp_path / "batched", batch_size=batch_size)
    assert batched["response_ids"] == sampled["response_ids"]
    early_eos = with_early_eos(target, prompts[0])  # sampled rows that stop early leave the batch
    for seed in range(8):  # the first seed whose batch-1 run has rows that stop early and rows that do not
        one = run(early_eos, tokenizer, prompts, tmp_path / f"early_one{seed}", seed=seed)
        if 0 < one["stopped_at_eos"].count(True) < len(prompts):
            break
    assert 0 < one["stopped_at_eos"].count(True) < len(prompts)
    assert run(early_eos, tokenizer, prompts, tmp_path / "early_batched", batch_size=batch_size,
               seed=seed).to_dict() == one.to_dict()


class CountingBatches:
    """Stands in for target_data.batched_generate: records each batch's size and prompt lengths, raises on call
    `fail_at`."""

    def __init__(self, fail_at: int | None = None):
        self.sizes, self.lengths, self.fail_at, self.real = [], [], fail_at, target_data.batched_generate

    def __call__(self, model, prompts, **kwargs):
        self.sizes.append(len(prompts))
        self.lengths.append([len(p) for p in prompts])
        if len(self.sizes) == self.fail_at:
            raise KeyboardInterrupt("simulated interruption")
        return self.real(model, prompts, **kwargs)


def test_an_interrupted_batched_run_resumes_with_the_same_rows(sampled, target, tokenizer, prompts, tmp_path,
                                                               monkeypatch):
    # 7 prompts, shards of 4, batches of 2: shard 0 = batches of 2 + 2, shard 1 = 2 + 1; interrupted in shard 1
    interrupted = CountingBatches(fail_at=3)
    monkeypatch.setattr(target_data, "batched_generate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(target, tokenizer, prompts, tmp_path, batch_size=2, shard_size=4)
    assert interrupted.sizes == [2, 2, 2]

    resumed = CountingBatches()
    monkeypatch.setattr(target_data, "batched_generate", resumed)
    ds = run(target, tokenizer, prompts, tmp_path, batch_size=2, shard_size=4)
    assert resumed.sizes == [2, 1]  # only shard 1 again
    assert ds.to_dict() == sampled.to_dict()
    # the batch size is not part of the spec: a batch-1 run finds the folder complete
    monkeypatch.setattr(target_data, "generate_response", CountingGenerate(fail_at=1))
    assert run(target, tokenizer, prompts, tmp_path).to_dict() == sampled.to_dict()


class RecordingEngine:
    """A ResponseEngine that records what it is asked and answers [seed] for every prompt."""

    def __init__(self):
        self.calls = []

    def generate_responses(self, prompts, seeds, sampling, batch_size):
        self.calls.append((prompts, seeds, batch_size))
        return [[seed] for seed in seeds]


def test_an_engine_gets_one_shard_at_a_time_with_its_seeds(target, tokenizer, prompts, tmp_path):
    engine = RecordingEngine()
    ds = run(target, tokenizer, prompts, tmp_path, seed=100, batch_size=2, shard_size=3, engine=engine)
    assert ds["response_ids"] == [[100 + i] for i in range(len(prompts))]  # row i sampled with seed + i
    assert engine.calls == [(prompts[0:3], [100, 101, 102], 2), (prompts[3:6], [103, 104, 105], 2),
                            (prompts[6:7], [106], 2)]


def test_batches_group_prompts_of_similar_length(target, tokenizer, prompts, tmp_path, monkeypatch):
    batches = CountingBatches()
    monkeypatch.setattr(target_data, "batched_generate", batches)
    run(target, tokenizer, prompts, tmp_path, batch_size=3, shard_size=7)
    assert batches.sizes == [3, 3, 1]
    longest_first = sorted((len(p) for p in prompts), reverse=True)
    assert batches.lengths == [longest_first[0:3], longest_first[3:6], longest_first[6:7]]


def test_our_decoder_generates_on_packed_layers_and_leaves_the_target_as_it_was(target, tokenizer, prompts, tmp_path,
                                                                               monkeypatch):
    """On CPU the target (and a draft) multiply by oneDNN-packed weights while our decoder writes the data (faster
    than F.linear); after the run they are their own nn.Linear layers again. Another engine (vLLM) does not decode
    with these weights: nothing is packed for it."""
    from decode.loop.packed_linear import PackedLinear, packed_layers

    if not torch.backends.mkldnn.is_available():
        pytest.skip("oneDNN is not built into torch")
    seen = record_packing(monkeypatch, target_data, "batched_generate")
    head = target.lm_head
    greedy = run(target, tokenizer, prompts, tmp_path / "batched", temperature=0.0, top_k=None, batch_size=3)
    assert seen and all(seen) and target.lm_head is head and not packed_layers(target)
    # the packed rows are plain greedy decoding of the unpacked target, batch 1
    assert greedy["response_ids"] == [plain_greedy(target, p, NEW_TOKENS, EOS) for p in prompts]

    class LookingEngine(RecordingEngine):
        def generate_responses(self, *args):
            seen.append(isinstance(target.lm_head, PackedLinear))
            return super().generate_responses(*args)

    seen.clear()
    run(target, tokenizer, prompts, tmp_path / "engine", engine=LookingEngine())
    assert seen and not any(seen)


def test_batches_decode_with_the_target_alone(target, tokenizer, prompts, tmp_path):
    with pytest.raises(ValueError, match="1 with a draft"):
        run(target, tokenizer, prompts, tmp_path, batch_size=2, draft=perturbed_copy(target, 0.3))
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        run(target, tokenizer, prompts, tmp_path, batch_size=0)


KILLED_RUN = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from distill.data.target_data import generate_target_data
folder, out = sys.argv[1], sys.argv[2]
prompts = [[int(t) for t in line.split()] for line in open(folder + "/prompts.txt")]
generate_target_data(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), AutoTokenizer.from_pretrained(
    folder), prompts, out, max_new_tokens=12, temperature=1.0, top_k=20, seed=0, batch_size=3, shard_size=6,
    target_id="tiny-target", progress=False)
"""


@pytest.mark.integration
def test_a_killed_batched_run_resumes_with_the_batch_1_rows(target, tokenizer, prompts, tmp_path):
    # a real kill -9 once two shards are on disk, then a resume in this process
    folder, out = tmp_path / "target", tmp_path / "responses"
    target.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    many = [p[:n] for n in range(2, 8) for p in prompts]  # 42 prompts of 2..7 tokens, 7 shards
    (folder / "prompts.txt").write_text("\n".join(" ".join(map(str, p)) for p in many) + "\n")
    child = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(folder), str(out)], cwd=ROOT,
                             env={**os.environ, **CHILD_ENV}, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (out / "shards" / "shard-00001").is_dir():
        assert child.poll() is None and time.monotonic() < deadline, child.stderr.read().decode()[-2000:]
        time.sleep(0.005)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert not (out / "shards" / f"shard-{len(many) // 6:05d}").is_dir()  # killed before its last shard
    with pytest.raises(FileNotFoundError, match="unfinished"):
        load_target_data(out)
    resumed = run(target, tokenizer, many, out, batch_size=3, shard_size=6)
    one_at_a_time = run(target, tokenizer, many, tmp_path / "batch1")
    assert resumed.to_dict() == one_at_a_time.to_dict()
