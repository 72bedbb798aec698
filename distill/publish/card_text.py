"""What publishing a draft asks of its kind: the text its model card says of the kind (``CardText``), its served
folder and the draft inside training's wrapper (``PublishingKind``). Light on purpose: the kinds' registry imports
it."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class CardText:
    """What a draft's model card says of its kind."""

    intro: str                                      # the opening sentence; {target} is the target's reference
    describe: Callable[[dict], list[str]]           # config.json -> the parts of the "Draft:" line
    usage: Callable[[str, str, int | None], str]    # (target, repo_id, gamma) -> '## Usage'
    tags: tuple[str, ...] = ()                      # added to the card's tags


class PublishingKind(Protocol):
    """What publishing a trained draft asks of its kind (kinds.base.Kind implements it)."""

    @property
    def card(self) -> CardText:
        """The model card's text for this kind."""

    def save(self, draft: Any, folder: str | Path, gamma: int) -> None:
        """The served folder of ``draft`` (weights, config, a generation config drafting ``gamma`` tokens)."""

    def speculators_fields(self, config: dict) -> dict | None:
        """The speculators-format keys of the exported config.json ``config``; None when the kind has none."""

    def unwrap(self, model: object) -> object | None:
        """The served draft inside a training wrapper of this kind; None if ``model`` is no such wrapper."""

    def from_checkpoint(self, folder: Path, final: Any) -> Any:
        """The served draft in a Trainer checkpoint folder when the kind stores it its own way, else None."""
