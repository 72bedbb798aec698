"""The draft that is measured and exported, from what training holds, and what training asks of a draft's kind.

A kind may train its draft inside a wrapper (an EAGLE-3 head unrolled over the training-time test, a DFlash draft
inside its block training): ``served_draft`` takes the draft out through the kind handed in. A standalone draft
may carry its draft vocabulary (``draft_vocab_ids``), which whole copies (merged, gathered, read back) keep.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from torch import nn


class TrainingKind(Protocol):
    """What training asks of a draft's kind (kinds.base.Kind implements it)."""

    name: str

    def check_plan(self, cfg: Any, target_config: Any, tokenizer: Any, hidden_state_cache: bool) -> None:
        """Everything checkable from configs before weights load."""

    def check_resume(self, recipe: Any, resume: str) -> None:
        """The checkpoint to resume from holds a draft of the recipe's shape."""

    def build(self, cfg: Any, target: nn.Module, dtype: Any, lora: Any) -> nn.Module:
        """The trainable draft."""

    def prepare(self, recipe: Any, draft: nn.Module, target: nn.Module, rows: Any) -> None:
        """After the training rows are known."""

    def trainer(self) -> type:
        """The Trainer class of this kind."""

    def unwrap(self, model: object) -> object | None:
        """The served draft inside a training wrapper of this kind; None if ``model`` is no such wrapper."""

    def from_checkpoint(self, folder: Path, final: nn.Module) -> nn.Module | None:
        """The served draft in a Trainer checkpoint folder when the kind stores it its own way, else None."""


def served_draft(model: Any, kind: TrainingKind) -> Any:
    """The draft inside ``kind``'s training wrapper (what Trainer holds), any other model as it is."""
    inner = kind.unwrap(model) if model is not None else None
    return model if inner is None else inner


def carry_draft_vocab(source: Any, copy: Any) -> Any:
    """``copy`` (a whole copy of the draft ``source``: merged, gathered or read back from a checkpoint) with
    ``source``'s draft vocabulary, if it has one; returns ``copy``."""
    ids = getattr(source, "draft_vocab_ids", None)
    if ids is not None and copy is not None and copy is not source:
        copy.draft_vocab_ids = ids
    return copy
