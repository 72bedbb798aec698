"""What the caches of one entry per training row share: the target's top-k (distill/data/teacher_cache.py) and its
hidden states (distill/data/hidden_cache.py), both builds of a ShardStore (distill/data/shard_store.py).

Row i of such a cache belongs to training row i, in the dataset's order, and holds one entry per token position:
  padded_batches   right-padded batches of rows for the target (each row's first T_i positions are kept)
  build_row_shards every shard not written yet, then the build marked complete with its size and time
  open_complete    a finished build's metadata, checked against what the caller has (FileNotFoundError,
                   CacheMismatchError naming every difference)
  attach_columns   the cached columns next to the rows, for the Trainer's dataloader; rows are matched by position,
                   so the rows must be those the cache was built from, in the same order (shuffling is the
                   dataloader's job)
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow.compute as pc
import torch
from torch import nn
from tqdm.auto import tqdm

from decode.loop.packed_linear import packed_linears
from distill.data.shard_store import CacheMismatchError, ShardStore
from distill.fingerprints import dataset_hash
from distill.utils import eval_mode

# the rows of one shard, as dicts of numpy arrays: (rows of the dataset, the progress bar to move on) -> rows
RowMaker = Callable[[range, tqdm], Iterator[dict[str, np.ndarray]]]


def row_lengths(dataset: datasets.Dataset) -> np.ndarray:
    """T_i, the input_ids length of every row, [N] int64 (arrow, fast)."""
    lengths = [pc.list_value_length(t.column("input_ids")).to_numpy(zero_copy_only=False)
               for t in dataset.with_format("arrow").iter(batch_size=16384)]
    return np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)


def padded_batches(dataset: datasets.Dataset, rows: range, batch_size: int,
                   device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor, list[int]]]:
    """Right-padded (input_ids [B, T], attention_mask [B, T], lengths) over `rows` of the dataset."""
    has_mask = "attention_mask" in dataset.column_names
    dataset = dataset.with_format(None)  # python lists whatever the caller's format
    for start in range(rows.start, rows.stop, batch_size):
        chunk = dataset[start:min(start + batch_size, rows.stop)]
        lengths = [len(ids) for ids in chunk["input_ids"]]
        input_ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)  # [B, T]
        attention_mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)  # [B, T]
        for i, ids in enumerate(chunk["input_ids"]):
            input_ids[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, :len(ids)] = torch.tensor(chunk["attention_mask"][i]) if has_mask else 1
        yield input_ids.to(device), attention_mask.to(device), lengths


def build_row_shards(store: ShardStore, metadata: dict[str, Any], dataset: datasets.Dataset, model: nn.Module,
                     make_rows: RowMaker, features: datasets.Features, *, desc: str,
                     progress: bool, **summary: Any) -> dict[str, Any]:
    """Write every shard of `store` not on disk yet (shard s: the rows make_rows yields for its rows of `dataset`,
    written by `datasets` in batches of rows into a scratch folder), with `model` in eval mode meanwhile; then mark
    the build complete with num_positions, build_seconds, bytes_on_disk and the caller's `summary` keys. Returns the
    metadata."""

    def make(index: int, rows: range, scratch: Path) -> datasets.Dataset:
        return datasets.Dataset.from_generator(make_rows, features=features, gen_kwargs={"rows": rows, "bar": bar},
                                               cache_dir=str(scratch),
                                               fingerprint=f"{stem}-{metadata['dataset_hash']}-{index}")

    stem = Path(store.metadata_file).stem
    started = time.perf_counter()
    # a forward of whole rows on CPU: oneDNN-packed weights meanwhile (docs/benchmarks/hidden_cache.md)
    with eval_mode(model), packed_linears(model), \
            tqdm(total=len(dataset), desc=desc, unit="row", disable=not progress) as bar:
        store.fill(metadata, len(dataset), make, bar)
    return store.finish(metadata, num_positions=int(row_lengths(dataset).sum()),
                        build_seconds=round(time.perf_counter() - started, 3), bytes_on_disk=store.bytes_on_disk(),
                        **summary)


def open_rows(store: ShardStore, metadata: dict[str, Any], features: datasets.Features) -> datasets.Dataset:
    """Every row of a complete build, memory-mapped, in order (an empty dataset with `features` when it has none)."""
    shards = store.load_shards(metadata)
    return datasets.concatenate_datasets(shards) if shards else datasets.Dataset.from_dict(
        {name: [] for name in features}, features=features)


def open_complete(store: ShardStore, wanted: Mapping[str, Any], builder: str) -> dict[str, Any]:
    """The metadata of the complete build in `store`, checked against the `wanted` spec values.

    Raises FileNotFoundError (nothing there, or an unfinished build: `builder` names the function that builds or
    resumes it) and CacheMismatchError naming every difference."""
    metadata = store.read_metadata()
    if metadata is None:
        raise FileNotFoundError(f"no {store.what} at {store.root} (missing {store.metadata_file}); build it with "
                                f"{builder}")
    if not metadata.get("complete"):
        raise FileNotFoundError(f"the {store.what} at {store.root} is unfinished; run {builder} again with the same "
                                "inputs to resume it")
    differences = store.differences(metadata, dict(wanted))
    if differences:
        raise CacheMismatchError(f"the {store.what} at {store.root} was built for other inputs:\n  "
                                 + "\n  ".join(differences))
    return metadata


def attach_columns(dataset: datasets.Dataset, cached: datasets.Dataset, names: Mapping[str, str], *, what: str,
                   path: Path, built_from: str, check: bool = True) -> datasets.Dataset:
    """`dataset` plus the `cached` rows' columns renamed by `names` (cache name -> batch name), as numpy arrays per
    row, for the Trainer's dataloader (needs remove_unused_columns=False). `built_from` is the dataset_hash the
    cache was built from. Raises CacheMismatchError when the rows differ from the cache's (other count; other
    tokens or order, checked by hashing unless check=False)."""
    if len(dataset) != len(cached):
        raise CacheMismatchError(f"the dataset has {len(dataset)} rows but the {what} at {path} has {len(cached)}")
    if check and dataset_hash(dataset) != built_from:
        raise CacheMismatchError(f"the dataset's input_ids differ from those the {what} at {path} was built from "
                                 "(other rows, other order or other tokenisation)")
    combined = datasets.concatenate_datasets([dataset, cached.rename_columns(dict(names))], axis=1)
    return combined.with_format("numpy", columns=list(names.values()), output_all_columns=True)


def check_row_lengths(rows: Sequence[Mapping[str, Any]], column: str, what: str) -> None:
    """Raises ValueError when a row of a batch has another number of cached positions (`column`) than tokens."""
    for i, row in enumerate(rows):
        if len(row[column]) != len(row["input_ids"]):
            raise ValueError(f"row {i} of the batch has {len(row['input_ids'])} tokens but {len(row[column])} "
                             f"cached {what} positions")
