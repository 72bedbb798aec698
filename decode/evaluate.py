"""Measure a draft the way it will be deployed: acceptance, tokens per target call, wall-clock speedup.

Used by ``scripts/eval_acceptance.py`` and by the trainer at every checkpoint (one code path).

Timing protocol: a warm-up first; the same prompts and the same number of new tokens for plain and speculative
decoding (plain decoding generates exactly as many tokens as the speculative run produced); the device is
synchronised around every timed call; per-prompt medians over ``repeats``.

Cost model (Leviathan et al.): predicted speedup = tau / (gamma * c + v), where
  c = draft step time / target step time, v = target pass over gamma + 1 tokens / target 1-token step,
both measured here on the run's hardware.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch
from tqdm.auto import tqdm

from decode.cache import CachedLM
from decode.drafters import PromptLookupDrafter
from decode.speculative import autoregressive_generate, speculative_generate
from decode.stats import SpecStats


@dataclass
class EvalSettings:
    gammas: list[int] = field(default_factory=lambda: [1, 2, 4])
    temperature: float = 0.0
    max_new_tokens: int = 64
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    repeats: int = 1
    compare_hf: bool = False
    warmup: bool = True
    eos_token_id: int | list[int] | None = None

    def __post_init__(self) -> None:
        if not self.gammas or any(int(g) < 1 for g in self.gammas):
            raise ValueError(f"gamma must be >= 1 (got {self.gammas})")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")


# ----------------------------------------------------------------------------------------------------------------
# timing
# ----------------------------------------------------------------------------------------------------------------
def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn: Callable[[], object], device: torch.device, repeats: int) -> tuple[object, float]:
    """Run ``fn`` ``repeats`` times; its last result and the median wall-clock seconds (device synchronised)."""
    times, result = [], None
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        result = fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


@dataclass
class CostRatios:
    draft_cost_ratio: float   # c = draft step / target 1-token step
    verify_cost_ratio: float  # v = target pass over gamma + 1 tokens / target 1-token step

    def predicted_speedup(self, tau: float, gamma: int) -> float:
        # speedup = tau / (gamma * c + v)
        return tau / (gamma * self.draft_cost_ratio + self.verify_cost_ratio)


@torch.inference_mode()
def measure_cost_ratios(target, draft, prompt: torch.Tensor, gamma: int, repeats: int = 7) -> CostRatios:
    """Time one target step, one draft step and one (gamma + 1)-token verify pass at the prompt's context."""
    device = prompt.device
    target_lm = CachedLM(target)
    target_lm.forward(prompt, last_only=True)
    one = prompt[:, -1:]
    block = prompt[:, -1:].repeat(1, gamma + 1)

    def target_step():
        target_lm.forward(one, last_only=True)
        target_lm.rollback(1)

    def verify_pass():
        target_lm.forward(block)
        target_lm.rollback(gamma + 1)

    for _ in range(2):  # warm-up
        target_step(), verify_pass()
    _, t_target = median_time(target_step, device, repeats)
    _, t_verify = median_time(verify_pass, device, repeats)

    if isinstance(draft, PromptLookupDrafter):
        history = prompt[0].tolist()
        _, t_draft = median_time(lambda: draft.lookup(history, gamma), device, repeats)
        t_draft /= max(gamma, 1)  # one lookup proposes the whole block
    else:
        draft_lm = CachedLM(draft)
        draft_lm.forward(prompt, last_only=True)

        def draft_step():
            draft_lm.forward(one, last_only=True)
            draft_lm.rollback(1)

        draft_step()
        _, t_draft = median_time(draft_step, device, repeats)
    return CostRatios(t_draft / t_target, t_verify / t_target)


# ----------------------------------------------------------------------------------------------------------------
# transformers assisted generation, for comparison
# ----------------------------------------------------------------------------------------------------------------
ASSISTED_SETTINGS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


def hf_assisted(target, draft, prompt: torch.Tensor, n_new: int, gamma: int, settings: EvalSettings):
    """transformers' assisted generation with a fixed gamma (confidence threshold off), exactly ``n_new`` tokens."""
    kwargs = dict(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=settings.temperature > 0,
                  pad_token_id=target.config.eos_token_id if target.config.pad_token_id is None
                  else target.config.pad_token_id)
    if settings.temperature > 0:
        kwargs.update(temperature=settings.temperature, top_k=settings.top_k or 0, top_p=settings.top_p or 1.0)
    if isinstance(draft, PromptLookupDrafter):
        return target.generate(prompt, prompt_lookup_num_tokens=gamma, max_matching_ngram_size=draft.max_ngram_size,
                               **kwargs)
    # transformers 5 reads these from the assistant's generation_config (generate() kwargs are ignored); the
    # caller's settings are put back afterwards
    gc = draft.generation_config
    saved = {name: getattr(gc, name) for name in ASSISTED_SETTINGS}
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = gamma, "constant", 0.0
    try:
        return target.generate(prompt, assistant_model=draft, **kwargs)
    finally:
        for name, value in saved.items():
            setattr(gc, name, value)


def quiet_transformers(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` with transformers' generation warnings silenced (they repeat on every timed call)."""
    from transformers.utils import logging

    def run():
        level = logging.get_verbosity()
        logging.set_verbosity_error()
        try:
            return fn()
        finally:
            logging.set_verbosity(level)

    return run


# ----------------------------------------------------------------------------------------------------------------
# the evaluation
# ----------------------------------------------------------------------------------------------------------------
def make_generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


@torch.inference_mode()
def evaluate_acceptance(
    target: torch.nn.Module,
    draft,
    prompts: Sequence[torch.Tensor],
    settings: EvalSettings,
    progress: bool = True,
    outputs: list[dict] | None = None,
    cost_ratios: Mapping[int, CostRatios] | None = None,
) -> list[dict]:
    """One result dict per gamma (keys in docs/INTERFACES.md). ``prompts``: 1-D token id tensors.

    If ``outputs`` is a list, per-prompt token ids of the plain and speculative continuations are appended to it.
    ``cost_ratios`` (gamma -> CostRatios) are used for predicted_speedup instead of measuring them here (the trainer
    measures them once per run)."""
    if not prompts:
        raise ValueError("no prompts to evaluate")
    device = next(target.parameters()).device
    prompts = [p.view(1, -1).to(device) for p in prompts]
    sampling = dict(temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p)
    if settings.warmup:
        speculative_generate(target, draft, prompts[0], max_new_tokens=min(8, settings.max_new_tokens),
                             gamma=max(settings.gammas), generator=make_generator(device, 0), **sampling)
        autoregressive_generate(target, prompts[0], max_new_tokens=min(8, settings.max_new_tokens),
                                generator=make_generator(device, 0), **sampling)
    plain_cache: dict[tuple[int, int], tuple[list[int], float]] = {}
    results = []
    bar = tqdm(total=len(settings.gammas) * len(prompts), desc="eval-acceptance", disable=not progress, leave=False)
    for gamma in settings.gammas:
        stats, spec_s, plain_s, hf_s, new_tokens, matches = SpecStats(gamma), 0.0, 0.0, 0.0, 0, 0
        for i, prompt in enumerate(prompts):
            seed = settings.seed + i
            spec, t_spec = median_time(
                lambda: speculative_generate(target, draft, prompt, max_new_tokens=settings.max_new_tokens,
                                             gamma=gamma, eos_token_id=settings.eos_token_id,
                                             generator=make_generator(device, seed), **sampling),
                device, settings.repeats)
            n_new = len(spec.new_tokens)
            if (i, n_new) not in plain_cache:
                plain, t_plain = median_time(
                    lambda: autoregressive_generate(target, prompt, max_new_tokens=n_new,
                                                    generator=make_generator(device, seed), **sampling),
                    device, settings.repeats)
                plain_cache[(i, n_new)] = (plain.new_tokens, t_plain)
            plain_tokens, t_plain = plain_cache[(i, n_new)]
            if settings.compare_hf and n_new > 0:
                _, t_hf = median_time(quiet_transformers(lambda: hf_assisted(target, draft, prompt, n_new, gamma,
                                                                               settings)),
                                      device, settings.repeats)
                hf_s += t_hf
            stats = stats.merge(spec.stats)
            spec_s, plain_s, new_tokens = spec_s + t_spec, plain_s + t_plain, new_tokens + n_new
            matches += int(plain_tokens == spec.new_tokens)
            if outputs is not None:
                outputs.append({"prompt_index": i, "gamma": gamma, "temperature": settings.temperature,
                                "prompt_ids": prompt[0].tolist(), "plain_ids": plain_tokens,
                                "speculative_ids": spec.new_tokens})
            bar.update(1)
        costs = cost_ratios[gamma] if cost_ratios else measure_cost_ratios(target, draft, prompts[0], gamma)
        results.append(summarize(gamma, settings, len(prompts), new_tokens, stats, plain_s, spec_s, hf_s, matches,
                                 costs))
    bar.close()
    return results


def summarize(gamma: int, settings: EvalSettings, num_prompts: int, new_tokens: int, stats: SpecStats,
              plain_s: float, spec_s: float, hf_s: float, matches: int, costs: CostRatios) -> dict:
    """The result object of one gamma: summaries derived from raw counts and timings (raw counts kept)."""
    tau = stats.mean_accepted_tokens
    result = {
        "gamma": gamma,
        "temperature": settings.temperature,
        "num_prompts": num_prompts,
        "new_tokens": new_tokens,
        "acceptance_rate": stats.acceptance_rate,
        "draft_acceptance_rate": stats.draft_acceptance_rate,
        "mean_accepted_tokens": tau,
        "per_position_acceptance": stats.per_position_acceptance,
        "target_tokens_per_s": new_tokens / plain_s if plain_s else 0.0,
        "speculative_tokens_per_s": new_tokens / spec_s if spec_s else 0.0,
        "speedup": plain_s / spec_s if spec_s else 0.0,
        "predicted_speedup": costs.predicted_speedup(tau, gamma),
        "draft_cost_ratio": costs.draft_cost_ratio,
        "verify_cost_ratio": costs.verify_cost_ratio,
        "greedy_match": matches / num_prompts if settings.temperature == 0 else None,
        "stats": stats.to_dict(),
    }
    if settings.compare_hf:
        result["hf_assisted_tokens_per_s"] = new_tokens / hf_s if hf_s else 0.0
    return result
