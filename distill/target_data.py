"""Sequence-level KD data: the target's own responses to prompts, generated once and stored with `datasets`.

    responses = generate_target_data(target, tokenizer, prompts, "data/target-responses", max_new_tokens=256,
                                     temperature=0.0, top_k=None, top_p=None, seed=0, draft=draft)
    train_rows = to_training_rows(responses, max_length=1024)   # input_ids = prompt + response, labels on response

Prompt i is decoded with its own generator seeded with seed + i, so the responses do not depend on the shard size
or on where an interrupted run resumed. Decoding stops after the tokenizer's EOS (kept in response_ids) or after
max_new_tokens. With a draft, decode.speculative_generate produces them (greedy: the same tokens as the target
alone; sampled: the same distribution, another random stream), else decode.autoregressive_generate.
With engine="vllm" vLLM generates each shard in one run (distill/target_vllm.py, the serving venv).

Layout on disk (out_dir):
    target_data.json      what the responses depend on (target, tokenizer, prompts, sampling settings, seed, draft)
    shards/shard-00000/   `datasets` save_to_disk folders of shard_size prompts each, written atomically
An interrupted run resumes after the last complete shard; a finished one is returned as it is. out_dir holding
responses of other inputs raises CacheMismatchError (a ValueError) naming what differs.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from decode import autoregressive_generate, speculative_generate
from decode.serving.vllm_engine import find_vllm_python
from distill.fingerprints import config_hash, token_lists_hash, vocab_hash, weights_hash
from distill.shard_store import ShardStore
from distill.target_vllm import vllm_responses
from distill.utils import IGNORE_INDEX, eval_mode

FORMAT_VERSION = 1
METADATA_FILE = "target_data.json"
# plain names of spec keys in mismatch messages (those target data shares with a teacher cache)
SPEC_MEANINGS = {"target_id": "target", "tokenizer_vocab_hash": "tokenizer vocabulary",
                 "format_version": "cache format version"}
FEATURES = datasets.Features({
    "index": datasets.Value("int64"),
    "prompt_ids": datasets.List(datasets.Value("int64")),
    "response_ids": datasets.List(datasets.Value("int64")),
    "prompt_text": datasets.Value("string"),
    "response_text": datasets.Value("string"),
    "stopped_at_eos": datasets.Value("bool"),
})


@dataclass(frozen=True)
class Sampling:
    """How each response is decoded (temperature 0 = greedy)."""

    max_new_tokens: int
    temperature: float
    top_k: int | None
    top_p: float | None
    seed: int
    gamma: int


def prompt_lists(prompts: datasets.Dataset | Sequence[Sequence[int] | torch.Tensor],
                 prompt_column: str) -> list[list[int]]:
    """Token-id lists of the prompts; raises ValueError for a missing column or an empty prompt (naming it)."""
    if isinstance(prompts, datasets.Dataset):
        if prompt_column not in prompts.column_names:
            raise ValueError(f"the prompts dataset has no {prompt_column!r} column (columns: "
                             f"{', '.join(prompts.column_names)}); pass prompt_column=")
        lists = [list(p) for p in prompts[prompt_column]]
    else:
        lists = [p.tolist() if isinstance(p, torch.Tensor) else list(p) for p in prompts]
    empty = [i for i, p in enumerate(lists) if len(p) == 0]
    if empty:
        raise ValueError(f"prompt {empty[0]} is empty ({len(empty)} empty prompts): generation needs at least one "
                         "prompt token")
    return [[int(t) for t in p] for p in lists]


def _model_fingerprint(model: nn.Module | Any | None) -> str | None:
    if model is None:
        return None
    if isinstance(model, nn.Module):
        return f"{config_hash(model)}-{weights_hash(model)}"
    settings = sorted((k, v) for k, v in vars(model).items() if isinstance(v, (bool, int, float, str)))
    return f"{type(model).__name__}{settings}"


def data_spec(target: nn.Module, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], sampling: Sampling,
              draft: nn.Module | Any | None, target_id: str, engine: str = "specdistill") -> dict[str, Any]:
    """Everything the generated responses depend on (JSON-ready)."""
    return {
        "format_version": FORMAT_VERSION,
        "target_id": target_id,
        "target_fingerprint": _model_fingerprint(target),
        "tokenizer_vocab_hash": vocab_hash(tokenizer),
        "eos_token_id": tokenizer.eos_token_id,
        "prompts_hash": token_lists_hash(prompts),
        "num_prompts": len(prompts),
        "max_new_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "seed": sampling.seed,
        "decoder": "vllm" if engine == "vllm" else "autoregressive" if draft is None else "speculative",
        "gamma": None if draft is None else sampling.gamma,
        "draft_fingerprint": _model_fingerprint(draft),
    }


def generate_response(target: nn.Module, draft: nn.Module | Any | None, prompt: list[int], sampling: Sampling,
                      eos_token_id: int | None, index: int) -> list[int]:
    """The target's response to one prompt (EOS included when reached), seeded with seed + index."""
    device = next(target.parameters()).device
    generator = torch.Generator(device=device).manual_seed(sampling.seed + index)
    input_ids = torch.tensor([prompt], dtype=torch.long, device=device)  # [1, L]
    decode = dict(max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature, top_k=sampling.top_k,
                  top_p=sampling.top_p, eos_token_id=eos_token_id, generator=generator)
    if draft is None:
        return autoregressive_generate(target, input_ids, **decode).new_tokens
    return speculative_generate(target, draft, input_ids, gamma=sampling.gamma, **decode).new_tokens


def generate_target_data(
    target: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: datasets.Dataset | Sequence[Sequence[int] | torch.Tensor],
    out_dir: str | os.PathLike,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    shard_size: int = 64,
    draft: nn.Module | Any | None = None,
    gamma: int = 4,
    target_id: str = "",
    prompt_column: str = "prompt_ids",
    overwrite: bool = False,
    progress: bool = True,
    engine: str = "specdistill",
    vllm_python: Path | None = None,
) -> datasets.Dataset:
    """The target's responses to `prompts`, one row per prompt in order: index, prompt_ids, response_ids,
    prompt_text, response_text, stopped_at_eos.

    prompts: a Dataset with a `prompt_column` of token ids, or a list of token-id lists / 1-D tensors.
    Resumes an interrupted run after its last complete shard and returns a finished one without generating.
    engine="vllm": vLLM (interpreter ``vllm_python``) generates each shard; ``target_id`` must then be the
    target's folder or hub id.
    Raises ValueError for an empty prompt or a bad setting, CacheMismatchError when out_dir holds responses of
    other inputs (overwrite=True deletes them).
    """
    if shard_size < 1 or max_new_tokens < 0 or gamma < 1:
        raise ValueError(f"shard_size and gamma must be >= 1 and max_new_tokens >= 0, got shard_size={shard_size}, "
                         f"gamma={gamma}, max_new_tokens={max_new_tokens}")
    if engine not in ("specdistill", "vllm"):
        raise ValueError(f"engine must be 'specdistill' or 'vllm', got {engine!r}")
    python = find_vllm_python(vllm_python) if engine == "vllm" else None  # ServingError naming `make serving`
    prompt_ids = prompt_lists(prompts, prompt_column)
    sampling = Sampling(max_new_tokens, temperature, top_k, top_p, seed, gamma)
    spec = data_spec(target, tokenizer, prompt_ids, sampling, draft, target_id, engine)
    store = _store(out_dir)
    metadata = store.start(spec, num_rows=len(prompt_ids), rows_per_shard=shard_size, size_key="shard_size",
                           overwrite=overwrite)
    if metadata["complete"]:
        return load_target_data(store.root)

    def make(shard: int, indices: range, scratch: Path) -> datasets.Dataset:
        if engine == "vllm":
            shard_prompts = [prompt_ids[i] for i in indices]
            responses = vllm_responses(python, target_id, shard_prompts, sampling, tokenizer.eos_token_id,
                                       indices.start)
            bar.update(len(indices))
            return datasets.Dataset.from_list([_row(tokenizer, i, prompt_ids[i], r) for i, r in
                                               zip(indices, responses)], features=FEATURES)
        rows = []
        for i in indices:
            response = generate_response(target, draft, prompt_ids[i], sampling, tokenizer.eos_token_id, i)
            rows.append(_row(tokenizer, i, prompt_ids[i], response))
            bar.update(1)
        return datasets.Dataset.from_list(rows, features=FEATURES)

    with eval_mode(target), tqdm(total=len(prompt_ids), desc="target responses", unit="prompt",
                                 disable=not progress) as bar:
        store.fill(metadata, len(prompt_ids), make, bar, size_key="shard_size")
    store.finish(metadata)
    return load_target_data(store.root)


def _store(out_dir: str | os.PathLike) -> ShardStore:
    return ShardStore(Path(out_dir), METADATA_FILE, "target data", SPEC_MEANINGS)


def _row(tokenizer: PreTrainedTokenizerBase, index: int, prompt: list[int], response: list[int]) -> dict[str, Any]:
    return {"index": index, "prompt_ids": prompt, "response_ids": response,
            "prompt_text": tokenizer.decode(prompt, skip_special_tokens=True),
            "response_text": tokenizer.decode(response, skip_special_tokens=True),
            "stopped_at_eos": bool(response) and response[-1] == tokenizer.eos_token_id}


def load_target_data(out_dir: str | os.PathLike) -> datasets.Dataset:
    """The responses of a finished generate_target_data run (memory-mapped); FileNotFoundError otherwise."""
    store = _store(out_dir)
    out, metadata = store.root, store.read_metadata()
    if metadata is None or not metadata.get("complete"):
        state = "no" if metadata is None else "unfinished"
        raise FileNotFoundError(f"{state} target data at {out}; run generate_target_data (it resumes)")
    shards = store.load_shards(metadata)
    return datasets.concatenate_datasets(shards) if shards else datasets.Dataset.from_list([], features=FEATURES)


def prompts_from_rows(rows: datasets.Dataset, *, prompt_tokens: int = 32) -> datasets.Dataset:
    """Prompts {prompt_ids} from the data pipeline's training rows {input_ids, labels}: the tokens before the first
    trained label (chat rows: the conversation up to the assistant's turn, generation prompt included). Rows
    trained from their first token (packed text) give their first `prompt_tokens` tokens instead."""
    if prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be >= 1, got {prompt_tokens}")
    return rows.map(_prompt_batch, batched=True, remove_columns=rows.column_names,
                    fn_kwargs={"prompt_tokens": prompt_tokens}, desc="prompts from training rows")


def _prompt_batch(batch: dict[str, list], prompt_tokens: int) -> dict[str, list]:
    prompts = []
    for input_ids, labels in zip(batch["input_ids"], batch["labels"]):
        first_trained = next((i for i, label in enumerate(labels) if label != IGNORE_INDEX), len(labels))
        prompts.append(input_ids[:first_trained] if first_trained > 0 else input_ids[:prompt_tokens])
    return {"prompt_ids": prompts}


def _training_example(prompt_ids: list[int], response_ids: list[int], max_length: int) -> dict[str, list[int]]:
    # loss on the response only: labels = -100 on the prompt, the token itself on the response
    input_ids = (prompt_ids + response_ids)[:max_length]
    labels = ([IGNORE_INDEX] * len(prompt_ids) + response_ids)[:max_length]
    return {"input_ids": input_ids, "labels": labels}


def to_training_rows(ds: datasets.Dataset, max_length: int, *, num_proc: int | None = None) -> datasets.Dataset:
    """Training rows {input_ids, labels} (the data pipeline's format): input_ids = (prompt + response)[:max_length],
    labels -100 on the prompt. Rows left without a response token after truncation are dropped.
    Raises ValueError for max_length < 2 or missing prompt_ids / response_ids columns."""
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    missing = {"prompt_ids", "response_ids"} - set(ds.column_names)
    if missing:
        raise ValueError(f"the dataset lacks {', '.join(sorted(missing))} (columns: {', '.join(ds.column_names)}); "
                         "pass the output of generate_target_data")
    rows = ds.map(_training_batch, batched=True, remove_columns=ds.column_names, num_proc=num_proc,
                  fn_kwargs={"max_length": max_length}, desc="prompt + response rows")
    return rows.filter(lambda labels: any(t != IGNORE_INDEX for t in labels), input_columns="labels",
                       num_proc=num_proc, desc="keep rows with response tokens")


def _training_batch(batch: dict[str, list], max_length: int) -> dict[str, list]:
    examples = [_training_example(p, r, max_length) for p, r in zip(batch["prompt_ids"], batch["response_ids"])]
    return {"input_ids": [e["input_ids"] for e in examples], "labels": [e["labels"] for e in examples]}
