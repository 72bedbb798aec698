"""Measure a draft the way it will be deployed: acceptance, tokens per target call, wall-clock speedup.

Used by ``scripts/eval_acceptance.py`` and by the trainer at every checkpoint (one code path).

Timing protocol: a warm-up first; the same prompts and the same number of new tokens for plain and speculative
decoding (plain decoding generates exactly as many tokens as the speculative run produced); the device is
synchronised around every timed call. For each gamma and prompt, plain decoding is re-timed, interleaved with the
speculative runs (speculative, plain, speculative, plain, ... ``repeats`` times each; per-prompt medians), so that
every row's speedup is a ratio of timings taken side by side: a plain timing is never reused by a later gamma,
whose speedup would otherwise carry whatever load the machine had when the first gamma ran.

Cost model (Leviathan et al.): predicted speedup = tau / (gamma * c + v), c and v measured on the decoder's own
loops by decode.measure.cost_model.measure_cost_ratios (its docstring has the definitions and protocol), on the run's
hardware and path (compiled when ``compile``) and under its sampling settings, over ``max_new_tokens`` from the
first prompt.

``compile``: plain, speculative and cost-ratio timings all run on the static-cache, torch.compiled path
(decode.loop.static). The caches are sized once for the longest prompt, every step is compiled in the warm-up (its time
is ``compile_seconds``, never part of tokens/s), and the compiled steps are reused by later evaluations of the same
models (the trainer's checkpoints). ``gamma "auto"`` (decode.loop.auto_gamma) gives a row with ``mean_gamma``.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence

import torch
from tqdm.auto import tqdm

from decode.loop import static
from decode.loop.auto_gamma import is_auto, resolve_gamma
from decode.loop.drafters import DraftingKind
from decode.loop.speculative import GenerateOutput, autoregressive_generate, check_gamma, speculative_generate
from decode.loop.speedup import CostRatios
from decode.loop.timing import median_time, timed_call
from decode.measure.cost_model import measure_cost_ratios
from decode.measure.results import Result
from decode.measure.settings import EvalSettings
from decode.measure.tally import Tally, category_names, category_tallies


# ----------------------------------------------------------------------------------------------------------------
# transformers assisted generation, for comparison
# ----------------------------------------------------------------------------------------------------------------
def hf_assisted(target, draft, prompt: torch.Tensor, n_new: int, gamma: int, settings: EvalSettings,
                kind: DraftingKind):
    """transformers' assisted generation with a fixed gamma (confidence threshold off), exactly ``n_new`` tokens,
    run by the draft's ``kind``.
    (transformers 5.23 refuses it with its static cache: "assisted generate is not supported with Static cache".)"""
    kwargs = dict(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=settings.temperature > 0,
                  pad_token_id=target.config.eos_token_id if target.config.pad_token_id is None
                  else target.config.pad_token_id)
    if settings.temperature > 0:
        kwargs.update(temperature=settings.temperature, top_k=settings.top_k or 0, top_p=settings.top_p or 1.0)
    return kind.assisted_generate(target, draft, prompt, gamma, **kwargs)


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


def warm_up(target, draft, prompts: list[torch.Tensor], settings: EvalSettings,
            kind: DraftingKind | None = None) -> None:
    """Size the static caches for the longest prompt and run every gamma once (compiling every step when
    ``settings.compile``), outside the timed region."""
    device = next(target.parameters()).device
    longest = max(prompts, key=lambda p: p.shape[1])
    max_gamma = max(max(check_gamma(g)) for g in settings.gammas)
    if settings.compile:
        capacity = longest.shape[1] + settings.max_new_tokens + max_gamma + 2
        with torch.inference_mode():
            static.session(target, "target").reserve(capacity)
            if kind is not None:  # a drafter handed as it is sizes its own caches
                kind.reserve(draft, target, capacity, max_gamma)
    sampling = dict(temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p)
    for gamma in settings.gammas:
        speculative_generate(target, draft, longest, max_new_tokens=min(8, settings.max_new_tokens), gamma=gamma,
                             generator=make_generator(device, 0), compile=settings.compile, kind=kind, **sampling)
    autoregressive_generate(target, longest, max_new_tokens=min(8, settings.max_new_tokens),
                            generator=make_generator(device, 0), compile=settings.compile, **sampling)


@torch.inference_mode()
def evaluate_acceptance(
    target: torch.nn.Module,
    draft,
    prompts: Sequence[torch.Tensor],
    settings: EvalSettings,
    progress: bool = True,
    outputs: list[dict] | None = None,
    categories: Sequence[str | None] | None = None,
    cost_ratios: Mapping[int, CostRatios] | None = None,
    kind: DraftingKind | None = None,
) -> list[dict]:
    """One result dict per gamma (keys in docs/reference/interfaces.md). ``prompts``: 1-D token id tensors.

    ``categories`` (one per prompt, or None): each result then holds ``by_category``, a result dict per category
    over that category's prompts (prompts without one are 'uncategorized'; cost ratios are the run's).
    If ``outputs`` is a list, per-prompt token ids of the plain and speculative continuations are appended to it.
    ``cost_ratios`` (gamma -> CostRatios) are used for predicted_speedup instead of measuring them here (the trainer
    measures them once per run). ``draft``: a drafter, or a draft in memory with its ``kind``."""
    if not prompts:
        raise ValueError("no prompts to evaluate")
    if settings.compare_hf and (kind is None or kind.assisted_refusal):
        raise ValueError(f"--compare-hf: {kind.assisted_refusal if kind else 'a drafter handed without its kind'}")
    names = category_names(categories)
    if names is not None and len(names) != len(prompts):
        raise ValueError(f"{len(names)} categories for {len(prompts)} prompts")
    device = next(target.parameters()).device
    prompts = [p.view(1, -1).to(device) for p in prompts]
    compiled_before = static.compile_seconds(target, draft)
    if settings.warmup or settings.compile:
        warm_up(target, draft, prompts, settings, kind)
    bar = tqdm(total=len(settings.gammas) * len(prompts), desc="eval-acceptance", disable=not progress, leave=False)
    results = [evaluate_gamma(target, draft, prompts, settings, gamma, bar, outputs, names, cost_ratios, kind)
               for gamma in settings.gammas]
    bar.close()
    for result in results:  # the evaluation's compilation (warm-up), reported apart from every tokens/s
        result["compile_seconds"] = static.compile_seconds(target, draft) - compiled_before
    return results


@torch.inference_mode()
def acceptance_only(target: torch.nn.Module, draft, prompts: Sequence[torch.Tensor], settings: EvalSettings,
                    kind: DraftingKind | None = None) -> list[dict]:
    """Acceptance alone, per gamma of ``settings``: speculative decoding of every prompt (1-D token ids) with the
    sampling seed of evaluate_acceptance, nothing timed and no plain decoding. One dict per gamma: gamma, temperature,
    num_prompts, acceptance_rate, draft_acceptance_rate, mean_accepted_tokens (tau), per_position_acceptance and the
    merged stats (specdistill-eval --acceptance-only). What the trainer measures on its own training prompts
    beside the held-out ones (distill.run.callbacks), where only acceptance is compared."""
    if not prompts:
        raise ValueError("no prompts to measure")
    device = next(target.parameters()).device
    sampling = dict(temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p,
                    compile=settings.compile)
    rows = []
    for gamma in settings.gammas:
        stats = None
        for i, prompt in enumerate(prompts):
            out = speculative_generate(target, draft, prompt.view(1, -1).to(device),
                                       max_new_tokens=settings.max_new_tokens, gamma=gamma,
                                       eos_token_id=settings.eos_token_id,
                                       generator=make_generator(device, settings.seed + i),
                                       draft_past_end=settings.draft_past_end, kind=kind, **sampling)
            stats = out.stats if stats is None else stats.merge(out.stats)
        rows.append({"gamma": gamma, "temperature": settings.temperature, "num_prompts": len(prompts),
                     "acceptance_rate": stats.acceptance_rate, "draft_acceptance_rate": stats.draft_acceptance_rate,
                     "mean_accepted_tokens": stats.mean_accepted_tokens,
                     "per_position_acceptance": stats.per_position_acceptance, "stats": stats.to_dict()})
    return rows


def evaluate_gamma(target, draft, prompts: list[torch.Tensor], settings: EvalSettings, gamma: int | str, bar,
                   outputs: list[dict] | None, names: list[str] | None = None,
                   cost_ratios: Mapping[int, CostRatios] | None = None, kind: DraftingKind | None = None) -> dict:
    """Time plain, speculative (and transformers assisted) decoding of every prompt at one gamma; the result over
    all prompts, with ``by_category`` when the prompts have categories (``names``)."""
    device = prompts[0].device
    sampling = dict(temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p,
                    compile=settings.compile)
    tally, by_category, chosen = Tally(gamma), category_tallies(names, gamma), []
    for i, prompt in enumerate(prompts):
        seed = settings.seed + i
        spec, plain, t_spec, t_plain = time_side_by_side(
            lambda: speculative_generate(target, draft, prompt, max_new_tokens=settings.max_new_tokens,
                                         gamma=gamma, eos_token_id=settings.eos_token_id,
                                         generator=make_generator(device, seed),
                                         draft_past_end=settings.draft_past_end, kind=kind, **sampling),
            lambda n_new: autoregressive_generate(target, prompt, max_new_tokens=n_new,
                                                  generator=make_generator(device, seed), **sampling),
            device, settings.repeats)
        n_new, plain_tokens = len(spec.new_tokens), plain.new_tokens
        chosen += spec.chosen_gammas
        mean_chosen = statistics.mean(spec.chosen_gammas) if spec.chosen_gammas else None  # "auto" only
        hf_gamma = resolve_gamma(gamma, mean_chosen).deployed
        t_hf = 0.0
        if settings.compare_hf and n_new > 0:
            _, t_hf = median_time(quiet_transformers(lambda: hf_assisted(target, draft, prompt, n_new, hf_gamma,
                                                                           settings, kind)),
                                  device, settings.repeats)
        counts = (spec.stats, t_spec, t_plain, t_hf, n_new, plain_tokens == spec.new_tokens)
        tally.add(*counts)
        if names is not None:
            by_category[names[i]].add(*counts)
        if outputs is not None:
            outputs.append({"prompt_index": i, "gamma": gamma, "temperature": settings.temperature,
                            "prompt_ids": prompt[0].tolist(), "plain_ids": plain_tokens,
                            "speculative_ids": spec.new_tokens, **({"category": names[i]} if names else {})})
        bar.update(1)
    mean_gamma = statistics.mean(chosen) if chosen else None
    cost_gamma = resolve_gamma(gamma, mean_gamma).cost_ratios
    if cost_ratios and cost_gamma in cost_ratios:  # measured once per run by the caller
        costs = cost_ratios[cost_gamma]
    else:
        costs = measure_cost_ratios(target, draft, prompts[0], cost_gamma, compile=settings.compile,
                                    new_tokens=settings.max_new_tokens, sampling=settings.sampling, kind=kind)
    result = summarize(tally, settings, costs, mean_gamma)
    if by_category:
        result.by_category = {name: summarize(t, settings, costs, mean_gamma) for name, t in by_category.items()}
    return result.to_dict()


def time_side_by_side(speculative: Callable[[], GenerateOutput], plain: Callable[[int], GenerateOutput],
                      device: torch.device, repeats: int) -> tuple[GenerateOutput, GenerateOutput, float, float]:
    """Speculative and plain decoding timed alternately ``repeats`` times each (plain generating as many tokens as
    the speculative run): both outputs and both median seconds."""
    spec_s, plain_s = [], []
    for _ in range(repeats):
        spec, seconds = timed_call(speculative, device)
        spec_s.append(seconds)
        base, seconds = timed_call(lambda: plain(len(spec.new_tokens)), device)
        plain_s.append(seconds)
    return spec, base, statistics.median(spec_s), statistics.median(plain_s)


def summarize(tally: Tally, settings: EvalSettings, costs: CostRatios, mean_gamma: float | None = None) -> Result:
    """The result of one gamma over the tallied prompts: summaries derived from raw counts and timings (raw counts
    kept). For gamma "auto" the cost model is evaluated at the mean chosen gamma."""
    stats, num_prompts, new_tokens, gamma = tally.stats, tally.num_prompts, tally.new_tokens, tally.gamma
    plain_s, spec_s, hf_s = tally.plain_s, tally.spec_s, tally.hf_s
    tau = stats.mean_accepted_tokens
    return Result(
        gamma=gamma,
        temperature=settings.temperature,
        num_prompts=num_prompts,
        new_tokens=new_tokens,
        acceptance_rate=stats.acceptance_rate,
        draft_acceptance_rate=stats.draft_acceptance_rate,
        mean_accepted_tokens=tau,
        per_position_acceptance=stats.per_position_acceptance,
        target_tokens_per_s=new_tokens / plain_s if plain_s else 0.0,
        speculative_tokens_per_s=new_tokens / spec_s if spec_s else 0.0,
        speedup=plain_s / spec_s if spec_s else 0.0,
        predicted_speedup=costs.predicted_speedup(tau, resolve_gamma(gamma, mean_gamma).cost_model),
        draft_cost_ratio=costs.draft_cost_ratio,
        verify_cost_ratio=costs.verify_cost_ratio,
        greedy_match=tally.matches / num_prompts if settings.temperature == 0 else None,
        compiled=settings.compile,
        stats=stats.to_dict(),
        mean_gamma=mean_gamma if is_auto(gamma) else None,
        hf_assisted_tokens_per_s=(new_tokens / hf_s if hf_s else 0.0) if settings.compare_hf else None,
        host_reads_per_step=stats.host_reads_per_step,
    )
