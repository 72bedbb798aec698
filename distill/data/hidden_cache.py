"""Hidden-state cache of EAGLE-3 heads: the frozen target's aux and final hidden states at every training position,
computed once (the offline mode of SpecForge and speculators).

    cache = build_hidden_cache(target, train_rows, "cache/hidden", aux_layers=[1, 2, 3], batch_size=8,
                               target_id="org/target")
    train_dataset = with_hidden_columns(train_rows, cache)       # + target_aux_hidden / target_final_hidden
    collator = HiddenStateCollator(DistillCollator(pad_id), cache.dtype)
    aux, final = cached_features(batch)                          # [B, T, k H'], [B, T, H'], as target_features

Layout on disk (out_dir):
    hidden_cache.json     what the cache was built from (HiddenCacheSpec) and how (shards, seconds, bytes per token)
    shards/shard-00000/   `datasets` save_to_disk folders; row i = training row i, in the dataset's order:
                          aux [T_i, k H'] (the hidden states entering the aux layers, concatenated), final [T_i, H']
                          (the last layer's normed output), in the storage dtype (bfloat16 as its uint16 bit patterns:
                          arrow has no bfloat16)
The teacher's logits are not stored: they are the target's lm_head applied to `final` (restricted to the head's draft
vocabulary, kinds.eagle3.loss.restricted_head), so training from the cache gives the online loss up to the
storage dtype's rounding of the hidden states, and a training step needs only a copy of the target's lm_head.
Bytes per token: (k + 1) H' values, 8 H' bytes in bfloat16 for k = 3 (32 KiB for H' = 4096, 4.5 KiB for 576).

Storage dtype: bfloat16 (default) holds a bfloat16 target's states exactly (the usual GPU case) and rounds a float32
target's to 8 significant bits (relative error <= 2**-9); float16 keeps 11 bits but overflows above 65504 (the
residual streams of large models carry such outliers); float32 is exact for float32 and bfloat16 targets, at twice
the bytes.

A cache is tied to (the target's config and every byte of its weights in the dtype they were loaded in, the aux layer
ids, the storage dtype, the input_ids and attention mask of every row in order): build_hidden_cache and
load_hidden_cache raise CacheMismatchError (a ValueError) naming what differs. Labels are not part of it. Hashing
every weight byte runs at ~0.9 GB/s on one CPU core (~18 s for an 8B bfloat16 target), at every start of a run.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from accelerate import PartialState
from torch import nn
from tqdm.auto import tqdm
from transformers import TrainingArguments

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
from distill.fingerprints import config_hash, dataset_hash, full_weights_hash
from distill.models.distributed import is_partitioned, whole_parameter
from distill.models.fsdp import generating_on
from distill.utils import eval_mode

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
METADATA_FILE = "hidden_cache.json"
ROWS_PER_SHARD = 1024
HIDDEN_COLUMNS = ("target_aux_hidden", "target_final_hidden")  # batch keys: [B, T, k H'], [B, T, H']
STORAGE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_ARROW_DTYPES = {"bfloat16": "uint16", "float16": "float16", "float32": "float32"}  # bfloat16 kept as its bits


# ---------------------------------------------------------------------------------------------------------------
# What a cache depends on
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HiddenCacheSpec:
    """Everything the cached values depend on; two builds with equal specs give the same cache."""

    target_id: str
    target_config_hash: str
    target_weights_hash: str  # every byte of every weight (fingerprints.full_weights_hash)
    target_dtype: str
    aux_layers: tuple[int, ...]
    hidden_size: int  # H'
    dtype: str  # storage dtype
    dataset_hash: str  # input_ids (and attention_mask) of every row, in order
    num_rows: int
    max_length: int  # longest row
    format_version: int = FORMAT_VERSION

    def as_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "aux_layers": list(self.aux_layers)}


_SPEC_MEANING = {
    "target_id": "target", "target_config_hash": "target config", "target_weights_hash": "target weights",
    "target_dtype": "target dtype", "aux_layers": "aux layer ids", "hidden_size": "target hidden size",
    "dtype": "storage dtype", "dataset_hash": "dataset tokens", "num_rows": "number of dataset rows",
    "max_length": "longest dataset row", "format_version": "cache format version",
}


def target_fingerprint(target: nn.Module) -> dict[str, Any]:
    """The target's part of a spec: config hash, the hash of every weight byte (a collective for a sharded target:
    each weight is gathered in turn, so every rank calls it), its dtype and hidden size."""
    return {"target_config_hash": config_hash(target),
            "target_weights_hash": full_weights_hash(target, whole_parameter),
            "target_dtype": str(next(target.parameters()).dtype).removeprefix("torch."),
            "hidden_size": target.config.get_text_config().hidden_size}


def hidden_cache_spec(target: nn.Module, dataset: datasets.Dataset, *, aux_layers: Sequence[int], target_id: str,
                      dtype: str = "bfloat16") -> HiddenCacheSpec:
    """The spec a cache of `dataset` under `target` would have (hashes every weight: see target_fingerprint).
    Raises ValueError for a bad dtype, an aux layer id the target lacks or a dataset without input_ids."""
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"dtype={dtype!r}; allowed values: {', '.join(STORAGE_DTYPES)}")
    layers = target.config.get_text_config().num_hidden_layers
    if not aux_layers or min(aux_layers) < 0 or max(aux_layers) >= layers:
        raise ValueError(f"aux layer ids {list(aux_layers)} must lie in 0..{layers - 1} (the target's layers)")
    if "input_ids" not in dataset.column_names:
        raise ValueError(f"the dataset has no input_ids column (columns: {', '.join(dataset.column_names)})")
    lengths = row_lengths(dataset)
    return HiddenCacheSpec(target_id=target_id, **target_fingerprint(target), aux_layers=tuple(aux_layers),
                           dtype=dtype, dataset_hash=dataset_hash(dataset), num_rows=len(dataset),
                           max_length=int(lengths.max()) if lengths.size else 0)


# ---------------------------------------------------------------------------------------------------------------
# Values: torch <-> what arrow stores
# ---------------------------------------------------------------------------------------------------------------

def _stored(values: torch.Tensor, dtype: str) -> np.ndarray:
    """values in the storage dtype as numpy (bfloat16 as its uint16 bit patterns)."""
    cast = values.to(STORAGE_DTYPES[dtype]).cpu()
    return cast.view(torch.int16).numpy().view(np.uint16) if dtype == "bfloat16" else cast.numpy()


def _tensor(stored: np.ndarray, dtype: str) -> torch.Tensor:
    """The inverse of _stored: a torch tensor in the storage dtype."""
    if dtype == "bfloat16":  # (numpy formatting may widen the uint16 bits: narrowed back first)
        return torch.from_numpy(np.ascontiguousarray(stored, dtype=np.uint16).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(stored, dtype=dtype))


def pad_hidden(rows: Sequence[np.ndarray], width: int, dtype: str) -> torch.Tensor:
    """Right-pad stored rows [T_i, D] into [B, width, D] in the storage dtype (pads are zeros: no loss reads them).
    Raises ValueError when a row is longer than width."""
    size = rows[0].shape[-1] if rows else 0
    out = torch.zeros(len(rows), width, size, dtype=STORAGE_DTYPES[dtype])  # [B, W, D]
    for i, row in enumerate(rows):
        if row.shape[0] > width:
            raise ValueError(f"cached row {i} has {row.shape[0]} positions, more than the batch width {width}")
        out[i, :row.shape[0]] = _tensor(row, dtype)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Build, load
# ---------------------------------------------------------------------------------------------------------------

def _features(spec: dict[str, Any]) -> datasets.Features:
    arrow = _ARROW_DTYPES[spec["dtype"]]
    width = spec["hidden_size"]
    return datasets.Features({"aux": datasets.Array2D((None, len(spec["aux_layers"]) * width), arrow),
                              "final": datasets.Array2D((None, width), arrow)})


def _row_maker(target: nn.Module, dataset: datasets.Dataset, aux_layers: Sequence[int], batch_size: int,
               dtype: str) -> Callable[[range, tqdm], Iterator[dict[str, np.ndarray]]]:
    """make_rows for build_row_shards: the target's features of `rows`, one stored row at a time."""
    device = next(target.parameters()).device

    @torch.no_grad()
    def make_rows(rows: range, bar: tqdm) -> Iterator[dict[str, np.ndarray]]:
        for input_ids, attention_mask, lengths in padded_batches(dataset, rows, batch_size, device):
            aux, final = target_features(target, input_ids, attention_mask, list(aux_layers))  # [B,T,kH'], [B,T,H']
            aux, final = _stored(aux, dtype), _stored(final, dtype)
            for i, length in enumerate(lengths):
                yield {"aux": aux[i, :length], "final": final[i, :length]}
            bar.update(len(lengths))

    return make_rows


def build_hidden_cache(
    target: nn.Module,
    dataset: datasets.Dataset,
    out_dir: str | os.PathLike,
    *,
    aux_layers: Sequence[int],
    batch_size: int,
    target_id: str,
    dtype: str = "bfloat16",
    rows_per_shard: int = ROWS_PER_SHARD,
    overwrite: bool = False,
    progress: bool = True,
    spec: HiddenCacheSpec | None = None,
) -> HiddenStateCache:
    """Run the target once over every row of `dataset` (input_ids [+ attention_mask]) and store its aux hidden states
    (at `aux_layers`) and final hidden states in `dtype`.

    Returns the existing cache untouched when out_dir already holds a complete one built from the same inputs, and
    resumes after the last complete shard (rows_per_shard rows each) when a build was interrupted. `spec`: the one
    hidden_cache_spec gives for these inputs, when the caller has it already (None: computed here). Raises ValueError
    for a bad dtype, batch size or aux layer id, and CacheMismatchError when out_dir holds a cache of other inputs
    (unless overwrite=True, which deletes it).
    """
    if batch_size < 1 or rows_per_shard < 1:
        raise ValueError(f"batch_size and rows_per_shard must be >= 1, got {batch_size}, {rows_per_shard}")
    spec = spec or hidden_cache_spec(target, dataset, aux_layers=aux_layers, target_id=target_id, dtype=dtype)
    store = _store(out_dir)
    metadata = store.start(spec.as_json(), num_rows=len(dataset), rows_per_shard=rows_per_shard, overwrite=overwrite,
                           extra={"dataset_fingerprint": getattr(dataset, "_fingerprint", None)})
    if metadata["complete"]:
        return _open(store, metadata)
    make_rows = _row_maker(target, dataset, spec.aux_layers, batch_size, spec.dtype)
    values = (len(metadata["aux_layers"]) + 1) * metadata["hidden_size"]  # per token: k aux layers' and the final
    metadata = build_row_shards(store, metadata, dataset, target, make_rows, _features(metadata),
                                desc="target hidden states", progress=progress,
                                bytes_per_token=values * STORAGE_DTYPES[metadata["dtype"]].itemsize)
    _log_size(store, metadata)
    return _open(store, metadata)


def _log_size(store: ShardStore, metadata: dict[str, Any]) -> None:
    """Logs bytes per token: (k + 1) H' values in the storage dtype, and as measured on disk."""
    stored = metadata["bytes_per_token"]
    values = stored // STORAGE_DTYPES[metadata["dtype"]].itemsize
    on_disk = metadata["bytes_on_disk"] / max(metadata["num_positions"], 1)
    logger.info("hidden-state cache %s: %d positions of %d rows, %d bytes per token (%d values in %s; %.0f on disk), "
                "%.1f MiB, built in %.1f s", store.root, metadata["num_positions"], metadata["num_rows"], stored,
                values, metadata["dtype"], on_disk, metadata["bytes_on_disk"] / 2**20, metadata["build_seconds"])


def _store(path: str | os.PathLike) -> ShardStore:
    return ShardStore(Path(path), METADATA_FILE, "hidden-state cache", _SPEC_MEANING)


def _open(store: ShardStore, metadata: dict[str, Any]) -> HiddenStateCache:
    return HiddenStateCache(store.root, metadata, open_rows(store, metadata, _features(metadata)))


def load_hidden_cache(
    path: str | os.PathLike,
    *,
    target: nn.Module | None = None,
    target_id: str | None = None,
    dataset: datasets.Dataset | None = None,
    aux_layers: Sequence[int] | None = None,
    dtype: str | None = None,
) -> HiddenStateCache:
    """Open a complete cache (memory-mapped), checking it against whatever of target (every weight byte is hashed) /
    target_id / dataset / aux_layers / dtype is given. Raises FileNotFoundError (no cache, or an unfinished build)
    and CacheMismatchError naming every difference."""
    wanted: dict[str, Any] = {"format_version": FORMAT_VERSION}
    if target_id is not None:
        wanted["target_id"] = target_id
    if target is not None:
        wanted.update(target_fingerprint(target))
    if dataset is not None:
        wanted.update(num_rows=len(dataset), dataset_hash=dataset_hash(dataset))
    if aux_layers is not None:
        wanted["aux_layers"] = list(aux_layers)
    if dtype is not None:
        wanted["dtype"] = dtype
    store = _store(path)
    return _open(store, open_complete(store, wanted, "build_hidden_cache"))


# ---------------------------------------------------------------------------------------------------------------
# Reading: rows, Trainer plumbing
# ---------------------------------------------------------------------------------------------------------------

class HiddenStateCache:
    """An opened cache: `rows` (a memory-mapped Dataset: aux [T, k H'], final [T, H'] stored) and `metadata`."""

    def __init__(self, path: Path, metadata: dict[str, Any], rows: datasets.Dataset) -> None:
        self.path, self.metadata, self.rows = Path(path), metadata, rows
        self._numpy = rows.with_format("numpy")

    @property
    def dtype(self) -> str:
        """The storage dtype's name (a key of STORAGE_DTYPES)."""
        return self.metadata["dtype"]

    @property
    def aux_layers(self) -> list[int]:
        return list(self.metadata["aux_layers"])

    def __len__(self) -> int:
        return len(self.rows)

    def features(self, indices: Sequence[int], width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(aux [B, W, k H'], final [B, W, H']) of rows `indices` in the storage dtype, right-padded with zeros to
        width W (default: the longest of them)."""
        rows = [self._numpy[int(i)] for i in indices]
        width = max((r["final"].shape[0] for r in rows), default=0) if width is None else width
        return (pad_hidden([r["aux"] for r in rows], width, self.dtype),
                pad_hidden([r["final"] for r in rows], width, self.dtype))


def with_hidden_columns(dataset: datasets.Dataset, cache: HiddenStateCache, *, check: bool = True) -> datasets.Dataset:
    """`dataset` plus columns target_aux_hidden / target_final_hidden (stored [T, D] numpy arrays per row) for the
    Trainer's dataloader. Rows are matched by position: `dataset` must be the one the cache was built from, in the
    same order. Raises CacheMismatchError when its rows differ (checked by hashing unless check=False)."""
    return attach_columns(dataset, cache.rows, dict(zip(("aux", "final"), HIDDEN_COLUMNS)), what="hidden-state cache",
                          path=cache.path, built_from=cache.metadata["dataset_hash"], check=check)


@dataclass
class HiddenStateCollator:
    """Wraps the trainer's collator: adds target_aux_hidden [B, T, k H'] and target_final_hidden [B, T, H'] in the
    storage dtype `dtype`, padded to the batch's input_ids width. Raises ValueError when a row's cache and tokens
    differ in length."""

    base: Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]]
    dtype: str

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        check_row_lengths(rows, HIDDEN_COLUMNS[1], "hidden-state")
        batch = self.base([{k: v for k, v in row.items() if k not in HIDDEN_COLUMNS} for row in rows])
        width = batch["input_ids"].shape[1]
        return {**batch, **{name: pad_hidden([r[name] for r in rows], width, self.dtype) for name in HIDDEN_COLUMNS}}


@torch.no_grad()
def target_features(target: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    aux_layers: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of the frozen target: (its aux hidden states [B, T, k * H'], its final normed hidden states
    [B, T, H'], from which its lm_head gives its logits)."""
    outputs = target.base_model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                                use_cache=False)
    aux = torch.cat([outputs.hidden_states[i] for i in aux_layers], dim=-1)  # index i: the stream entering layer i
    return aux, outputs.last_hidden_state


def cached_features(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(aux [B, T, k H'], final [B, T, H']) from a batch made by HiddenStateCollator, as target_features returns
    them; None for a batch without them."""
    if HIDDEN_COLUMNS[0] not in batch:
        return None
    return batch[HIDDEN_COLUMNS[0]], batch[HIDDEN_COLUMNS[1]]


# ---------------------------------------------------------------------------------------------------------------
# In a run: the tokenise step (distill.data.sources.training_rows)
# ---------------------------------------------------------------------------------------------------------------

def with_hidden_state_cache(rows: datasets.Dataset, collator: Callable[[list[dict]], Any], target: nn.Module,
                            out_dir: str, *, aux_layers: Sequence[int], dtype: str, target_id: str, batch_size: int,
                            args: TrainingArguments) -> tuple[datasets.Dataset, HiddenStateCollator]:
    """The rows with the target's cached hidden states attached, and a collator that pads them; the cache is built
    into out_dir on first use (resumed if interrupted). Every process calls it. A whole target builds on the main
    process first (TrainingArguments.main_process_first; under FSDP2 on its device meanwhile); a ZeRO-3-partitioned
    one on every process together, since each of its forwards is a collective (the main process writes). Raises
    CacheMismatchError when out_dir holds a cache of another target, other aux layers, dtype or rows."""
    spec = hidden_cache_spec(target, rows, aux_layers=aux_layers, target_id=target_id, dtype=dtype)
    build = dict(aux_layers=aux_layers, batch_size=batch_size, target_id=target_id, dtype=dtype, spec=spec,
                 progress=PartialState().is_main_process)
    if is_partitioned(target):
        cache = _build_together(target, rows, out_dir, build)
    else:
        with args.main_process_first(desc="hidden-state cache"), generating_on(target, args.device):
            cache = build_hidden_cache(target, rows, out_dir, **build)
    # built (or checked) against these very rows just now: no second hash
    return with_hidden_columns(rows, cache, check=False), HiddenStateCollator(collator, cache.dtype)


def _build_together(target: nn.Module, rows: datasets.Dataset, out_dir: str,
                    build: dict[str, Any]) -> HiddenStateCache:
    """build_hidden_cache with a partitioned target: the main process builds and writes; every other process runs
    the same forwards (the shards the main process found missing, batch by batch) and discards them."""
    from accelerate.utils import broadcast_object_list

    state = PartialState()
    missing = None
    if state.is_main_process:  # which shards the build will compute: decided before anything is written
        store = _store(out_dir)
        metadata = store.start(build["spec"].as_json(), num_rows=len(rows), rows_per_shard=ROWS_PER_SHARD)
        missing = [] if metadata["complete"] else [
            (i * metadata["rows_per_shard"], min((i + 1) * metadata["rows_per_shard"], len(rows)))
            for i in range(metadata["num_shards"]) if not store.shard_path(i).is_dir()]
    missing = broadcast_object_list([missing])[0]
    cache = None
    if state.is_main_process:
        cache = build_hidden_cache(target, rows, out_dir, **build)
    else:
        make_rows = _row_maker(target, rows, build["aux_layers"], build["batch_size"], build["dtype"])
        with eval_mode(target), tqdm(disable=True) as bar:
            for start, stop in missing:
                for _ in make_rows(range(start, stop), bar):
                    pass
    state.wait_for_everyone()
    return cache if cache is not None else load_hidden_cache(out_dir)
