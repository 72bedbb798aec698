"""The cost model's speedup (Leviathan et al. 2023), the one formula every caller uses:

    predicted speedup = tau / (gamma * c + v)

tau = tokens committed per speculative step (mean_accepted_tokens), c = cost of drafting one token and v = cost of
the rest of a step (the verify pass and per-step overheads), both in units of one plain-decoding target step
(decode.measure.cost_model measures them). Any one unit of time works for the argmax over
gamma (decode.loop.auto_gamma).
"""
from __future__ import annotations

from dataclasses import dataclass


def predicted_speedup(tau: float, gamma: float, draft_cost: float, verify_cost: float) -> float:
    """tau / (gamma * draft_cost + verify_cost): tokens per step over what a step costs."""
    # speedup = tau / (gamma * c + v)
    return tau / (gamma * draft_cost + verify_cost)


@dataclass
class CostRatios:
    draft_cost_ratio: float   # c = draft seconds per drafted token / t_target
    verify_cost_ratio: float  # v = rest of a speculative step (verify pass + per-step overheads) / t_target

    def step_cost(self, gamma: float) -> float:
        """gamma * c + v: one speculative step, in target steps."""
        return gamma * self.draft_cost_ratio + self.verify_cost_ratio

    def predicted_speedup(self, tau: float, gamma: float) -> float:
        return predicted_speedup(tau, gamma, self.draft_cost_ratio, self.verify_cost_ratio)
