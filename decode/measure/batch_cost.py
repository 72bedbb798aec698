"""The cost model at a batch: vLLM serving N sequences at once (`--concurrency`), for a drafter that runs no model.

At batch 1 the cost model is tau / (gamma c + v) with c and v timed on our decoder (decode.measure.cost_model). At
N sequences in flight (vLLM's max_num_seqs) what a step costs depends on how many tokens it carries, which the
plain runs at the measured levels tell directly: a plain engine step carries N tokens and commits N, so

    T(N) = N / (plain tokens/s at level N)           seconds of one engine step carrying N tokens

and T(n) for any n is read off those points (linear between two levels; outside them, the nearest segment's line
extended). A speculative run over S sequence-steps (one per sequence per engine step) drafts D tokens and accepts
A of them, committing new = S + A tokens, so per engine step it carries N (1 + d) tokens and commits N tau_all:

    d       = D / S                  drafted tokens per sequence-step (a step whose n-gram finds no match drafts 0)
    tau_all = new / S                tokens committed per sequence-step, every step counted (vLLM's tau counts
                                     only the steps with a draft)
    v_N     = T(N (1 + d)) / T(N)    a speculative engine step, in plain engine steps at the same N
    predicted throughput ratio = tau_all / v_N                                  (c = 0: drafting runs no model)

For a drafter with a model (a standalone draft, a head) each engine step also runs the drafter at batch N, whose
cost no plain run measures: no prediction there. The prefill steps and the last, shorter steps of a batch whose
sequences end at different times are inside the measured seconds and outside the model; so is the n-gram search
itself (host work between steps). At N = 1 this is the batch-1 model with c = 0 and v taken from vLLM's own plain
step times.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence


def step_seconds(plain_rates: Mapping[int, float]) -> Callable[[float], float]:
    """T(n): seconds of an engine step carrying n tokens, from {N: plain tokens/s at max_num_seqs N} (two or more
    levels, each rate > 0): T(N) = N / rate, linear in n between levels, the end segments extended outside.
    Raises ValueError with fewer than two levels or a rate <= 0."""
    if len(plain_rates) < 2 or min(plain_rates.values()) <= 0:
        raise ValueError(f"T(n) needs two or more levels with positive plain tokens/s, got {dict(plain_rates)}")
    points = sorted((n, n / rate) for n, rate in plain_rates.items())

    def seconds(n: float) -> float:
        i = next((i for i in range(1, len(points) - 1) if n <= points[i][0]), len(points) - 1)
        (n0, t0), (n1, t1) = points[i - 1], points[i]
        # T(n) = T(n0) + (n - n0) (T(n1) - T(n0)) / (n1 - n0)
        return t0 + (n - n0) * (t1 - t0) / (n1 - n0)

    return seconds


def batch_prediction(level: int, new_tokens: int, draft_tokens: int, accepted_tokens: int,
                     seconds: Callable[[float], float]) -> tuple[float, float]:
    """(predicted throughput ratio tau_all / v_N, v_N) of a speculative run at max_num_seqs ``level`` that committed
    ``new_tokens``, drafted ``draft_tokens`` and accepted ``accepted_tokens``, with T(n) = ``seconds``."""
    steps = new_tokens - accepted_tokens  # S: each sequence-step commits one token beyond those it accepts
    tau_all = new_tokens / steps
    per_step = level * (1 + draft_tokens / steps)  # N (1 + d) tokens in an engine step
    verify = seconds(per_step) / seconds(level)  # v_N
    return tau_all / verify, verify


def add_batch_predictions(results: Sequence[dict]) -> None:
    """Fill ``predicted_speedup``, ``verify_cost_ratio`` (v_N) and ``draft_cost_ratio`` (0) of each result dict
    with a ``concurrency`` level (decode.measure.results.Result.to_dict keys), in place, where two or more levels
    were measured; the caller's drafter runs no model (the module docstring)."""
    plain = {r["concurrency"]: r["target_tokens_per_s"] for r in results if r.get("concurrency") is not None}
    if len(plain) < 2 or min(plain.values()) <= 0:
        return
    seconds = step_seconds(plain)
    for r in results:
        if r.get("concurrency") is None or r["new_tokens"] <= r["stats"]["num_accepted_tokens"]:
            continue
        r["predicted_speedup"], r["verify_cost_ratio"] = batch_prediction(
            r["concurrency"], r["new_tokens"], r["stats"]["num_draft_tokens"], r["stats"]["num_accepted_tokens"],
            seconds)
        r["draft_cost_ratio"] = 0.0
