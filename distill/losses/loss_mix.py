"""`distill.loss` as a recipe writes it: one loss name, or a weighted combination with optional linear schedules.

    loss: tv                                        # one name: exactly as before (with distill.ce_weight)
    loss: {ce: 0.5, forward_kl: 0.5}               # fixed weights: loss = 0.5 ce + 0.5 forward_kl
    loss: {ce: {start: 1.0, end: 0.0, steps: 200}, tv: {start: 0.0, end: 1.0}}

A weight is a number >= 0 or a linear schedule over optimizer steps t = 0, 1, ...:
    w(t) = start + (end - start) * min(t, steps) / steps      held at `end` after `steps`
`steps` left out (or null) means the run's total optimizer steps (train.max_steps, or what the epochs give).
Weights need not sum to 1. `LossMix.at(step, total_steps)` gives the weights of one step, the mapping that
distill.losses.distill_loss takes as its `loss`. The per-token terms are distill.losses.divergences.DIVERGENCES and
"ce".
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from distill.losses.divergences import DIVERGENCES, LOSSES, unknown_loss_message

SCHEDULE_KEYS = ("start", "end", "steps")


class LossSpecError(ValueError):
    """A bad distill.loss value; `key` is the sub-key at fault ("loss.tv.steps"), the message one line."""

    def __init__(self, key: str, problem: str):
        self.key, self.problem = key, problem
        super().__init__(f"{key}: {problem}")


@dataclass(frozen=True)
class LinearWeight:
    """start -> end linearly over `steps` optimizer steps (None: the run's total), then held at end."""

    start: float
    end: float
    steps: int | None = None

    def at(self, step: int, total_steps: int) -> float:
        """The weight at optimizer step `step` (0 = the first update); total_steps stands in for steps=None."""
        span = self.steps if self.steps is not None else max(total_steps, 1)
        # w(t) = start + (end - start) * min(t, steps) / steps
        return self.start + (self.end - self.start) * min(max(step, 0), span) / span


Weight = float | LinearWeight


def _number(value: Any, key: str) -> float:
    """A weight number: finite and >= 0 (recipes are read by distill.recipe.strict_yaml, where 1e-1 is a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise LossSpecError(key, f"got {value!r}; allowed: a number >= 0 or {{start, end, steps}}")
    if value < 0:
        raise LossSpecError(key, f"got {value!r}; allowed: a weight >= 0 (negative weights are not allowed)")
    return float(value)


def _weight(value: Any, key: str) -> Weight:
    if not isinstance(value, Mapping):
        return _number(value, key)
    unknown = [k for k in value if k not in SCHEDULE_KEYS]
    if unknown or "start" not in value or "end" not in value:
        raise LossSpecError(key, f"got {dict(value)!r}; allowed: a schedule {{start: w0, end: w1, steps: n}} "
                                 "(start and end >= 0; steps an integer > 0, or left out for the whole run)")
    steps = value.get("steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise LossSpecError(f"{key}.steps", f"got {steps!r}; allowed: an integer > 0, or null for the whole run")
    return LinearWeight(_number(value["start"], f"{key}.start"), _number(value["end"], f"{key}.end"), steps)


@dataclass(frozen=True)
class LossMix:
    """A validated distill.loss: {loss name: weight}, each weight a number or a LinearWeight."""

    weights: Mapping[str, Weight]

    @classmethod
    def parse(cls, spec: Mapping[str, Any]) -> LossMix:
        """From the recipe's mapping; raises LossSpecError naming the sub-key (unknown name, did you mean...)."""
        if not spec:
            raise LossSpecError("loss", "got {}; allowed: a loss name or a mapping {name: weight} with >= 1 term")
        weights = {}
        for name, value in spec.items():
            if name not in LOSSES:
                raise LossSpecError(f"loss.{name}", unknown_loss_message(name))
            weights[name] = _weight(value, f"loss.{name}")
        mix = cls(weights)
        if all(w == 0.0 for w in mix.at(0, 1).values()) and all(w == 0.0 for w in mix.at(10**9, 1).values()):
            raise LossSpecError("loss", f"got {dict(spec)!r}; allowed: at least one weight > 0")
        return mix

    @property
    def divergences(self) -> tuple[str, ...]:
        """The terms that need the teacher (all but ce)."""
        return tuple(name for name in self.weights if name in DIVERGENCES)

    def at(self, step: int, total_steps: int) -> dict[str, float]:
        """{name: weight} at optimizer step `step` of a run of total_steps steps."""
        return {name: w.at(step, total_steps) if isinstance(w, LinearWeight) else w
                for name, w in self.weights.items()}


def teacher_divergences(loss: str | Mapping[str, Any]) -> tuple[str, ...]:
    """The divergence names of a recipe's distill.loss (empty for "ce"): the target is needed when non-empty."""
    if isinstance(loss, str):
        return (loss,) if loss in DIVERGENCES else ()
    return tuple(name for name in loss if name in DIVERGENCES)
