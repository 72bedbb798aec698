"""The cost ratios of speculative decoding, measured on the decoder's own loops (decode.loop.speedup has the formula).

Model (Leviathan et al. 2023): one speculative step drafts gamma tokens and verifies them; it commits tau tokens on
average (mean_accepted_tokens), and plain decoding commits one token per target step, so

    predicted speedup = tau / (gamma * c + v)
    c = (draft seconds per drafted token in a speculative step) / t_target
    v = (seconds of the rest of a speculative step: the (gamma + 1)-token verify pass, acceptance, the rollbacks of
         both caches, the drafter's commit, the host read and bookkeeping) / t_target
    t_target = seconds per token of plain decoding (one 1-token target step, sampling and the loop around it)

Every quantity is timed on the code that decodes (``speculative_generate`` with a ``StepClock``,
``autoregressive_generate``), on the same path (eager, or the static-cache compiled steps when ``compile``), at the
contexts the decoder visits (the prompt plus ``new_tokens`` generated tokens), after a warm-up. So v includes the
per-step overheads a bare forward pass lacks; prefill is outside the model (it is paid once per generation).

Protocol: a warm-up round, then rounds, each timing plain decoding of ``new_tokens`` and of 1 token, then one
speculative generation of ``new_tokens`` with a per-step clock, all three under the sampling settings being
predicted (greedy, or temperature / top-k / top-p with a seeded generator: sampling adds work to every plain token,
every drafted token and every verify step), interleaved so that load on a shared machine hits
all three alike. Per round: t_target = (T_plain(n) - T_plain(1)) / (n - 1); c and v = means over the steps that
drafted the full gamma (the tail of a generation drafts fewer). ``repeats`` is the number of timed speculative steps
wanted (as many as there were timed calls per ratio before), so there are ceil(repeats / full steps per round)
rounds, at least MIN_ROUNDS; the ratios are the medians over rounds.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch

from decode.loop.drafters import DraftingKind
from decode.loop.sampling import SamplingConfig
from decode.loop.speculative import autoregressive_generate, speculative_generate
from decode.loop.speedup import CostRatios
from decode.loop.timing import StepClock, timed_call

MIN_ROUNDS = 3


@dataclass
class Round:
    """One round's measurements, in seconds."""

    target_s: float  # t_target: per plain-decoding token
    draft_s: float   # per drafted token
    rest_s: float    # per speculative step, outside drafting
    steps: int       # full-gamma steps timed


def measure_round(target, draft, prompt: torch.Tensor, gamma: int, new_tokens: int, compile: bool,
                  sampling: SamplingConfig = SamplingConfig(), seed: int = 0, kind: DraftingKind | None = None
                  ) -> Round:
    """Plain decoding of ``new_tokens`` and of 1 token, then a clocked speculative generation, under ``sampling``."""
    device = prompt.device
    settings = dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, compile=compile)

    def seeded() -> torch.Generator:
        return torch.Generator(device=device).manual_seed(seed)

    _, plain_n = timed_call(lambda: autoregressive_generate(target, prompt, max_new_tokens=new_tokens,
                                                           generator=seeded(), **settings), device)
    _, plain_1 = timed_call(lambda: autoregressive_generate(target, prompt, max_new_tokens=1, generator=seeded(),
                                                           **settings), device)
    clock = StepClock(device)
    speculative_generate(target, draft, prompt, max_new_tokens=new_tokens, gamma=gamma, clock=clock,
                         generator=seeded(), kind=kind, **settings)
    full = clock.full_steps(gamma)
    assert full, "new_tokens >= 2 * gamma + 2 leaves at least one full step"
    # t_target = (T(n) - T(1)) / (n - 1): the prefill and the first token cancel
    target_s = (plain_n - plain_1) / (new_tokens - 1)
    return Round(target_s, statistics.mean(d for d, _ in full) / gamma, statistics.mean(r for _, r in full),
                 len(full))


@torch.inference_mode()
def measure_cost_ratios(target, draft, prompt: torch.Tensor, gamma: int, repeats: int = 7, compile: bool = False,
                        new_tokens: int = 32, sampling: SamplingConfig = SamplingConfig(),
                        kind: DraftingKind | None = None) -> CostRatios:
    """c and v of ``draft`` (a drafter, or a draft in memory of ``kind``) with ``target`` at ``gamma``, measured on the
    decoder's loops from ``prompt`` [1, L] over ``new_tokens`` generated tokens under ``sampling`` (default greedy;
    the module docstring has the protocol); medians over rounds that time at least ``repeats`` steps, after a
    warm-up round. ``compile``: the static-cache compiled path (decode.loop.static), its steps compiled in the
    warm-up. Raises ValueError for ``repeats`` < 1."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    new_tokens = max(new_tokens, 2 * gamma + 2)  # at least one step that drafts the full gamma
    # warm-up (and compilation)
    warm = measure_round(target, draft, prompt, gamma, new_tokens, compile, sampling, kind=kind)
    num_rounds = max(MIN_ROUNDS, math.ceil(repeats / warm.steps))
    rounds = [measure_round(target, draft, prompt, gamma, new_tokens, compile, sampling, seed=1 + r, kind=kind)
              for r in range(num_rounds)]
    c = statistics.median(r.draft_s / r.target_s for r in rounds)
    v = statistics.median(r.rest_s / r.target_s for r in rounds)
    return CostRatios(c, v)
