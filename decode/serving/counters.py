"""vLLM's spec-decode counters, and our raw counts put on the same basis, so that tau is computed one way.

vLLM counts a *draft* for every verify step that had at least one draft token (a step without drafts, e.g. an n-gram
lookup that found nothing, is not counted) and the draft tokens it accepted, including accepted tokens past
``max_tokens`` that are then cut off. Its prefill emits the first token; it is no step. From these counts:

    tau                        = 1 + num_accepted_tokens / num_drafts     (vLLM's mean acceptance length)
    draft_acceptance_rate      = num_accepted_tokens / num_draft_tokens
    per_position_acceptance[i] = accepted_per_pos[i] / accepted_per_pos[i - 1]   (accepted_per_pos[-1] = num_drafts)

Our decode.loop.stats.SpecStats holds the same raw counts: steps with drafts = per_position_drafted[0], accepted per
position = per_position_accepted. ``SpecCounters.from_spec_stats`` reads them so, which removes the "steps without
drafts" difference; decode.serving.parity removes the others (draft length at the end, the prefill token).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from decode.loop.stats import SpecStats


@dataclass
class SpecCounters:
    """vLLM's spec-decode counters (``vllm:spec_decode_*``) of one run, or of a share of its prompts."""

    num_drafts: int = 0                  # verify steps that had >= 1 draft token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)  # [gamma]: steps accepting >= i + 1

    @classmethod
    def from_dict(cls, data: dict) -> SpecCounters:
        """The counters of the worker's JSON (decode/serving/vllm_worker.py). Raises ValueError on a bad payload."""
        try:
            per_pos = [int(v) for v in data["num_accepted_tokens_per_pos"]]
            counters = cls(int(data["num_drafts"]), int(data["num_draft_tokens"]), int(data["num_accepted_tokens"]),
                           per_pos)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"vLLM counters are incomplete or not numbers ({err!r}): {data}") from None
        if per_pos and (per_pos[0] > counters.num_drafts or sum(per_pos) != counters.num_accepted_tokens):
            raise ValueError(f"vLLM counters disagree: per position {per_pos} vs {counters.num_drafts} drafts and "
                             f"{counters.num_accepted_tokens} accepted")
        return counters

    @classmethod
    def from_histogram(cls, histogram: list[int], num_draft_tokens: int) -> SpecCounters:
        """The counters of one request from vLLM's per-request accepted-length histogram (h[j]: steps keeping j)."""
        gamma = len(histogram) - 1
        per_pos = [sum(histogram[i + 1:]) for i in range(gamma)]  # steps that accepted >= i + 1 drafts
        return cls(sum(histogram), num_draft_tokens, sum(j * h for j, h in enumerate(histogram)), per_pos)

    @classmethod
    def from_spec_stats(cls, stats: SpecStats | dict) -> SpecCounters:
        """Our raw counts on vLLM's basis: a step counts as a draft only if it drafted a token."""
        s = stats if isinstance(stats, dict) else stats.to_dict()
        drafted = s["per_position_drafted"]
        return cls(drafted[0] if drafted else 0, s["drafted_tokens"], s["accepted_tokens"],
                   list(s["per_position_accepted"]))

    def __add__(self, other: SpecCounters) -> SpecCounters:
        width = max(len(self.num_accepted_tokens_per_pos), len(other.num_accepted_tokens_per_pos))
        pad = lambda v: v + [0] * (width - len(v))  # noqa: E731
        return SpecCounters(self.num_drafts + other.num_drafts, self.num_draft_tokens + other.num_draft_tokens,
                            self.num_accepted_tokens + other.num_accepted_tokens,
                            [a + b for a, b in zip(pad(self.num_accepted_tokens_per_pos),
                                                   pad(other.num_accepted_tokens_per_pos))])

    # ---- summaries, derived from the counts ----
    @property
    def mean_accepted_tokens(self) -> float:
        # tau = 1 + accepted / drafts
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def draft_acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        # P(d_i accepted | d_1..d_{i-1} accepted) = per_pos[i] / per_pos[i - 1], per_pos[-1] = num_drafts
        before = [self.num_drafts] + self.num_accepted_tokens_per_pos[:-1]
        return [a / b if b else 0.0 for a, b in zip(self.num_accepted_tokens_per_pos, before)]

    def to_dict(self) -> dict:
        return asdict(self)
