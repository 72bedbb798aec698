"""Drafters propose up to ``gamma`` tokens per step; the target verifies them.

A drafter keeps whatever state it needs (a KV cache for a model) consistent with the committed sequence:
after ``commit(n)`` its state covers the committed tokens except the newest one, which arrives as ``cur`` in the
next ``propose``.

Each kind of draft has its drafter in its own folder (kinds/<kind>/drafter.py), and the decoder is handed either a
drafter or a draft with its kind (``DraftingKind``: what decoding asks of a kind, which builds the drafter); it never
looks a kind up itself. A drafter that reads the target's
hidden states (an EAGLE-3 head, a DFlash draft) names their layers in ``aux_layers``; the target's prefill and verify
passes then return them (no second target pass), and the loop hands over those of the committed tokens with
``target_features`` (after ``start`` and after each ``commit``), with the token that follows each of them.

Everything a drafter is handed and returns stays on the target's device (``cur``, the drafts, q, the features and
their tokens): a drafter reads nothing back to the host, so the decoder's one read per round is the only one.
``history`` (the committed ids as a host list, the decoder's own copy of what it read) serves drafters that are
host by nature, such as prompt lookup's n-gram search: a drafter that sets ``host_history = True`` gets it (the
decoder then reads the prompt once, at the start); every other drafter gets an empty list.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from decode.loop.sampling import SamplingConfig


@runtime_checkable
class Drafter(Protocol):
    aux_layers: tuple[int, ...]  # target layer ids whose hidden states the drafter reads; () for none
    # (optional) one_pass = True: one draft forward per step whatever gamma is (gamma "auto" costs it per step)
    # (optional) host_history = True: ``propose`` reads ``history``, the committed ids on the host

    def start(self, prefix: torch.Tensor, target_vocab_size: int) -> None:
        """Begin a sequence whose committed tokens, all but the newest, are ``prefix`` [1, L]."""

    def propose(
        self, history: list[int], cur: torch.Tensor, gamma: int, cfg: SamplingConfig, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Up to ``gamma`` draft tokens [k] after ``cur`` [1, 1], and their distributions q [k, V_target]
        (None when greedy: q is then the one-hot of each token)."""

    def commit(self, num_accepted: int) -> None:
        """The target kept the first ``num_accepted`` proposed tokens."""

    def target_features(self, aux: torch.Tensor, tokens: torch.Tensor) -> None:
        """(Only with ``aux_layers``.) The target's hidden states [T, len(aux_layers) * H] at ``aux_layers`` of the
        next T committed tokens: the prefix after ``start``; cur, d_1..d_n after ``commit(n)``; and ``tokens`` [T],
        the committed token that follows each of them (on the device)."""


class DraftingKind(Protocol):
    """What decoding asks of a draft's kind (kinds.base.Kind implements it), for a draft in memory: its drafter, its
    static caches (the compiled path), transformers' assisted generation through it."""

    name: str                          # the kind's name (the eval JSON's draft_kind)
    assisted_refusal: str | None       # why transformers' assisted generation cannot run it; None when it can

    def drafter(self, draft: Any, target: torch.nn.Module, compile: bool = False, capacity: int = 0,
                max_gamma: int = 8) -> Drafter:
        """The drafter the decoder runs for ``draft``."""

    def reserve(self, draft: Any, target: torch.nn.Module, capacity: int, max_gamma: int) -> None:
        """Size (and compile) the static caches of the compiled path for ``capacity`` positions."""

    def assisted_generate(self, target: torch.nn.Module, draft: Any, prompt: torch.Tensor, gamma: int,
                          **generate_kwargs: Any) -> torch.Tensor:
        """transformers' assisted generation of ``target`` with ``draft`` drafting ``gamma`` tokens per step."""


def is_drafter(draft: object) -> bool:
    """Whether ``draft`` is a drafter already (it proposes, commits and starts), not a draft model."""
    return all(callable(getattr(type(draft), name, None)) for name in ("start", "propose", "commit"))
