"""A draft vocabulary: the target tokens a draft may propose, the most frequent label tokens of its training rows.

An EAGLE-3 head is built over one (its lm_head has those rows only, d2t maps them back: kinds/eagle3/model.py). A
standalone draft keeps its whole lm_head, so that it loads in transformers and vLLM unchanged, and stores its
vocabulary beside the weights (``draft_vocab.json``); our decoder then reads out only those rows of it
(kinds/standalone/drafter.py). That is frequency-ranked drafting (FR-Spec, Zhao et al. 2025): on a small model
with a large vocabulary the lm_head is most of a draft step (SmolLM2-135M: 49152 x 576, ~6 of ~11 ms of a 2-layer
draft's step on a 2-core CPU), and the rows of rare tokens are the ones a draft's guess almost never needs.

Losslessness does not depend on it: the draft's q is zero outside the vocabulary, so those tokens are never
proposed, and the target's verification (greedy: its argmax; sampled: the residual max(0, p - q)) still produces
them wherever the target would.

    ids = frequent_label_tokens(rows, vocab_size, size)     # [size] ascending target ids, same on every process
    write_draft_vocab(folder, ids, vocab_size)              # folder/draft_vocab.json
    ids = read_draft_vocab(folder, vocab_size)              # None when the folder has none; DraftVocabError if bad

In memory a standalone draft carries its vocabulary as ``draft_vocab_ids`` (on the base model under LoRA): set by the
trainer (kinds/standalone/build.py) or by loading a folder, handed on to whole copies (``kinds.carry_draft_vocab``:
merged, gathered, read back from a checkpoint), read by the drafter and written by the export.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from distill.utils import IGNORE_INDEX

if TYPE_CHECKING:
    import datasets

DRAFT_VOCAB_FILE = "draft_vocab.json"
FORMAT = "specdistill draft vocabulary"


class DraftVocabError(ValueError):
    """A draft_vocab.json that cannot be used (unreadable, malformed, or ids outside the vocabulary)."""


def label_token_counts(rows: datasets.Dataset, vocab_size: int, batch_size: int = 1024) -> torch.Tensor:
    """How often each target id is a label (loss) token of `rows`: [V] long. Label ids are those of `labels`
    other than -100."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for batch in rows.select_columns(["labels"]).iter(batch_size=batch_size):
        flat = np.concatenate([np.asarray(row, dtype=np.int64) for row in batch["labels"]] or [np.zeros(0, np.int64)])
        counts += np.bincount(flat[flat != IGNORE_INDEX], minlength=vocab_size)[:vocab_size]
    return torch.from_numpy(counts)


def most_frequent(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The `size` ids with the highest counts, ties broken by the smaller id, in ascending id order: [size]."""
    ids = torch.arange(counts.numel())
    # sort by (-count, id): a stable sort of ids by descending count keeps ids ascending within a count
    order = torch.sort(-counts, stable=True).indices
    return torch.sort(ids[order[:size]]).values


def frequent_label_tokens(rows: datasets.Dataset, vocab_size: int, size: int) -> torch.Tensor:
    """The `size` most frequent label tokens of `rows` [size] (ascending ids), counted on the main process and
    broadcast, so every process holds the same."""
    from accelerate import PartialState

    state = PartialState()
    chosen = None
    if state.is_main_process:
        chosen = most_frequent(label_token_counts(rows, vocab_size), size).tolist()
    if state.num_processes > 1:
        from accelerate.utils import broadcast_object_list
        chosen = broadcast_object_list([chosen])[0]
    return torch.tensor(chosen, dtype=torch.long)


def write_draft_vocab(folder: str | Path, ids: torch.Tensor, vocab_size: int) -> Path:
    """folder/draft_vocab.json: the ids, ascending, and the size of the vocabulary they come from."""
    path = Path(folder) / DRAFT_VOCAB_FILE
    body = {"format": FORMAT, "vocab_size": int(vocab_size), "size": int(ids.numel()),
            "ids": [int(i) for i in ids.tolist()]}
    path.write_text(json.dumps(body, separators=(",", ":")) + "\n")
    return path


def read_draft_vocab(folder: str | Path, vocab_size: int) -> torch.Tensor | None:
    """The ids [size] of folder/draft_vocab.json (None when there is no such file). Raises DraftVocabError, naming
    the file, when it is not such a file or its ids are not distinct ids below ``vocab_size`` (the draft's rows)."""
    path = Path(folder) / DRAFT_VOCAB_FILE
    if not path.is_file():
        return None
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DraftVocabError(f"{path} is not a JSON file ({type(err).__name__}: {err}); delete it to draft over the "
                              "whole vocabulary") from None
    ids = body.get("ids") if isinstance(body, dict) else None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise DraftVocabError(f"{path} holds no list of token ids under 'ids' (written by specdistill's trainer "
                              "with model.draft_vocab_size); delete it to draft over the whole vocabulary")
    tensor = torch.tensor(ids, dtype=torch.long)
    if int(tensor.min()) < 0 or int(tensor.max()) >= vocab_size or tensor.unique().numel() != tensor.numel():
        raise DraftVocabError(f"{path}: its {len(ids)} ids must be distinct ids in [0, {vocab_size}) (the draft's "
                              f"lm_head rows), got {int(tensor.min())}..{int(tensor.max())}"
                              f"{'' if tensor.unique().numel() == tensor.numel() else ' with repeats'}")
    return torch.sort(tensor).values

