"""Raw counts of a speculative run, and the summaries derived from them at report time.

acceptance_rate       = mean over verified positions of sum_x min(p(x), q(x))   (= 1 - TV(p, q); Leviathan et al.'s
                        per-token acceptance probability, a low-variance estimate)
draft_acceptance_rate = accepted draft tokens / drafted tokens
mean_accepted_tokens  = tau = new tokens / target verify passes (the bonus or resampled token included);
                        also called block efficiency
per_position_acceptance[i] = P(draft token i accepted | tokens 0..i-1 accepted) = accepted[i] / verified[i]
host_reads_per_step   = device-to-host reads of the decoder / target verify passes (1: one read a round)

The same summaries as an `evaluate` metric (installed with the package, loads offline):

    evaluate.load(ACCEPTANCE_METRIC).compute(drafted=[4], accepted=[2], produced=[3], min_pq=[[.9, .7, .2]])
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

ACCEPTANCE_METRIC = str(Path(__file__).resolve().parents[1] / "metrics" / "acceptance")  # evaluate.load's path


@dataclass
class SpecStats:
    gamma: int
    target_calls: int = 0          # verify passes of the target (the prefill is not counted)
    new_tokens: int = 0            # tokens produced by those passes
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    accepted_length_histogram: list[int] = field(default_factory=list)  # [gamma + 1]: steps that kept n drafts
    per_position_drafted: list[int] = field(default_factory=list)       # [gamma]
    per_position_verified: list[int] = field(default_factory=list)      # [gamma]: compared with the target
    per_position_accepted: list[int] = field(default_factory=list)      # [gamma]
    per_position_min_pq_sum: list[float] = field(default_factory=list)  # [gamma]: sum over verified of sum_x min(p, q)
    host_reads: int = 0            # device-to-host reads the decoder made (one per verify pass: the accepted tokens)

    def __post_init__(self) -> None:
        g = self.gamma
        self.accepted_length_histogram = self.accepted_length_histogram or [0] * (g + 1)
        self.per_position_drafted = self.per_position_drafted or [0] * g
        self.per_position_verified = self.per_position_verified or [0] * g
        self.per_position_accepted = self.per_position_accepted or [0] * g
        self.per_position_min_pq_sum = self.per_position_min_pq_sum or [0.0] * g

    def record_step(self, drafted: int, accepted: int, min_pq: list[float], produced: int) -> None:
        """One verify pass: ``drafted`` proposed, the first ``accepted`` kept, ``produced`` new tokens committed;
        ``min_pq[i]`` = sum_x min(p_i, q_i) for each verified position i (accepted ones and the first rejected)."""
        self.target_calls += 1
        self.new_tokens += produced
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        self.accepted_length_histogram[accepted] += 1
        for i in range(drafted):
            self.per_position_drafted[i] += 1
        for i, overlap in enumerate(min_pq):
            self.per_position_verified[i] += 1
            self.per_position_min_pq_sum[i] += overlap
        for i in range(accepted):
            self.per_position_accepted[i] += 1

    def merge(self, other: SpecStats) -> SpecStats:
        """Counts of both runs (same gamma)."""
        if other.gamma != self.gamma:
            raise ValueError(f"cannot merge stats of gamma {self.gamma} and {other.gamma}")
        out = SpecStats(self.gamma)
        for name, value in asdict(self).items():
            if name == "gamma":
                continue
            theirs = getattr(other, name)
            merged = [a + b for a, b in zip(value, theirs)] if isinstance(value, list) else value + theirs
            setattr(out, name, merged)
        return out

    # ---- summaries, derived from the counts ----
    @property
    def acceptance_rate(self) -> float:
        verified = sum(self.per_position_verified)
        return sum(self.per_position_min_pq_sum) / verified if verified else 0.0

    @property
    def draft_acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def mean_accepted_tokens(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def host_reads_per_step(self) -> float:
        return self.host_reads / self.target_calls if self.target_calls else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / v if v else 0.0 for a, v in zip(self.per_position_accepted, self.per_position_verified)]

    def to_dict(self) -> dict:
        return asdict(self)
