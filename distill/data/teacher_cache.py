"""Cached teacher: the target's top-k next-token log-probabilities for every training position, computed once.

Training from the cache skips the target's forward pass entirely (the target need not even be loaded):
    cache = build_teacher_cache(target, train_rows, "cache/teacher-k32", k=32, batch_size=8,
                                target_id="org/target", tokenizer=tokenizer)
    train_dataset = with_teacher_columns(train_rows, cache)        # + teacher_topk_ids / teacher_topk_logprobs
    collator = TeacherCollator(DistillCollator(tokenizer.pad_token_id))
    teacher = sparse_teacher_from_batch(batch)                     # SparseTeacher for positions [:, :-1]

Layout on disk (out_dir):
    teacher_cache.json     what the cache was built from (CacheSpec) and how (shards, sizes, seconds)
    shards/shard-00000/    `datasets` save_to_disk folders; row i = training row i, in the dataset's order:
                           topk_ids [T_i, k] int32, topk_logprobs [T_i, k] float16 (or float32)
Position t of a row holds log p_target(x_{t+1} = id | x_<=t) for the k most likely ids, sorted, at temperature 1,
normalised over the target's full vocabulary (so 1 - sum exp(topk_logprobs) is the tail mass).

float16 log-probabilities (the default) halve their bytes (6 instead of 8 bytes per cached (position, id)); a
log-probability is then off by at most |log p| * 2**-11, i.e. p by < 0.05% relative where log p > -1 and < 0.5%
where log p > -10; the tail mass 1 - sum p inherits about entropy * 5e-4 of absolute error. bucketize renormalises
over the k + 1 buckets, so the loss sees a valid distribution either way. Use float32 where exactness matters
(tests compare against the online teacher with it).

A cache is tied to (target config + weights, tokenizer vocabulary, input_ids of every row in order, k, dtype):
load_teacher_cache and build_teacher_cache raise CacheMismatchError (a ValueError) naming what differs.
Labels are not part of it: the teacher's distributions depend on the tokens only.
"""
from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from decode.inputs.vocab import lm_head_rows
from distill.data.row_cache import (
    attach_columns,
    build_row_shards,
    check_row_lengths,
    open_complete,
    open_rows,
    padded_batches,
    row_lengths,
)
from distill.data.shard_store import ShardStore
from distill.fingerprints import config_hash, dataset_hash, full_weights_hash, vocab_hash
from distill.losses.divergences import SparseTeacher

FORMAT_VERSION = 1
METADATA_FILE = "teacher_cache.json"
TEACHER_COLUMNS = ("teacher_topk_ids", "teacher_topk_logprobs")
LOGPROB_DTYPES = ("float16", "float32")


# ---------------------------------------------------------------------------------------------------------------
# What a cache depends on
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CacheSpec:
    """Everything the cached values depend on; two builds with equal specs give the same cache."""

    target_id: str
    target_config_hash: str
    target_weights_hash: str
    tokenizer_vocab_hash: str
    vocab_size: int  # V: rows of the target's lm_head
    k: int
    logprob_dtype: str
    dataset_hash: str  # input_ids (and attention_mask) of every row, in order
    num_rows: int
    max_length: int  # longest row
    temperature: float = 1.0
    format_version: int = FORMAT_VERSION


_SPEC_MEANING = {
    "target_id": "target", "target_config_hash": "target config", "target_weights_hash": "target weights",
    "tokenizer_vocab_hash": "tokenizer vocabulary", "vocab_size": "target vocabulary size (lm_head rows)",
    "k": "top-k width", "logprob_dtype": "log-probability dtype", "dataset_hash": "dataset tokens",
    "num_rows": "number of dataset rows", "max_length": "longest dataset row", "temperature": "temperature",
    "format_version": "cache format version",
}


def cache_spec(target: nn.Module, dataset: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, *, k: int,
               target_id: str, logprob_dtype: str = "float16") -> CacheSpec:
    """The CacheSpec a cache of `dataset` under `target` would have. Raises ValueError for a bad k or dtype."""
    vocab = lm_head_rows(target)
    if not 1 <= k <= vocab:
        raise ValueError(f"k={k} is not a valid top-k width: the target's vocabulary has {vocab} tokens "
                         f"(lm_head rows), so k must be in [1, {vocab}]")
    if logprob_dtype not in LOGPROB_DTYPES:
        raise ValueError(f"logprob_dtype={logprob_dtype!r}; allowed values: {', '.join(LOGPROB_DTYPES)}")
    if "input_ids" not in dataset.column_names:
        raise ValueError(f"the dataset has no input_ids column (columns: {', '.join(dataset.column_names)})")
    lengths = row_lengths(dataset)
    return CacheSpec(target_id=target_id, target_config_hash=config_hash(target),
                     target_weights_hash=full_weights_hash(target), tokenizer_vocab_hash=vocab_hash(tokenizer),
                     vocab_size=vocab, k=k, logprob_dtype=logprob_dtype, dataset_hash=dataset_hash(dataset),
                     num_rows=len(dataset), max_length=int(lengths.max()) if lengths.size else 0)


# ---------------------------------------------------------------------------------------------------------------
# The teacher's top-k, chunk by chunk
# ---------------------------------------------------------------------------------------------------------------

@torch.no_grad()
def teacher_topk(target: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, k: int,
                 chunk_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k log-probabilities of the target at every position: ([B, T, k] int32 ids, [B, T, k] float32).

    Hidden states come from the target's base model; the lm_head runs on chunk_size real (mask 1) positions at a
    time, so at most [chunk_size, V] float32 logits exist at once. Padded positions hold ids 0 and -inf.
    """
    batch, width = input_ids.shape
    hidden = target.base_model(input_ids=input_ids, attention_mask=attention_mask,
                               use_cache=False).last_hidden_state  # [B, T, H]
    keep = attention_mask.reshape(-1).bool().nonzero(as_tuple=True)[0]  # [n]
    rows = hidden.reshape(batch * width, -1)[keep]  # [n, H]
    head = target.get_output_embeddings()
    ids = torch.zeros(batch * width, k, dtype=torch.int32, device=hidden.device)  # [B*T, k]
    logprobs = torch.full((batch * width, k), -math.inf, dtype=torch.float32, device=hidden.device)  # [B*T, k]
    for start in range(0, rows.shape[0], chunk_size):
        top = SparseTeacher.from_logits(head(rows[start:start + chunk_size]), k)  # log_softmax in float32, top-k
        where = keep[start:start + chunk_size]
        ids[where] = top.topk_ids.to(torch.int32)
        logprobs[where] = top.topk_logprobs.float()
    return ids.view(batch, width, k), logprobs.view(batch, width, k)


def _shard_rows(target: nn.Module, dataset: datasets.Dataset, rows: range, k: int, batch_size: int,
                chunk_size: int, logprob_dtype: str, bar: tqdm) -> Iterator[dict[str, np.ndarray]]:
    device = next(target.parameters()).device
    for input_ids, attention_mask, lengths in padded_batches(dataset, rows, batch_size, device):
        ids, logprobs = teacher_topk(target, input_ids, attention_mask, k, chunk_size)
        ids, logprobs = ids.cpu().numpy(), logprobs.cpu().numpy().astype(logprob_dtype)
        for i, length in enumerate(lengths):
            yield {"topk_ids": ids[i, :length], "topk_logprobs": logprobs[i, :length]}
        bar.update(len(lengths))


# ---------------------------------------------------------------------------------------------------------------
# Build, load
# ---------------------------------------------------------------------------------------------------------------

def _features(k: int, logprob_dtype: str) -> datasets.Features:
    return datasets.Features({"topk_ids": datasets.Array2D((None, k), "int32"),
                              "topk_logprobs": datasets.Array2D((None, k), logprob_dtype)})


def build_teacher_cache(
    target: nn.Module,
    dataset: datasets.Dataset,
    out_dir: str | os.PathLike,
    *,
    k: int,
    batch_size: int,
    target_id: str,
    tokenizer: PreTrainedTokenizerBase,
    logprob_dtype: str = "float16",
    chunk_size: int = 1024,
    rows_per_shard: int = 1024,
    overwrite: bool = False,
    progress: bool = True,
) -> TeacherCache:
    """Run the target once over every row of `dataset` (input_ids [+ attention_mask]) and store its top-k.

    Returns the existing cache untouched when out_dir already holds a complete one built from the same inputs,
    and resumes after the last complete shard (rows_per_shard rows each) when a build was interrupted.
    Raises ValueError for k outside [1, V] (V = the target's lm_head rows), a bad dtype or batch size, and
    CacheMismatchError when out_dir holds a cache of other inputs (unless overwrite=True, which deletes it).
    """
    if batch_size < 1 or rows_per_shard < 1 or chunk_size < 1:
        raise ValueError(f"batch_size, rows_per_shard and chunk_size must be >= 1, got {batch_size}, "
                         f"{rows_per_shard}, {chunk_size}")
    spec = dataclasses.asdict(cache_spec(target, dataset, tokenizer, k=k, target_id=target_id,
                                         logprob_dtype=logprob_dtype))
    store = _store(out_dir)
    metadata = store.start(spec, num_rows=len(dataset), rows_per_shard=rows_per_shard, overwrite=overwrite,
                           extra={"target_dtype": str(next(target.parameters()).dtype).removeprefix("torch."),
                                  "dataset_fingerprint": getattr(dataset, "_fingerprint", None)})
    if metadata["complete"]:
        return load_teacher_cache(store.root)

    def make_rows(rows: range, bar: tqdm) -> Iterator[dict[str, np.ndarray]]:
        return _shard_rows(target, dataset, rows, k, batch_size, chunk_size, logprob_dtype, bar)

    metadata = build_row_shards(store, metadata, dataset, target, make_rows, _features(k, logprob_dtype),
                                desc=f"teacher top-{k}", progress=progress)
    return _open(store, metadata)


def _store(path: str | os.PathLike) -> ShardStore:
    return ShardStore(Path(path), METADATA_FILE, "teacher cache", _SPEC_MEANING)


def _open(store: ShardStore, metadata: dict[str, Any]) -> TeacherCache:
    return TeacherCache(store.root, metadata, open_rows(store, metadata,
                                                        _features(metadata["k"], metadata["logprob_dtype"])))


def load_teacher_cache(
    path: str | os.PathLike,
    *,
    target: nn.Module | None = None,
    target_id: str | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    dataset: datasets.Dataset | None = None,
    k: int | None = None,
) -> TeacherCache:
    """Open a complete cache (memory-mapped), checking it against whatever of target / target_id / tokenizer /
    dataset / k is given. Raises FileNotFoundError (no cache, or an unfinished build) and CacheMismatchError
    naming every difference."""
    wanted: dict[str, Any] = {"format_version": FORMAT_VERSION}
    if target_id is not None:
        wanted["target_id"] = target_id
    if target is not None:
        wanted.update(target_config_hash=config_hash(target), target_weights_hash=full_weights_hash(target),
                      vocab_size=lm_head_rows(target))
    if tokenizer is not None:
        wanted["tokenizer_vocab_hash"] = vocab_hash(tokenizer)
    if dataset is not None:
        wanted.update(num_rows=len(dataset), dataset_hash=dataset_hash(dataset))
    if k is not None:
        wanted["k"] = k
    store = _store(path)
    return _open(store, open_complete(store, wanted, "build_teacher_cache"))


# ---------------------------------------------------------------------------------------------------------------
# Reading: batches of rows as SparseTeachers, and Trainer plumbing
# ---------------------------------------------------------------------------------------------------------------

def pad_topk(ids_rows: Sequence[Any], logprob_rows: Sequence[Any], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad rows of [T_i, k] top-k into ([B, width, k] long ids, [B, width, k] float32 log-probs).

    Padded positions get ids 0..k-1 with log-probability -log k (a valid distribution, masked out by the loss).
    Raises ValueError when a row is longer than width or the rows have different k.
    """
    ids_arrays = [np.asarray(r) for r in ids_rows]
    logprob_arrays = [np.asarray(r, dtype=np.float32) for r in logprob_rows]
    widths = {a.shape[-1] for a in ids_arrays if a.ndim == 2}
    if len(widths) != 1:
        raise ValueError(f"cached top-k rows must all be [T, k] with one k, got k values {sorted(widths)}")
    k = widths.pop()
    ids = torch.arange(k, dtype=torch.long).expand(len(ids_arrays), width, k).clone()  # [B, W, k]
    logprobs = torch.full((len(ids_arrays), width, k), -math.log(k), dtype=torch.float32)  # [B, W, k]
    for i, (row_ids, row_logprobs) in enumerate(zip(ids_arrays, logprob_arrays)):
        if row_ids.shape[0] > width:
            raise ValueError(f"cached row {i} has {row_ids.shape[0]} positions, more than the batch width {width}")
        ids[i, :row_ids.shape[0]] = torch.from_numpy(row_ids.astype(np.int64))
        logprobs[i, :row_ids.shape[0]] = torch.from_numpy(row_logprobs)
    return ids, logprobs


class TeacherCache:
    """An opened cache: `rows` (a memory-mapped Dataset: topk_ids [T, k], topk_logprobs [T, k]) and `metadata`."""

    def __init__(self, path: Path, metadata: dict[str, Any], rows: datasets.Dataset) -> None:
        self.path, self.metadata, self.rows = Path(path), metadata, rows
        self._numpy = rows.with_format("numpy")

    @property
    def k(self) -> int:
        return self.metadata["k"]

    @property
    def vocab_size(self) -> int:
        return self.metadata["vocab_size"]

    def __len__(self) -> int:
        return len(self.rows)

    def topk(self, indices: Sequence[int], width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """([B, W, k] long ids, [B, W, k] float32 log-probs) of rows `indices`, right-padded to width W
        (default: the longest of them)."""
        rows = [self._numpy[int(i)] for i in indices]
        width = max((r["topk_ids"].shape[0] for r in rows), default=0) if width is None else width
        return pad_topk([r["topk_ids"] for r in rows], [r["topk_logprobs"] for r in rows], width)

    def sparse_teacher(self, indices: Sequence[int], width: int | None = None) -> SparseTeacher:
        """SparseTeacher over the flattened [B * W] positions of rows `indices` (row b, position t at b * W + t;
        position t predicts token t + 1). Pads need mask False in the loss."""
        ids, logprobs = self.topk(indices, width)
        return SparseTeacher(topk_ids=ids.reshape(-1, self.k), topk_logprobs=logprobs.reshape(-1, self.k))


def with_teacher_columns(dataset: datasets.Dataset, cache: TeacherCache, *, check: bool = True) -> datasets.Dataset:
    """`dataset` plus columns teacher_topk_ids / teacher_topk_logprobs ([T, k] numpy arrays per row), for the
    Trainer's dataloader (needs remove_unused_columns=False). Rows are matched by position, so `dataset` must be
    the one the cache was built from, in the same order (shuffling is the dataloader's job).
    Raises CacheMismatchError when its rows differ from the cache's (checked by hashing unless check=False)."""
    return attach_columns(dataset, cache.rows, dict(zip(("topk_ids", "topk_logprobs"), TEACHER_COLUMNS)),
                          what="teacher cache", path=cache.path, built_from=cache.metadata["dataset_hash"],
                          check=check)


@dataclass
class TeacherCollator:
    """Wraps the trainer's collator: adds teacher_topk_ids [B, T, k] long and teacher_topk_logprobs [B, T, k]
    float32, padded to the batch's input_ids width. Raises ValueError when a row's cache and tokens differ in
    length."""

    base: Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]]

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        check_row_lengths(rows, TEACHER_COLUMNS[0], "teacher")
        batch = self.base([{k: v for k, v in row.items() if k not in TEACHER_COLUMNS} for row in rows])
        ids, logprobs = pad_topk([r[TEACHER_COLUMNS[0]] for r in rows], [r[TEACHER_COLUMNS[1]] for r in rows],
                                 batch["input_ids"].shape[1])
        return {**batch, TEACHER_COLUMNS[0]: ids, TEACHER_COLUMNS[1]: logprobs}


def sparse_teacher_from_batch(batch: dict[str, torch.Tensor], *, shift: bool = True) -> SparseTeacher:
    """SparseTeacher from a batch made by TeacherCollator. shift=True keeps positions [:, :-1] (B * (T - 1) rows),
    matching the trainer's draft_hidden[:, :-1] / labels[:, 1:]; shift=False keeps all B * T positions."""
    ids, logprobs = batch[TEACHER_COLUMNS[0]], batch[TEACHER_COLUMNS[1]]  # [B, T, k]
    if shift:
        ids, logprobs = ids[:, :-1], logprobs[:, :-1]
    k = ids.shape[-1]
    return SparseTeacher(topk_ids=ids.reshape(-1, k), topk_logprobs=logprobs.reshape(-1, k))
