"""Fingerprints of what stored data depend on: a model's config and every byte of its weights, a tokenizer's
vocabulary, token lists.

Short sha256 hex digests, stable across processes; the shard stores (distill/data/shard_store.py) compare them to
decide whether a folder can be reused or resumed. Weights are hashed in full, never sampled: a sparse change (a few
new embedding rows) or one below bfloat16's precision (a few fine-tuning steps) changes the key, so no cache of the
old target is reused for the new one.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import datasets
import numpy as np
import pyarrow.compute as pc
import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

# Config keys that say how a model was loaded or saved, not what it computes.
_VOLATILE_CONFIG_KEYS = ("transformers_version", "dtype", "torch_dtype", "use_cache", "architectures")
_SPECIAL_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\x00")
    return h.hexdigest()[:16]


def config_hash(model: nn.Module) -> str:
    """Hash of the model's config, without keys that only describe loading (dtype, version, private keys)."""
    values = {k: v for k, v in model.config.to_dict().items()
              if not k.startswith("_") and k not in _VOLATILE_CONFIG_KEYS}
    return _digest(json.dumps(values, sort_keys=True, default=str))


@torch.no_grad()
def full_weights_hash(model: nn.Module,
                      whole: Callable[[nn.Parameter], AbstractContextManager[torch.Tensor]] | None = None,
                      chunk_values: int = 1 << 24) -> str:
    """Hash of every parameter's name, shape, dtype and every byte of its values, in its own dtype (so the same
    checkpoint loaded in another dtype hashes differently: what was computed from it differs too).

    Streams: at most `chunk_values` values of one tensor are copied to the CPU at a time. `whole(param)` is a context
    manager giving the parameter's whole tensor (a ZeRO-3 partition or FSDP2 shard gathered:
    distill.models.distributed.whole_parameter); None reads the parameters as they are.
    """
    params = dict(model.named_parameters())
    h = hashlib.sha256()
    for name in sorted(params):
        with (whole or contextlib.nullcontext)(params[name]) as tensor:
            h.update(f"{name}\x00{tuple(tensor.shape)}\x00{tensor.dtype}\x00".encode())
            flat = tensor.detach().reshape(-1)
            for start in range(0, flat.numel(), chunk_values):
                h.update(flat[start:start + chunk_values].to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def vocab_hash(tokenizer: PreTrainedTokenizerBase) -> str:
    """Hash of the token -> id mapping and the special token ids."""
    specials = {name: getattr(tokenizer, name, None) for name in _SPECIAL_TOKENS}
    return _digest(json.dumps(sorted(tokenizer.get_vocab().items())), json.dumps(specials, sort_keys=True))


def token_lists_hash(lists: Sequence[Sequence[int]]) -> str:
    """Hash of a list of token-id lists (order, lengths and values)."""
    lengths = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
    values = np.fromiter((t for x in lists for t in x), dtype=np.int64, count=int(lengths.sum()))
    return _digest(lengths.tobytes(), values.tobytes())


def dataset_hash(dataset: datasets.Dataset, columns: Sequence[str] = ("input_ids", "attention_mask")) -> str:
    """Hash of the token columns (those of `columns` present) of every row, in the dataset's order (arrow, fast)."""
    present = [c for c in columns if c in dataset.column_names]
    h = hashlib.sha256(json.dumps(present).encode())
    for table in dataset.with_format("arrow").iter(batch_size=16384):
        for column in present:
            lists = table.column(column)
            h.update(pc.list_value_length(lists).to_numpy(zero_copy_only=False).astype(np.int64).tobytes())
            values = pc.list_flatten(lists).to_numpy(zero_copy_only=False).astype(np.int64)
            h.update(values.tobytes())
    return h.hexdigest()[:16]
