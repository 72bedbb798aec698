"""Sequence-level KD data: the target's own responses to prompts, generated once and stored with `datasets`.

    responses = generate_target_data(target, tokenizer, prompts, "data/target-responses", max_new_tokens=256,
                                     temperature=0.0, top_k=None, top_p=None, seed=0, batch_size=16)
    train_rows = to_training_rows(responses, max_length=1024)   # input_ids = prompt + response, labels on response

Prompt i is decoded with its own generator seeded with seed + i, so the responses do not depend on the shard size
or on where an interrupted run resumed. Decoding stops after the tokenizer's EOS (kept in response_ids) or after
max_new_tokens. What decodes them is a ResponseEngine (`generate_responses(prompts, seeds, sampling, batch_size)`);
the default, DecoderEngine, is this project's decoder:
  batch_size 1   one prompt at a time: with a draft, decode.speculative_generate (greedy: the same tokens as the
                 target alone; sampled: the same distribution, another random stream), else
                 decode.autoregressive_generate
  batch_size B   the target alone, B prompts at a time (decode.loop.batched: left padding, attention mask, positions of
                 real tokens, one generator per prompt); prompts of similar length share a batch. Greedy rows are
                 the batch-1 rows, and sampled rows draw from the same per-prompt seeds in the same order, so they
                 are too; the one exception is float rounding of padded shapes breaking a near-tie (an argmax, or
                 a draw between two tokens; decode/loop/batched.py), after which only that row differs.
The batch size is therefore not part of what the responses depend on: a folder can be resumed with another one.
With engine "vllm" (VLLMEngine, distill/data/target_vllm.py) vLLM generates each shard in one run in the serving venv.

Layout on disk (out_dir):
    target_data.json      what the responses depend on (target, tokenizer, prompts, sampling settings, seed, draft)
    shards/shard-00000/   `datasets` save_to_disk folders of shard_size prompts each, written atomically
An interrupted run resumes after the last complete shard; a finished one is returned as it is. out_dir holding
responses of other inputs raises CacheMismatchError (a ValueError) naming what differs.
"""
from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import datasets
import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from decode import autoregressive_generate, speculative_generate
from decode.inputs.checks import context_length
from decode.loop.batched import batched_generate
from decode.loop.drafters import DraftingKind
from decode.loop.packed_linear import packed_linears
from decode.loop.sampling import SamplingConfig
from decode.serving.vllm_engine import ServingError, check_context, find_vllm_python
from distill.data.rows import padding_id
from distill.data.shard_store import ShardStore
from distill.data.target_vllm import VLLMEngine
from distill.fingerprints import config_hash, full_weights_hash, token_lists_hash, vocab_hash
from distill.utils import IGNORE_INDEX, eval_mode

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
SHARD_PROMPTS = 64  # prompts per shard by default (rounded up to a multiple of the batch size)
METADATA_FILE = "target_data.json"
# token counts of a forward where F.linear may beat a packed product (the last rows of a batch, one prompt at a time,
# a verify pass at gamma <= 4): the packed layers keep F.linear there where it measures faster on this CPU
DECODE_ROWS = range(1, 6)
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
        return f"{config_hash(model)}-{full_weights_hash(model)}"
    settings = sorted((k, v) for k, v in vars(model).items() if isinstance(v, (bool, int, float, str)))
    return f"{type(model).__name__}{settings}"


def data_spec(target: nn.Module, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], sampling: Sampling,
              draft: nn.Module | Any | None, target_id: str, engine: str = "specdistill",
              vllm_dtype: str = "float32") -> dict[str, Any]:
    """Everything the generated responses depend on (JSON-ready); with vLLM also the dtype it held the target in."""
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
        **({"vllm_dtype": vllm_dtype} if engine == "vllm" else {}),
    }


def row_seed(sampling: Sampling, index: int) -> int:
    """The seed of prompt `index`'s generator: seed + index, whatever the shard, batch or resume point."""
    return sampling.seed + index


def generate_response(target: nn.Module, draft: nn.Module | Any | None, prompt: list[int], sampling: Sampling,
                      eos_token_id: int | None, seed: int, draft_kind: DraftingKind | None = None) -> list[int]:
    """The target's response to one prompt (EOS included when reached), decoded alone with a generator seeded
    `seed`: with the speculative decoder when there is a draft (a drafter, or a draft of ``draft_kind``), else plain
    decoding."""
    device = next(target.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    input_ids = torch.tensor([prompt], dtype=torch.long, device=device)  # [1, L]
    decode = dict(max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature, top_k=sampling.top_k,
                  top_p=sampling.top_p, eos_token_id=eos_token_id, generator=generator)
    if draft is None:
        return autoregressive_generate(target, input_ids, **decode).new_tokens
    return speculative_generate(target, draft, input_ids, gamma=sampling.gamma, kind=draft_kind, **decode).new_tokens


def check_batch_size(batch_size: int, draft: nn.Module | Any | None) -> None:
    """Raises ValueError unless batch_size >= 1, and 1 with a draft (the speculative decoder is batch-1)."""
    if batch_size < 1 or (draft is not None and batch_size > 1):
        raise ValueError(f"batch_size must be >= 1, and 1 with a draft (the speculative decoder runs one prompt at a "
                         f"time; batches decode with the target alone), got {batch_size}")


class ResponseEngine(Protocol):
    """What decodes the target's responses (this project's decoder: DecoderEngine), given one shard at a time."""

    def generate_responses(self, prompts: list[list[int]], seeds: list[int], sampling: Sampling,
                           batch_size: int) -> list[list[int]]:
        """Response i to prompts[i] (EOS kept when reached), sampled with seeds[i], decoding at most batch_size
        prompts at once."""
        ...


@dataclass(frozen=True)
class DecoderEngine:
    """This project's decoder on `target` (module docstring): batch 1 as decode does it, or batched plain decoding.
    A draft (the speculative decoder) needs batch size 1."""

    target: nn.Module
    draft: nn.Module | Any | None
    eos_token_id: int | None
    pad_token_id: int
    draft_kind: DraftingKind | None = None

    def generate_responses(self, prompts: list[list[int]], seeds: list[int], sampling: Sampling,
                           batch_size: int) -> list[list[int]]:
        check_batch_size(batch_size, self.draft)
        if batch_size == 1:
            return [generate_response(self.target, self.draft, p, sampling, self.eos_token_id, s, self.draft_kind)
                    for p, s in zip(prompts, seeds)]
        decoding = SamplingConfig(sampling.temperature, sampling.top_k, sampling.top_p)
        responses: list[list[int]] = [[] for _ in prompts]
        for batch in length_batches(prompts, batch_size):
            out = batched_generate(self.target, [prompts[j] for j in batch], max_new_tokens=sampling.max_new_tokens,
                                   sampling=decoding, seeds=[seeds[j] for j in batch],
                                   eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id)
            for j, response in zip(batch, out):
                responses[j] = response
        return responses


def length_batches(prompts: list[list[int]], batch_size: int) -> list[list[int]]:
    """Positions of the prompts in batches of batch_size, longest prompts first: prompts of similar length share a
    batch (less padding)."""
    order = sorted(range(len(prompts)), key=lambda j: (-len(prompts[j]), j))
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]


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
    batch_size: int = 1,
    shard_size: int | None = None,
    draft: nn.Module | Any | None = None,
    draft_kind: DraftingKind | None = None,
    gamma: int = 4,
    target_id: str = "",
    prompt_column: str = "prompt_ids",
    overwrite: bool = False,
    progress: bool = True,
    engine: ResponseEngine | str = "specdistill",
    vllm_python: Path | None = None,
    vllm_dtype: str = "float32",
    desc: str = "target responses",
) -> datasets.Dataset:
    """The target's responses to `prompts`, one row per prompt in order: index, prompt_ids, response_ids,
    prompt_text, response_text, stopped_at_eos.

    prompts: a Dataset with a `prompt_column` of token ids, or a list of token-id lists / 1-D tensors.
    draft: decodes speculatively with the target (a drafter, or a draft of ``draft_kind``).
    batch_size: prompts decoded at once (1 = one at a time; > 1 needs draft=None). shard_size: prompts per stored
    shard (None: 64 rounded up to a multiple of batch_size); the engine is given one shard at a time, so a batch
    never spans two shards. engine: what decodes: "specdistill" (DecoderEngine: our decoder on target and draft),
    "vllm" (VLLMEngine: vLLM in the serving venv, interpreter ``vllm_python``, the target in ``vllm_dtype``;
    ``target_id`` must then be the target's folder or hub id), or any ResponseEngine.
    Resumes an interrupted run after its last complete shard and returns a finished one without generating.
    Raises ValueError for an empty prompt or a bad setting, CacheMismatchError when out_dir holds responses of
    other inputs (overwrite=True deletes them). desc: the progress bar's label.
    """
    check_batch_size(batch_size, draft)
    shard_size = shard_size if shard_size is not None else math.ceil(SHARD_PROMPTS / batch_size) * batch_size
    if shard_size < 1 or max_new_tokens < 0 or gamma < 1:
        raise ValueError(f"shard_size and gamma must be >= 1 and max_new_tokens >= 0, got shard_size={shard_size}, "
                         f"gamma={gamma}, max_new_tokens={max_new_tokens}")
    if isinstance(engine, str) and engine not in ("specdistill", "vllm"):
        raise ValueError(f"engine must be 'specdistill' or 'vllm', got {engine!r}")
    engine_name = engine if isinstance(engine, str) else "specdistill"
    if engine == "vllm":  # ServingError naming `make serving` when there is no interpreter
        engine = VLLMEngine(find_vllm_python(vllm_python), target_id, tokenizer.eos_token_id, vllm_dtype)
    prompt_ids = prompt_lists(prompts, prompt_column)
    sampling = Sampling(max_new_tokens, temperature, top_k, top_p, seed, gamma)
    spec = data_spec(target, tokenizer, prompt_ids, sampling, draft, target_id, engine_name, vllm_dtype)
    if isinstance(engine, str):
        engine = DecoderEngine(target, draft, tokenizer.eos_token_id, padding_id(tokenizer), draft_kind)
    store = _store(out_dir)
    metadata = store.start(spec, num_rows=len(prompt_ids), rows_per_shard=shard_size, size_key="shard_size",
                           overwrite=overwrite)
    if metadata["complete"]:
        return load_target_data(store.root)
    check_room(target, tokenizer, prompt_ids, max_new_tokens, engine_name, desc)

    def make(shard: int, indices: range, scratch: Path) -> datasets.Dataset:
        responses = engine.generate_responses([prompt_ids[i] for i in indices],
                                              [row_seed(sampling, i) for i in indices], sampling, batch_size)
        bar.update(len(indices))
        rows = [_row(tokenizer, i, prompt_ids[i], r) for i, r in zip(indices, responses)]
        return datasets.Dataset.from_list(rows, features=FEATURES)

    # our decoder on CPU multiplies by oneDNN-packed weights meanwhile (docs/benchmarks/responses.md)
    decoding = (target, draft) if isinstance(engine, DecoderEngine) else ()
    with eval_mode(target), packed_linears(*decoding, tune_rows=DECODE_ROWS), \
            tqdm(total=len(prompt_ids), desc=desc, unit="prompt", disable=not progress) as bar:
        store.fill(metadata, len(prompt_ids), make, bar, size_key="shard_size")
    store.finish(metadata)
    return load_target_data(store.root)


def check_room(target: nn.Module, tokenizer: PreTrainedTokenizerBase, prompt_ids: Sequence[Sequence[int]],
               max_new_tokens: int, engine: str, desc: str) -> None:
    """The longest prompt and max_new_tokens against the target's context (decode.inputs.checks.context_length):
    vLLM would refuse the shard's max_model_len after its engine starts, so that is one line here (ServingError);
    our decoder answers past it after one warning (the target writes where it was not trained)."""
    context = context_length(getattr(target, "config", None), tokenizer)
    longest = max((len(ids) for ids in prompt_ids), default=0)
    if engine == "vllm":  # vLLM's max_model_len holds a few spare positions too (target_vllm.vllm_request)
        try:
            check_context(context, longest, max_new_tokens, flag="max_new_tokens")
        except ServingError as err:
            raise ServingError(f"{desc}: {err}") from None
    elif context is not None and longest + max_new_tokens > context:
        logger.warning("%s: the longest prompt (%d tokens) and max_new_tokens %d reach position %d, past the target's "
                       "context of %d: it writes where it was not trained", desc, longest, max_new_tokens,
                       longest + max_new_tokens, context)


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
