"""``gamma="auto"``: the draft length chosen at every step to maximise expected tokens per second.

Cost model (Leviathan et al.): with per-token acceptance alpha, a step that drafts gamma tokens produces
    tau(gamma, alpha) = (1 - alpha^(gamma + 1)) / (1 - alpha)        tokens (gamma + 1 when alpha = 1)
and costs gamma * t_draft + t_verify(gamma) seconds, so the chooser picks
    argmax_gamma  tau(gamma, alpha) / (gamma * t_draft + t_verify(gamma))      over AUTO_GAMMAS;
a drafter that drafts every gamma in one forward (``one_pass``: DFlash, PARD) costs t_draft per step instead:
    argmax_gamma  tau(gamma, alpha) / (t_draft + t_verify(gamma)).
alpha is a running (exponentially decayed) mean of sum_x min(p, q) over verified positions; t_draft and t_verify
are running means of the times measured in this very generation (seconds; ratios to a target step are the same
maximiser). A verify length not measured yet is estimated from those measured (a straight line through them; the
nearest one while only one is known). The choice never changes which tokens are produced: every gamma is lossless.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from decode.loop.speedup import predicted_speedup

AUTO = "auto"
AUTO_GAMMAS = (1, 2, 3, 4, 6)  # candidate draft lengths (each is one compiled verify shape on the static path)
DECAY = 0.95                   # weight of the past per verified position in the running acceptance estimate
PRIOR_ALPHA, PRIOR_WEIGHT = 0.6, 2.0


def expected_tokens(gamma: int, alpha: float) -> float:
    """tau(gamma, alpha) = (1 - alpha^(gamma + 1)) / (1 - alpha): expected tokens from one step."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def best_gamma(alpha: float, draft_cost: float, verify_cost: dict[int, float], gammas=AUTO_GAMMAS,
               one_pass: bool = False) -> int:
    """argmax_g tau(g, alpha) / (g * draft_cost + verify_cost[g]); costs in any one unit (ties: smaller g). A
    ``one_pass`` drafter (one draft forward per step whatever gamma is: DFlash, PARD) costs ``draft_cost`` per step:
    tau(g, alpha) / (draft_cost + verify_cost[g])."""
    def speedup(g: int) -> float:
        return predicted_speedup(expected_tokens(g, alpha), 1 if one_pass else g, draft_cost, verify_cost[g])

    return max(gammas, key=lambda g: (speedup(g), -g))


def fixed_gammas(gammas) -> list[int]:
    """The integer gammas of a setting, without "auto" (what vLLM and a served generation_config can draft)."""
    return [g for g in gammas if not is_auto(g)]


def is_auto(gamma: int | str) -> bool:
    return isinstance(gamma, str) and gamma == AUTO


class ResolvedGamma(NamedTuple):
    """The numbers a gamma setting stands for once its run is over."""

    deployed: int       # the draft length it is served with (num_assistant_tokens, vLLM's num_speculative_tokens)
    cost_model: float   # the gamma the cost model tau / (gamma * c + v) is evaluated at
    cost_ratios: int    # the measured draft length whose cost ratios c, v it uses


def resolve_gamma(gamma: int | str, mean_gamma: float | None) -> ResolvedGamma:
    """The one place that turns "auto" into numbers: a fixed gamma stands for itself; "auto" (with ``mean_gamma``,
    the mean of the gammas chosen at every step, as its result row reports) is served with that mean rounded (>= 1),
    costed at the mean itself, with the cost ratios of the candidate of AUTO_GAMMAS nearest to it."""
    if not is_auto(gamma):
        return ResolvedGamma(int(gamma), float(gamma), int(gamma))
    nearest = min(AUTO_GAMMAS, key=lambda g: abs(g - mean_gamma))
    return ResolvedGamma(max(1, round(mean_gamma)), float(mean_gamma), nearest)


@dataclass
class GammaChooser:
    """Running acceptance and step-time estimates of one generation, and the gamma they recommend."""

    gammas: tuple[int, ...] = AUTO_GAMMAS
    one_pass: bool = False        # the drafter runs one forward per step whatever gamma is (its cost is per step)
    alpha_sum: float = PRIOR_ALPHA * PRIOR_WEIGHT
    alpha_weight: float = PRIOR_WEIGHT
    draft_seconds: float = 0.0    # summed over drafted tokens (one_pass: over drafting steps)
    drafted: int = 0              # drafted tokens (one_pass: drafting steps)
    verify_seconds: dict[int, list[float]] = field(default_factory=dict)  # gamma -> [seconds summed, passes]
    chosen: list[int] = field(default_factory=list)

    @property
    def alpha(self) -> float:
        return self.alpha_sum / self.alpha_weight

    def choose(self) -> int:
        """The next step's gamma (the middle candidate until a step has been timed)."""
        if not self.verify_seconds or not self.drafted:
            gamma = self.gammas[len(self.gammas) // 2]
        else:
            gamma = best_gamma(self.alpha, self.draft_seconds / self.drafted, self.verify_estimates(), self.gammas,
                               self.one_pass)
        self.chosen.append(gamma)
        return gamma

    def observe(self, gamma: int, drafted: int, min_pq: list[float], draft_s: float, verify_s: float) -> None:
        """One step: ``drafted`` tokens proposed in ``draft_s`` seconds, verified in ``verify_s`` (a pass planned for
        ``gamma`` drafts); ``min_pq`` = sum_x min(p, q) at each verified position."""
        for overlap in min_pq:
            self.alpha_sum = DECAY * self.alpha_sum + overlap
            self.alpha_weight = DECAY * self.alpha_weight + 1.0
        if drafted:
            self.draft_seconds += draft_s
            self.drafted += 1 if self.one_pass else drafted
        total = self.verify_seconds.setdefault(gamma, [0.0, 0])
        total[0] += verify_s
        total[1] += 1

    def verify_estimates(self) -> dict[int, float]:
        """Mean verify seconds per candidate gamma: measured, else a line through the measured ones."""
        means = {g: s / n for g, (s, n) in self.verify_seconds.items()}
        known = sorted(means)
        if len(known) == 1:
            return {g: means.get(g, means[known[0]]) for g in self.gammas}
        # least-squares line t = a + b * g through the measured points, never below the cheapest measured pass
        n = len(known)
        mean_g, mean_t = sum(known) / n, sum(means[g] for g in known) / n
        slope = (sum((g - mean_g) * (means[g] - mean_t) for g in known)
                 / sum((g - mean_g) ** 2 for g in known))
        floor = min(means.values())
        return {g: means.get(g, max(floor, mean_t + slope * (g - mean_g))) for g in self.gammas}
