"""Clocks for the decoder: one place that reads the time, so tests can swap in a deterministic clock.

``now`` is read through this module (``timing.now()``) by every timed region of the decoder and its evaluation;
``StepClock`` records, for each step of ``speculative_generate``, the time spent drafting, the time of the verify
pass, and the time of the rest of the step: the decoder's own work (acceptance, the host read, both rollbacks, the
drafter's commit, host-side bookkeeping).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


def now() -> float:
    """Seconds on a monotonic clock (time.perf_counter); replaced by a fake clock in tests."""
    return time.perf_counter()


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a clock read after it counts it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_call(fn: Callable[[], object], device: torch.device) -> tuple[object, float]:
    """``fn()`` and its wall-clock seconds (device synchronised at both ends)."""
    synchronize(device)
    start = now()
    result = fn()
    synchronize(device)
    return result, now() - start


def median_time(fn: Callable[[], object], device: torch.device, repeats: int) -> tuple[object, float]:
    """Run ``fn`` ``repeats`` times; its last result and the median wall-clock seconds (device synchronised)."""
    times, result = [], None
    for _ in range(repeats):
        result, seconds = timed_call(fn, device)
        times.append(seconds)
    return result, statistics.median(times)


@dataclass
class StepClock:
    """Per-step times of one speculative generation: ``asked`` draft tokens (the step's gamma after the cap at the
    end of the generation), ``draft_s`` (propose), ``rest_s`` (everything else in the step) and, within it,
    ``verify_s`` (the target's verify pass alone; ``rest_s - verify_s`` is the decoder's own work)."""

    device: torch.device
    asked: list[int] = field(default_factory=list)
    draft_s: list[float] = field(default_factory=list)
    rest_s: list[float] = field(default_factory=list)
    verify_s: list[float] = field(default_factory=list)

    def record(self, asked: int, started: float, drafted_at: float, verified_at: float | None = None) -> None:
        """Close a step that began at ``started``, finished drafting at ``drafted_at`` and verifying at
        ``verified_at`` (None: not split)."""
        synchronize(self.device)  # rollbacks may still be queued on a GPU
        ended = now()
        self.asked.append(asked)
        self.draft_s.append(drafted_at - started)
        self.rest_s.append(ended - drafted_at)
        self.verify_s.append((verified_at if verified_at is not None else ended) - drafted_at)

    def full_steps(self, gamma: int) -> list[tuple[float, float]]:
        """(draft_s, rest_s) of the steps that asked for all ``gamma`` draft tokens."""
        return [(d, r) for a, d, r in zip(self.asked, self.draft_s, self.rest_s) if a == gamma]

    def split(self, gamma: int) -> list[tuple[float, float, float]]:
        """(draft_s, verify_s, own_s) of the steps that asked for all ``gamma`` draft tokens: drafting, the verify
        pass, and the decoder's own work (the rest of the step)."""
        return [(d, v, r - v) for a, d, r, v in zip(self.asked, self.draft_s, self.rest_s, self.verify_s)
                if a == gamma]
