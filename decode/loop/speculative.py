"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023), batch size 1, lossless.

One step:  draft proposes d_1..d_k ~ q  ->  the target scores [cur, d_1..d_k] in ONE pass, giving p_1..p_{k+1}
        ->  d_i is accepted with probability min(1, p_i(d_i) / q_i(d_i)), left to right
        ->  at the first rejection i, a token is drawn from norm(max(0, p_i - q_i));
            if all k are accepted, a bonus token is drawn from p_{k+1}
        ->  both KV caches are rolled back to the committed tokens.
The committed tokens are then distributed exactly as the (warped) target's own samples.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from decode.loop.auto_gamma import AUTO_GAMMAS, GammaChooser, is_auto
from decode.loop.cache import CachedLM
from kinds import kind_of
from decode.loop.drafters import Drafter
from decode.loop.sampling import SamplingConfig, draw, next_token, probs_from_logits
from decode.loop.static import StaticLM, cached_lm
from decode.loop.stats import SpecStats
import decode.loop.timing as timing
from decode.loop.timing import StepClock, synchronize


@dataclass
class GenerateOutput:
    sequences: torch.Tensor                   # [1, prompt_len + n_new]
    stats: SpecStats | None = None            # raw counts (speculative only)
    new_tokens: list[int] = field(default_factory=list)
    chosen_gammas: list[int] = field(default_factory=list)  # gamma of each step (gamma="auto" only)


# ----------------------------------------------------------------------------------------------------------------
# input checks
# ----------------------------------------------------------------------------------------------------------------
def check_inputs(input_ids: torch.Tensor, max_new_tokens: int) -> None:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, seq_len], got shape {tuple(input_ids.shape)}")
    if input_ids.shape[0] != 1:
        raise ValueError(f"batch size must be 1 (got {input_ids.shape[0]} sequences); run prompts one at a time")
    if input_ids.shape[1] == 0:
        raise ValueError("the prompt is empty: speculative decoding needs at least one prompt token")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")


def eos_set(eos_token_id: int | list[int] | None) -> set[int]:
    if eos_token_id is None:
        return set()
    return {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)


def cut_at_eos(tokens: list[int], stop: set[int]) -> list[int]:
    """``tokens`` up to and including the first stop token (all of them if there is none)."""
    for i, token in enumerate(tokens):
        if token in stop:
            return tokens[: i + 1]
    return tokens


def as_drafter(draft: torch.nn.Module | Drafter, target: torch.nn.Module, compile: bool = False,
               capacity: int = 0, max_gamma: int = 8) -> Drafter:
    """The drafter of ``draft``, built by its kind (kinds): a causal LM (ModelDrafter), an Eagle3Head
    (HeadDrafter; bound to the target's input embedding if it has none), or a drafter as is. TypeError for any
    other object; ValueError when a draft model is on another device than the target."""
    kind = kind_of(draft)
    if isinstance(draft, torch.nn.Module):
        target_device, draft_device = next(target.parameters()).device, next(draft.parameters()).device
        if target_device != draft_device:
            raise ValueError(f"target is on {target_device} but draft is on {draft_device}; put both on one device")
    return kind.drafter(draft, target, compile=compile, capacity=capacity, max_gamma=max_gamma)


def check_gamma(gamma: int | str) -> tuple[int, ...]:
    """The draft lengths a run may use: (gamma,), or AUTO_GAMMAS for "auto". Raises ValueError otherwise."""
    if is_auto(gamma):
        return AUTO_GAMMAS
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma (draft tokens per step) must be an integer >= 1 or 'auto', got {gamma!r}")
    return (gamma,)


# ----------------------------------------------------------------------------------------------------------------
# the accept step: maths of one verify pass
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class StepResult:
    num_accepted: int        # n: the first n draft tokens are kept
    next_token: int          # resampled at the first rejection, or the bonus token
    min_pq: list[float]      # sum_x min(p_i, q_i) for the verified positions i = 0..min(n, k - 1)


def accept_greedy(target_logits: torch.Tensor, drafts: torch.Tensor) -> StepResult:
    """Greedy verification: keep drafts while they equal the target's argmax; then emit the target's argmax.

    target_logits [k + 1, V], drafts [k]."""
    best = target_logits.argmax(dim=-1)  # [k + 1]
    k = drafts.numel()
    matches = (best[:k] == drafts).long()  # [k]
    n = int(matches.cumprod(0).sum()) if k else 0
    # p and q are one-hot, so sum_x min(p, q) is 1 on agreement and 0 otherwise
    verified = min(n + 1, k)
    return StepResult(n, int(best[n]), [1.0] * min(n, verified) + [0.0] * (verified - n))


def accept_sampled(
    target_logits: torch.Tensor,
    drafts: torch.Tensor,
    q: torch.Tensor | None,
    cfg: SamplingConfig,
    generator: torch.Generator | None,
) -> StepResult:
    """Speculative sampling's acceptance rule for one verify pass.

    target_logits [k + 1, V]; drafts [k]; q [k, V] the distributions the drafts were drawn from
    (None: one-hot drafts, as from prompt lookup)."""
    k = drafts.numel()
    p = probs_from_logits(target_logits, cfg)  # [k + 1, V]
    if q is None:
        q = torch.zeros_like(p[:k]).scatter_(-1, drafts.view(-1, 1), 1.0)  # [k, V]
    rows = torch.arange(k, device=p.device)
    p_d, q_d = p[rows, drafts], q[rows, drafts]  # [k]
    # accept d_i  iff  u_i < p_i(d_i) / q_i(d_i)   (u_i ~ U[0, 1); q_i(d_i) > 0 since d_i ~ q_i)
    u = torch.rand(k, device=p.device, generator=generator)
    accepted = (u * q_d < p_d).long()
    # residual_i = norm(max(0, p_i - q_i)); q_{k+1} = 0, so the last row is p_{k+1}, the bonus distribution
    q_ext = torch.cat([q, torch.zeros_like(p[:1])])  # [k + 1, V]
    residual = (p - q_ext).clamp_min_(0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p)  # p_i == q_i: never rejected anyway
    candidates = draw(residual, cfg, generator)  # [k + 1]: one candidate per place the step can end
    overlap = torch.minimum(p[:k], q).sum(dim=-1)  # [k]: sum_x min(p_i, q_i)
    # one host transfer per step
    host = torch.cat([accepted.double(), candidates.double(), overlap.double()]).tolist()
    n = 0
    while n < k and host[n] == 1.0:
        n += 1
    verified = min(n + 1, k)
    return StepResult(n, int(host[k + n]), host[2 * k + 1: 2 * k + 1 + verified])


# ----------------------------------------------------------------------------------------------------------------
# the loop
# ----------------------------------------------------------------------------------------------------------------
def prefill(target: CachedLM | StaticLM, drafter: Drafter, input_ids: torch.Tensor) -> torch.Tensor:
    """Cache every prompt token but the last in both models; the last one is `cur`, fed by the first step."""
    prefix, cur = input_ids[:, :-1], input_ids[:, -1:]
    if prefix.shape[1] > 0:
        target.forward(prefix, last_only=True)
    drafter.start(prefix, target.vocab_size)
    if drafter.aux_layers and prefix.shape[1] > 0:
        drafter.target_features(target.aux)  # the prefix's hidden states, from the same pass
    return cur


def verify(target: CachedLM | StaticLM, cur: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """One target pass over [cur, d_1..d_k]; logits [k + 1, V]."""
    return target.forward(torch.cat([cur, drafts.view(1, -1)], dim=1))


@torch.inference_mode()
def speculative_generate(
    target: torch.nn.Module,
    draft: torch.nn.Module | Drafter,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    gamma: int | str = 4,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    compile: bool = False,
    clock: StepClock | None = None,
    draft_past_end: bool = False,
) -> GenerateOutput:
    """Generate up to ``max_new_tokens`` tokens after ``input_ids`` [1, L] with ``draft`` proposing ``gamma`` tokens
    per target pass (``"auto"``: chosen at every step, decode.loop.auto_gamma). Greedy (temperature 0) output equals the
    target's own greedy decoding; sampled output is distributed exactly as the target's warped distribution.
    ``compile``: static KV caches and torch.compiled steps (decode.loop.static), else eager with dynamic caches.
    ``clock``: records each step's drafting and remaining time (the cost model's measurement, decode.measure.cost_model).
    ``draft_past_end``: draft ``gamma`` tokens at every step, as vLLM does, instead of at most what is left; tokens
    past ``max_new_tokens`` are then dropped but counted as accepted (vLLM's counting; same output).

    Raises ValueError for a batch > 1, an empty prompt, a gamma that is neither >= 1 nor "auto", or models on
    different devices."""
    gammas = check_gamma(gamma)
    check_inputs(input_ids, max_new_tokens)
    cfg = SamplingConfig(temperature, top_k, top_p)
    capacity = input_ids.shape[1] + max_new_tokens + max(gammas) + 1
    drafter = as_drafter(draft, target, compile, capacity, max(gammas))
    stop = eos_set(eos_token_id)
    stats = SpecStats(max(gammas))
    target_lm = cached_lm(target, compile, "target", capacity, tuple(g + 1 for g in gammas), drafter.aux_layers)
    chooser = GammaChooser(gammas, one_pass=getattr(drafter, "one_pass", False)) if is_auto(gamma) else None
    device = input_ids.device
    timed = chooser is not None or clock is not None

    history = input_ids[0].tolist()
    new: list[int] = []
    cur = prefill(target_lm, drafter, input_ids)
    while len(new) < max_new_tokens:
        step_gamma = chooser.choose() if chooser else gammas[0]
        left = max_new_tokens - len(new)
        k_max = step_gamma if draft_past_end else min(step_gamma, left - 1)  # else never produce more than asked
        started = timing.now() if timed else 0.0
        drafts, q = drafter.propose(history, cur, k_max, cfg, generator)
        if timed:
            synchronize(device)
            drafted_at = timing.now()
        logits = verify(target_lm, cur, drafts)
        if cfg.greedy:
            step = accept_greedy(logits, drafts)
        else:
            step = accept_sampled(logits, drafts, q, cfg, generator)
        k, n = drafts.numel(), step.num_accepted
        if chooser:
            chooser.observe(step_gamma, k, step.min_pq, drafted_at - started, timing.now() - drafted_at)
        # roll back: the target keeps cur, d_1..d_n; the drafter likewise
        target_lm.rollback(k - n)
        drafter.commit(n)
        if drafter.aux_layers:  # the verify pass's hidden states of cur, d_1..d_n
            drafter.target_features(target_lm.aux[: n + 1])
        produced = cut_at_eos(drafts[:n].tolist() + [step.next_token], stop)[:left]
        stats.record_step(k, n, step.min_pq, len(produced))  # tokens after an eos are never emitted: not counted
        new += produced
        history += produced
        cur = torch.tensor([[step.next_token]], dtype=torch.long, device=device)
        if clock is not None:
            clock.record(k_max, started, drafted_at)
        if produced[-1] in stop:
            break
    out = torch.cat([input_ids, torch.tensor([new], dtype=torch.long, device=device)], dim=1)
    return GenerateOutput(sequences=out, stats=stats, new_tokens=new, chosen_gammas=chooser.chosen if chooser else [])


@torch.inference_mode()
def autoregressive_generate(
    target: torch.nn.Module,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    compile: bool = False,
) -> GenerateOutput:
    """Plain decoding with the target alone and a KV cache: the baseline that speculative decoding must beat.
    ``compile``: the same static cache and compiled 1-token step as ``speculative_generate(compile=True)``."""
    check_inputs(input_ids, max_new_tokens)
    cfg = SamplingConfig(temperature, top_k, top_p)
    stop = eos_set(eos_token_id)
    new: list[int] = []
    if max_new_tokens == 0:
        return GenerateOutput(sequences=input_ids.clone(), new_tokens=new)
    lm = cached_lm(target, compile, "target", input_ids.shape[1] + max_new_tokens + 1, (1,))
    logits = lm.forward(input_ids, last_only=True)  # [1, V]
    tokens = []
    while True:
        token = next_token(logits, cfg, generator)  # [1], stays on the device
        tokens.append(token)
        if stop and int(token) in stop or len(tokens) == max_new_tokens:
            break
        logits = lm.forward(token.view(1, 1), last_only=True)
    new_ids = torch.cat(tokens).view(1, -1)
    return GenerateOutput(sequences=torch.cat([input_ids, new_ids], dim=1), new_tokens=new_ids[0].tolist())
