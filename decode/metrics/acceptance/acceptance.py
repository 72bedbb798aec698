"""A local `evaluate` metric: speculative-decoding acceptance summaries from the raw per-verify-pass counts.

    metric = evaluate.load("decode/metrics/acceptance")        # from a checkout; or the path of this file; offline
    metric = evaluate.load(decode.loop.stats.ACCEPTANCE_METRIC)    # wherever specdistill is installed
    metric.compute(drafted=[4, 4], accepted=[4, 1], produced=[5, 2], min_pq=[[.9, .8, .9, .7], [.6, .3]])

The summaries are those of `decode.loop.stats.SpecStats` (the counts are fed to it, so the two cannot drift apart).
"""
from __future__ import annotations

import datasets
import evaluate

from decode.loop.stats import SpecStats

_DESCRIPTION = """\
Acceptance of a draft model in speculative decoding, computed from raw counts recorded per target verify pass:

acceptance_rate       = mean over verified positions of sum_x min(p(x), q(x))  (= 1 - TV(p, q))
draft_acceptance_rate = accepted draft tokens / drafted tokens
mean_accepted_tokens  = new tokens / verify passes (bonus or resampled token included; block efficiency)
per_position_acceptance[i] = P(draft token i accepted | tokens 0..i-1 accepted) = accepted[i] / verified[i]
"""

_KWARGS_DESCRIPTION = """\
Args (one entry per target verify pass):
    drafted (`list[int]`): draft tokens proposed in the pass (gamma, or fewer near the end or for prompt lookup).
    accepted (`list[int]`): leading draft tokens the target kept, 0 <= accepted <= drafted.
    produced (`list[int]`): new tokens committed by the pass, 0 <= produced <= accepted + 1
        (accepted + 1 unless generation stopped inside the block).
    min_pq (`list[list[float]]`): sum_x min(p(x), q(x)) at each verified position: the accepted ones and the
        first rejected one, so min(accepted + 1, drafted) values in [0, 1].
Returns:
    acceptance_rate (`float`), draft_acceptance_rate (`float`), mean_accepted_tokens (`float`),
    per_position_acceptance (`list[float]`, one per draft position), num_verify_passes (`int`).
    A rate with nothing to count (no verified position, no drafted token) is 0.0, as in decode.loop.stats.
Raises:
    ValueError naming the pass whose counts are inconsistent.
Example:
    >>> metric = evaluate.load("decode/metrics/acceptance")
    >>> metric.compute(drafted=[2], accepted=[1], produced=[2], min_pq=[[1.0, 0.5]])["mean_accepted_tokens"]
    2.0
"""

_CITATION = """\
@inproceedings{leviathan2023fast,
  title={Fast Inference from Transformers via Speculative Decoding},
  author={Leviathan, Yaniv and Kalman, Matan and Matias, Yossi},
  booktitle={ICML},
  year={2023}
}
"""


def check_pass(index: int, drafted: int, accepted: int, produced: int, min_pq: list[float]) -> None:
    """Raise ValueError unless the counts of verify pass ``index`` are consistent."""
    verified = min(accepted + 1, drafted)
    problems = [
        (drafted < 0, f"drafted={drafted} is negative"),
        (not 0 <= accepted <= drafted, f"accepted={accepted} is not in [0, drafted={drafted}]"),
        (not 0 <= produced <= accepted + 1, f"produced={produced} is not in [0, accepted + 1 = {accepted + 1}]"),
        (len(min_pq) != verified, f"min_pq has {len(min_pq)} values, expected min(accepted + 1, drafted) = {verified}"),
        (any(not 0.0 <= v <= 1.0 + 1e-6 for v in min_pq), "min_pq values must lie in [0, 1]"),
    ]
    for failed, message in problems:
        if failed:
            raise ValueError(f"verify pass {index}: {message}")


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Acceptance(evaluate.Metric):
    """Acceptance summaries of speculative decoding from raw per-verify-pass counts."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            module_type="metric",
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({
                "drafted": datasets.Value("int64"),
                "accepted": datasets.Value("int64"),
                "produced": datasets.Value("int64"),
                "min_pq": datasets.List(datasets.Value("float64")),
            }),
            reference_urls=["https://arxiv.org/abs/2211.17192"],
        )

    def _compute(self, drafted: list[int], accepted: list[int], produced: list[int],
                 min_pq: list[list[float]]) -> dict:
        stats = SpecStats(gamma=max([1, *drafted]))
        for index, row in enumerate(zip(drafted, accepted, produced, min_pq)):
            check_pass(index, *row)
            n_drafted, n_accepted, n_produced, overlaps = row
            stats.record_step(drafted=n_drafted, accepted=n_accepted, min_pq=list(overlaps), produced=n_produced)
        return {
            "acceptance_rate": stats.acceptance_rate,
            "draft_acceptance_rate": stats.draft_acceptance_rate,
            "mean_accepted_tokens": stats.mean_accepted_tokens,
            "per_position_acceptance": stats.per_position_acceptance,
            "num_verify_passes": stats.target_calls,
        }
