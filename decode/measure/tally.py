"""Raw counts and timings of a set of prompts at one gamma, summed prompt by prompt: for the whole run and for each
prompt category (``by_category``), so every summary is derived from counts over exactly its own prompts."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from decode.loop.auto_gamma import AUTO_GAMMAS, is_auto
from decode.loop.stats import SpecStats

UNCATEGORIZED = "uncategorized"  # the category of a prompt without one, when other prompts have one


@dataclass
class Tally:
    gamma: int | str  # a draft length, or "auto" (decode.loop.auto_gamma)
    stats: SpecStats = field(init=False)
    num_prompts: int = 0
    new_tokens: int = 0
    spec_s: float = 0.0
    plain_s: float = 0.0
    hf_s: float = 0.0
    matches: int = 0  # prompts whose speculative tokens equal the plain ones

    def __post_init__(self) -> None:
        self.stats = SpecStats(max(AUTO_GAMMAS) if is_auto(self.gamma) else self.gamma)

    def add(self, stats: SpecStats, spec_s: float, plain_s: float, hf_s: float, new_tokens: int,
            match: bool) -> None:
        """One prompt's counts and (median) timings."""
        self.stats = self.stats.merge(stats)
        self.num_prompts += 1
        self.new_tokens += new_tokens
        self.spec_s, self.plain_s, self.hf_s = self.spec_s + spec_s, self.plain_s + plain_s, self.hf_s + hf_s
        self.matches += int(match)


def category_names(categories: Sequence[str | None] | None) -> list[str | None] | None:
    """Each prompt's category (None -> UNCATEGORIZED), or None when no prompt has a category."""
    if categories is None or all(c is None for c in categories):
        return None
    return [UNCATEGORIZED if c is None else str(c) for c in categories]


def category_tallies(names: Sequence[str] | None, gamma: int | str) -> dict[str, Tally]:
    """An empty Tally per category, in sorted order ({} without categories)."""
    return {name: Tally(gamma) for name in sorted(set(names))} if names else {}


def category_rows(results: Sequence[dict], **extra) -> list[dict]:
    """Flat rows (for tables) of every result's ``by_category``: ``{**extra, "category": name, **result}``."""
    return [{**extra, "category": name, **row} for result in results
            for name, row in (result.get("by_category") or {}).items()]
