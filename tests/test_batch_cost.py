"""The cost model at a batch (decode.measure.batch_cost): T(n) read off the plain levels, and a prediction that equals
the throughput ratio of an engine whose step time is exactly a line in the tokens it carries."""
import pytest

from decode.measure.batch_cost import add_batch_predictions, batch_prediction, step_seconds
from decode.measure.settings import EvalSettings
from decode.serving.vllm_engine import vllm_results


def test_step_seconds_passes_through_each_level_and_is_linear_between_and_beyond():
    seconds = step_seconds({8: 8 / 0.05, 1: 1 / 0.04, 32: 32 / 0.14})  # T(1) 0.04, T(8) 0.05, T(32) 0.14 s
    assert [seconds(n) for n in (1, 8, 32)] == [pytest.approx(0.04), pytest.approx(0.05), pytest.approx(0.14)]
    assert seconds(4.5) == pytest.approx(0.045)  # halfway between 1 and 8
    assert seconds(20) == pytest.approx(0.095)  # halfway between 8 and 32
    assert seconds(56) == pytest.approx(0.23)  # past 32: the 8-32 line extended
    assert seconds(0.0) == pytest.approx(0.04 - 0.01 / 7)  # below 1: the 1-8 line extended
    for bad in ({1: 20.0}, {}, {1: 20.0, 8: 0.0}):
        with pytest.raises(ValueError, match="two or more levels"):
            step_seconds(bad)


def engine_run(level: int, steps_per_sequence: int, drafted: list[int], accepted: list[int], base: float,
               per_token: float) -> tuple[float, int, int, int]:
    """(seconds, new tokens, drafted, accepted) of ``level`` sequences decoded in lockstep by an engine whose step
    costs base + per_token * (tokens it carries); step i of every sequence drafts drafted[i] and accepts accepted[i]."""
    seconds = new = 0
    for step in range(steps_per_sequence):
        seconds += base + per_token * level * (1 + drafted[step])
        new += level * (1 + accepted[step])
    return seconds, new, level * sum(drafted), level * sum(accepted)


def test_the_prediction_is_the_measured_ratio_of_an_engine_with_a_linear_step_cost():
    """Plain decoding at levels 1 and 8 pins the line; a speculative run at any level (drafting 4 tokens on some
    steps and none on others) then has the throughput ratio the model predicts, to rounding."""
    base, per_token, length = 0.05, 0.002, 40
    plain = {n: n * length / engine_run(n, length, [0] * length, [0] * length, base, per_token)[0] for n in (1, 8)}
    seconds = step_seconds(plain)
    drafted = [4, 0, 4, 4, 0] * 8
    accepted = [2, 0, 0, 4, 0] * 8
    for level in (1, 3, 8, 32):  # 3 between the levels, 32 past them
        spec_s, new, draft_tokens, accepted_tokens = engine_run(level, length, drafted, accepted, base, per_token)
        predicted, verify = batch_prediction(level, new, draft_tokens, accepted_tokens, seconds)
        plain_rate = level / (base + per_token * level)  # tokens/s of plain decoding at this level
        assert predicted == pytest.approx((new / spec_s) / plain_rate)
        assert verify == pytest.approx((base + per_token * level * (1 + 12 / 5)) / (base + per_token * level))


def result(level: int, plain_rate: float, new: int, drafted: int, accepted: int) -> dict:
    return {"concurrency": level, "target_tokens_per_s": plain_rate, "new_tokens": new, "predicted_speedup": None,
            "verify_cost_ratio": None, "draft_cost_ratio": None,
            "stats": {"num_draft_tokens": drafted, "num_accepted_tokens": accepted}}


def test_predictions_need_two_levels_and_fill_each_level():
    one = [result(1, 20.0, 100, 80, 20)]
    add_batch_predictions(one)
    assert one[0]["predicted_speedup"] is None  # one level: no slope, no T(n)
    rows = [result(1, 20.0, 100, 80, 20), result(8, 144.0, 100, 80, 20)]
    add_batch_predictions(rows)
    seconds = step_seconds({1: 20.0, 8: 144.0})
    for r in rows:
        n = r["concurrency"]
        v = seconds(n * (1 + 80 / 80)) / seconds(n)  # S = 100 - 20 = 80 sequence-steps, d = 1
        assert r["verify_cost_ratio"] == pytest.approx(v) and r["draft_cost_ratio"] == 0.0
        assert r["predicted_speedup"] == pytest.approx((100 / 80) / v)


def test_vllm_results_predict_only_for_a_drafter_without_a_model():
    """The worker's response at two levels: prompt lookup (free_drafts) gets a prediction per level, a model
    drafter none (its cost at batch N is not measured by any plain run)."""
    def level(n, plain_s, spec_s):
        counters = {"num_drafts": 4, "num_draft_tokens": 8, "num_accepted_tokens": 3,
                    "num_accepted_tokens_per_pos": [2, 1]}
        outputs = [[5, 6, 7, 8], [9, 10, 11, 12]]
        return {"max_num_seqs": n, "plain": {"outputs": outputs, "seconds": plain_s},
                "speculative": [{"gamma": 2, "outputs": outputs, "seconds": spec_s, "counters": counters}]}

    response = {"vllm_version": "0.32.0", "levels": [level(1, 2.0, 1.6), level(2, 1.2, 1.5)]}
    settings = EvalSettings(gammas=[2], max_new_tokens=4)
    assert all(r["predicted_speedup"] is None for r in vllm_results(response, settings))
    rows = vllm_results(response, settings, free_drafts=True)
    seconds = step_seconds({1: 4.0, 2: 8 / 1.2})  # 8 tokens per plain call
    for r in rows:
        n = r["concurrency"]
        v = seconds(n * (1 + 8 / 5)) / seconds(n)  # S = 8 - 3 = 5 sequence-steps
        assert r["predicted_speedup"] == pytest.approx((8 / 5) / v) and r["verify_cost_ratio"] == pytest.approx(v)
