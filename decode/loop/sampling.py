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
    """Apply temperature, top-k and top-p to ``logits`` [..., V]; returns float32 logits with -inf outside
    the support."""
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


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token of each row of ``probs`` [..., V] (non-negative, positive sum, need not be normalised) at which the
    cumulative mass F first exceeds ``u`` [...] times the row's total:  x  such that  F(x-1) <= u * F(V) < F(x),
    so x has probability probs[x] / F(V) when u ~ U[0, 1). F is summed in float64: in float32 its steps near the
    total are 6e-8 apart, coarser than many of a 49152-token row's probabilities. A token of probability 0 is never
    returned (its F equals its predecessor's), u = 1 included (the threshold stays strictly below the total)."""
    wide = torch.float32 if probs.device.type == "mps" else torch.float64  # MPS has no float64
    cdf = probs.cumsum(dim=-1, dtype=wide)  # [..., V]
    total = cdf[..., -1:]
    threshold = torch.minimum(u.to(wide).unsqueeze(-1) * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, threshold, right=True).squeeze(-1)  # the first x with F(x) > threshold


def draw(probs: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``probs`` [..., V] -> [...]; argmax when greedy (no randomness consumed).

    Sampled: the inverse CDF, one uniform per row. torch.multinomial draws a random number per vocabulary entry
    instead (49152 per row on SmolLM2), paid at every plain token, every sampled draft token and every row of a
    verify step (scripts/bench_sampling.py measures both draws)."""
    if cfg.greedy:
        return probs.argmax(dim=-1)
    u = torch.rand(probs.shape[:-1], device=probs.device, generator=generator)
    return inverse_cdf(probs, u)


def next_token(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``logits`` [R, V] -> [R] under ``cfg``."""
    if cfg.greedy:
        return logits.argmax(dim=-1)
    return draw(warp_logits(logits, cfg).softmax(dim=-1), cfg, generator)
