"""decode/metrics/acceptance: the local `evaluate` metric loads offline and matches
decode.loop.stats on the same counts."""
from __future__ import annotations

import socket
from pathlib import Path

import evaluate
import pytest

from decode.loop.stats import ACCEPTANCE_METRIC, SpecStats

METRIC_DIR = Path(__file__).resolve().parents[1] / "decode" / "metrics" / "acceptance"


def test_the_library_names_this_folder():
    assert Path(ACCEPTANCE_METRIC) == METRIC_DIR.resolve()
    assert (Path(ACCEPTANCE_METRIC) / "acceptance.py").is_file()


# Three verify passes at gamma 4: all accepted (+1 bonus), one accepted then rejected, nothing drafted (prompt
# lookup found no match; the target still produces one token).
PASSES = {
    "drafted": [4, 4, 0],
    "accepted": [4, 1, 0],
    "produced": [5, 2, 1],
    "min_pq": [[0.9, 0.8, 0.9, 0.7], [0.6, 0.3], []],
}


@pytest.fixture(scope="module")
def metric():
    return evaluate.load(str(METRIC_DIR))


def test_loads_offline_from_the_folder_and_the_file(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("the metric tried to open a network connection")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", True)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    for path in (METRIC_DIR, METRIC_DIR / "acceptance.py"):
        metric = evaluate.load(str(path))
        assert metric.name == "acceptance"
        assert metric.compute(drafted=[2], accepted=[1], produced=[2], min_pq=[[1.0, 0.5]]) == {
            "acceptance_rate": 0.75, "draft_acceptance_rate": 0.5, "mean_accepted_tokens": 2.0,
            "per_position_acceptance": [1.0, 0.0], "num_verify_passes": 1}


def test_values_by_hand(metric):
    out = metric.compute(**PASSES)
    assert out["acceptance_rate"] == pytest.approx((0.9 + 0.8 + 0.9 + 0.7 + 0.6 + 0.3) / 6)  # 6 verified positions
    assert out["draft_acceptance_rate"] == pytest.approx(5 / 8)
    assert out["mean_accepted_tokens"] == pytest.approx(8 / 3)  # 8 new tokens over 3 verify passes
    assert out["per_position_acceptance"] == pytest.approx([1.0, 0.5, 1.0, 1.0])  # position 2: 1 of 2 verified
    assert out["num_verify_passes"] == 3


def test_matches_decode_stats_and_batches_add_up(metric):
    stats = SpecStats(gamma=4)
    for drafted, accepted, produced, min_pq in zip(*PASSES.values()):
        stats.record_step(drafted=drafted, accepted=accepted, min_pq=min_pq, produced=produced)
    metric.add_batch(**{k: v[:2] for k, v in PASSES.items()})
    metric.add_batch(**{k: v[2:] for k, v in PASSES.items()})
    out = metric.compute()
    assert out["acceptance_rate"] == pytest.approx(stats.acceptance_rate)
    assert out["draft_acceptance_rate"] == pytest.approx(stats.draft_acceptance_rate)
    assert out["mean_accepted_tokens"] == pytest.approx(stats.mean_accepted_tokens)


@pytest.mark.parametrize("field, bad, message", [
    ("accepted", [5, 1, 0], "verify pass 0: accepted=5 is not in"),
    ("produced", [5, 3, 1], "verify pass 1: produced=3"),
    ("min_pq", [[0.9, 0.8, 0.9, 0.7], [0.6], []], "verify pass 1: min_pq has 1 values, expected"),
])
def test_inconsistent_counts_name_the_pass(metric, field, bad, message):
    with pytest.raises(ValueError, match=message):
        metric.compute(**{**PASSES, field: bad})
