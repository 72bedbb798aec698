"""The same drafter trained at several seeds: mean and spread (max - min) of its eval results, and whether one
drafter's margin over another is larger than that spread.

    rows = seed_rows({"draft_kd": {42: kd42, 43: kd43}, "draft_ce": {42: ce42, 43: ce43}})  # results lists
    margin = tau_margin(rows, "draft_kd", "draft_ce", gamma=4)
    print(margin.sentence())    # "... +0.41 ... larger than the seed spread 0.12: the margin holds."

Training a small draft for a few hundred steps is not bit-identical across CPUs, so one seed's tau can move by
10-20%; only a margin larger than the spread over seeds is a claim (README, "Measured so far").
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from decode.measure.table import Column, keyed_columns

# the result keys averaged over seeds; each also gets KEY_spread (max - min) and KEY_range ((min, max))
SEED_KEYS = ("acceptance_rate", "mean_accepted_tokens", "speedup", "predicted_speedup")
SEED_COLUMNS = (*keyed_columns("drafter"), Column("seeds", "seeds"), *keyed_columns("gamma", "temperature"),
                *keyed_columns("acceptance_rate"), Column("acceptance_rate_spread", "acceptance_rate_spread", ".3f"),
                *keyed_columns("mean_accepted_tokens"),
                Column("mean_accepted_tokens_spread", "mean_accepted_tokens_spread", ".2f"),
                *keyed_columns("speedup"), Column("speedup_spread", "speedup_spread", ".2f"),
                *keyed_columns("predicted_speedup"))


def setting(result: Mapping) -> tuple:
    """The (gamma, temperature) a result row was measured at (gamma may be "auto")."""
    return result.get("gamma"), result.get("temperature", 0.0)


def mean_and_range(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, min, max) of the values."""
    return sum(values) / len(values), min(values), max(values)


def aggregate(per_seed: Sequence[Mapping]) -> dict:
    """One row from the same setting's result at each seed: KEY = mean over seeds, KEY_spread = max - min,
    KEY_range = (min, max) for each of SEED_KEYS the rows have; per_position_acceptance is averaged position by
    position when every seed has the same length (else the first seed's)."""
    row = {"seeds": len(per_seed), "gamma": per_seed[0].get("gamma"),
           "temperature": per_seed[0].get("temperature", 0.0)}
    for key in SEED_KEYS:
        values = [r[key] for r in per_seed if r.get(key) is not None]
        if values:
            mean, low, high = mean_and_range(values)
            row.update({key: mean, f"{key}_spread": high - low, f"{key}_range": (low, high)})
    positions = [r.get("per_position_acceptance") or [] for r in per_seed]
    if positions[0] and all(len(p) == len(positions[0]) for p in positions):
        row["per_position_acceptance"] = [sum(column) / len(column) for column in zip(*positions)]  # mean per position
    elif positions[0]:
        row["per_position_acceptance"] = positions[0]
    return row


def seed_rows(results: Mapping[str, Mapping[int | None, Sequence[Mapping]]]) -> list[dict]:
    """Per drafter and (gamma, temperature), the mean and spread over seeds (``aggregate``): drafter name ->
    {seed: that seed's results list}. Settings come in the first seed's order; a setting a seed lacks is averaged
    over the seeds that have it (its ``seeds`` says how many)."""
    rows = []
    for name, by_seed in results.items():
        order = list(dict.fromkeys(setting(r) for seed_results in by_seed.values() for r in seed_results))
        for key in order:
            same = [r for seed_results in by_seed.values() for r in seed_results if setting(r) == key]
            rows.append({"drafter": name, **aggregate(same)})
    return rows


@dataclass(frozen=True)
class Margin:
    """``better``'s mean tau minus ``baseline``'s at one setting, against the larger of their two seed spreads."""

    better: str
    baseline: str
    gamma: int
    temperature: float
    better_tau: float
    baseline_tau: float
    spread: float
    seeds: int

    @property
    def margin(self) -> float:
        return self.better_tau - self.baseline_tau

    @property
    def exceeds(self) -> bool:
        """The claim holds: the margin is larger than the seed spread (never with a single seed)."""
        return self.seeds > 1 and self.margin > self.spread

    def sentence(self) -> str:
        """The headline as one plain sentence."""
        head = (f"{self.better} vs {self.baseline}, mean_accepted_tokens at gamma {self.gamma}, temperature "
                f"{self.temperature:g}, mean of {self.seeds} seed(s): {self.better_tau:.2f} vs "
                f"{self.baseline_tau:.2f}, margin {self.margin:+.2f} ({self.better_tau / self.baseline_tau:.2f}x)")
        if self.seeds < 2:
            return f"{head}; one seed only, so no spread is known and no margin is claimed."
        verdict = ("the margin is larger than the spread, so it holds" if self.exceeds
                   else "the margin is NOT larger than the spread, so no difference is claimed")
        return f"{head}; seed spread (max - min, the larger of the two) {self.spread:.2f}: {verdict}."


def tau_margin(rows: Sequence[Mapping], better: str, baseline: str, gamma: int,
               temperature: float = 0.0) -> Margin:
    """The Margin of ``better`` over ``baseline`` in ``seed_rows`` output; raises ValueError when either has no row
    at (gamma, temperature)."""
    found = {}
    for name in (better, baseline):
        match = [r for r in rows if r["drafter"] == name and setting(r) == (gamma, temperature)
                 and r.get("mean_accepted_tokens") is not None]
        if not match:
            raise ValueError(f"no mean_accepted_tokens for {name} at gamma {gamma}, temperature {temperature:g}")
        found[name] = match[0]
    high, low = found[better], found[baseline]
    # spread = max(spread_better, spread_baseline), each max - min over seeds
    return Margin(better, baseline, gamma, temperature, high["mean_accepted_tokens"], low["mean_accepted_tokens"],
                  max(high["mean_accepted_tokens_spread"], low["mean_accepted_tokens_spread"]),
                  min(high["seeds"], low["seeds"]))
