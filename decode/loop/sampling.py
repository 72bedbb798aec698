"""Turning logits into the distributions used by speculative sampling, and drawing from them.

The same warping (temperature -> top-k -> top-p, the order `transformers` applies them) is applied to the target
and to the draft, so that the draft token is drawn from exactly the `q` used in the acceptance rule.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """Decoding settings; ``temperature == 0`` means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def warp_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Apply temperature, top-k and top-p to ``logits`` [..., V]; returns float32 logits with -inf outside the support."""
    logits = logits.float() / cfg.temperature
    vocab = logits.shape[-1]
    if cfg.top_k is not None and cfg.top_k < vocab:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p is not None and cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # keep token r iff the mass ranked strictly above it is < top_p (the smallest set reaching top_p)
        mass_above = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_above >= cfg.top_p
        drop_sorted[..., 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def probs_from_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The sampling distribution [..., V] (float32) for ``logits`` [..., V]; one-hot at the argmax when greedy."""
    if cfg.greedy:
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return warp_logits(logits, cfg).softmax(dim=-1)


def draw(probs: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``probs`` [R, V] -> [R]; argmax when greedy (no randomness consumed)."""
    if cfg.greedy:
        return probs.argmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def next_token(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``logits`` [R, V] -> [R] under ``cfg``."""
    if cfg.greedy:
        return logits.argmax(dim=-1)
    return draw(warp_logits(logits, cfg).softmax(dim=-1), cfg, generator)
