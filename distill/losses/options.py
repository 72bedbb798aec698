"""The options every path that sums a loss over a batch shares: `LossOptions` (a validated loss name or weighted
combination, beta, temperature, ce_weight) and `take_rows` (the rows of a dense or a sparse teacher).

The per-token divergences they name are distill/losses/divergences.py; the batch sums that use them are
distill/losses/distill_loss.py and distill/losses/fused.py.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from distill.losses.divergences import LOSSES, SparseTeacher, check_beta, unknown_loss_message


@dataclass(frozen=True)
class LossOptions:
    """A validated (loss, beta, temperature, ce_weight); raises ValueError naming a bad value.

    loss is a name of LOSSES, or a weighted combination {name: weight >= 0} (the weights of one optimizer step;
    schedules are resolved by distill.losses.loss_mix), whose loss is sum_i weight_i * term_i. A name with ce_weight w
    is the combination {name: 1 - w, ce: w} (ce left out when w = 0); "ce" alone is {ce: 1}.
    """

    loss: str | Mapping[str, float]
    beta: float
    temperature: float
    ce_weight: float

    def __post_init__(self) -> None:
        if isinstance(self.loss, str):
            if self.loss not in LOSSES:
                raise ValueError(unknown_loss_message(self.loss))
        else:
            if not self.loss:
                raise ValueError("a combination of losses needs at least one term")
            for name, weight in self.loss.items():
                if name not in LOSSES:
                    raise ValueError(unknown_loss_message(name))
                if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight >= 0):
                    raise ValueError(f"loss weight of {name!r} must be a number >= 0, got {weight!r}")
            if self.ce_weight != 0.0:
                raise ValueError(f"ce_weight must be 0 with a combination of losses (put ce in it), "
                                 f"got {self.ce_weight!r}")
        check_beta(self.beta)
        if not self.temperature > 0.0:
            raise ValueError(f"temperature must be > 0, got {self.temperature!r}")
        if not 0.0 <= self.ce_weight <= 1.0:
            raise ValueError(f"ce_weight must be in [0, 1], got {self.ce_weight!r}")

    @property
    def terms(self) -> tuple[tuple[str, float], ...]:
        """(name, weight) of every term of the loss, divergences first, then ce."""
        if not isinstance(self.loss, str):
            named = tuple((name, float(weight)) for name, weight in self.loss.items())
            return tuple(t for t in named if t[0] != "ce") + tuple(t for t in named if t[0] == "ce")
        if self.loss == "ce":
            return (("ce", 1.0),)
        kd = ((self.loss, 1.0 - self.ce_weight),)
        return kd + ((("ce", self.ce_weight),) if self.ce_weight > 0.0 else ())

    @property
    def divergence_terms(self) -> tuple[tuple[str, float], ...]:
        """The (name, weight) terms that compare with the teacher (all but ce)."""
        return tuple(t for t in self.terms if t[0] != "ce")

    @property
    def ce_term_weight(self) -> float | None:
        """The weight of the hard-label cross-entropy term; None when the loss has none."""
        return next((weight for name, weight in self.terms if name == "ce"), None)

    @property
    def needs_teacher(self) -> bool:
        return bool(self.divergence_terms)

    def combine(self, values: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """sum_i w_i values[name_i] over the terms; a lone term of weight 1 is its value itself."""
        weighted = [values[name] if weight == 1.0 else weight * values[name] for name, weight in self.terms]
        total = weighted[0]
        for term in weighted[1:]:
            total = total + term
        return total

    def kd_of(self, values: Mapping[str, torch.Tensor], zero: torch.Tensor) -> torch.Tensor:
        """The logged kd: the divergence itself for one divergence term; for several, their weighted mean
        sum_i w_i D_i / sum_i w_i (0 while every weight is 0)."""
        terms = self.divergence_terms
        if len(terms) == 1:
            return values[terms[0][0]]
        total = sum(weight for _, weight in terms)
        if total == 0.0:
            return zero
        return sum(weight * values[name] for name, weight in terms) / total

    def check_teacher(self, teacher: torch.Tensor | SparseTeacher | None) -> None:
        if teacher is None and self.needs_teacher:
            raise ValueError(f"loss={self.loss!r} needs a teacher (logits or a SparseTeacher), got None")
        if isinstance(teacher, SparseTeacher) and self.temperature != 1.0:
            raise ValueError(
                f"temperature={self.temperature!r} cannot be used with a SparseTeacher: cached top-k "
                "log-probabilities are at temperature 1 and cannot be re-softened; use temperature=1.0 "
                "or dense teacher logits"
            )


def take_rows(teacher: torch.Tensor | SparseTeacher | None,
              rows: torch.Tensor | slice) -> torch.Tensor | SparseTeacher | None:
    """The teacher's rows at `rows` (dense rows [n, ...] or a SparseTeacher with n rows); None stays None."""
    if teacher is None:
        return None
    return teacher.take(rows) if isinstance(teacher, SparseTeacher) else teacher[rows]
