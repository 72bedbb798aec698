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
import torch.nn.functional as F

import decode.loop.timing as timing
from decode.loop.auto_gamma import AUTO_GAMMAS, GammaChooser, is_auto
from decode.loop.cache import CachedLM
from decode.loop.drafters import Drafter, DraftingKind, is_drafter
from decode.loop.sampling import SamplingConfig, draw, next_token, probs_from_logits
from decode.loop.static import StaticLM, cached_lm
from decode.loop.stats import SpecStats
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


def as_drafter(draft: object, target: torch.nn.Module, kind: DraftingKind | None = None, compile: bool = False,
               capacity: int = 0, max_gamma: int = 8) -> Drafter:
    """The drafter of ``draft``: a drafter as it is, else the one its ``kind`` builds (a causal LM's ModelDrafter, an
    EAGLE-3 head's HeadDrafter, ...). TypeError for a draft handed without its kind; ValueError when a draft model
    is on another device than the target."""
    if kind is None:
        if is_drafter(draft):
            return draft
        raise TypeError(f"a {type(draft).__name__} draft needs its kind (kind=...: kinds.kind_of(draft)), or pass a "
                        f"drafter; specdistill.speculative_generate finds the kind itself")
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
# the accept step: maths of one verify pass, on the device
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class Verdict:
    """One verify pass's outcome, still on the device (nothing read): the round's only host read is ``read_step``."""

    num_accepted: torch.Tensor    # [] long: n, the first n draft tokens are kept
    emitted: torch.Tensor         # [k + 1] long: emitted[:n] = d_1..d_n, emitted[n] = the resampled or bonus token
    overlap: torch.Tensor | None  # [k] sum_x min(p_i, q_i); None when greedy (one-hot: 1 while accepted, then 0)


@dataclass
class StepResult:
    """A Verdict read to the host: what the step commits, before the stop-token and length cut."""

    num_accepted: int   # n
    tokens: list[int]   # the n + 1 committed tokens: d_1..d_n, then the resampled or bonus token
    min_pq: list[float]  # sum_x min(p_i, q_i) for the verified positions i = 0..min(n, k - 1)

    @property
    def next_token(self) -> int:
        return self.tokens[-1]


def accept_greedy(target_logits: torch.Tensor, drafts: torch.Tensor) -> Verdict:
    """Greedy verification: keep drafts while they equal the target's argmax; then emit the target's argmax.

    target_logits [k + 1, V], drafts [k]. The kept drafts equal the argmax, so the committed tokens are best[:n + 1]."""
    best = target_logits.argmax(dim=-1)  # [k + 1]
    k = drafts.numel()
    n = (best[:k] == drafts).long().cumprod(0).sum()  # [] the length of the agreeing prefix
    return Verdict(n, best, None)


def accept_sampled(
    target_logits: torch.Tensor,
    drafts: torch.Tensor,
    q: torch.Tensor | None,
    cfg: SamplingConfig,
    generator: torch.Generator | None,
) -> Verdict:
    """Speculative sampling's acceptance rule for one verify pass, all on the device.

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
    n = (u * q_d < p_d).long().cumprod(0).sum()  # [] the first rejection's index, k if none
    # residual_i = norm(max(0, p_i - q_i)); q_{k+1} = 0, so the last row is p_{k+1}, the bonus distribution
    q_ext = torch.cat([q, torch.zeros_like(p[:1])])  # [k + 1, V]
    residual = (p - q_ext).clamp_min_(0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p)  # p_i == q_i: never rejected anyway
    candidates = draw(residual, cfg, generator)  # [k + 1]: one candidate per place the step can end
    # emitted[i] = d_{i+1} for i < n, the candidate at i = n (later slots are never read)
    emitted = torch.where(torch.arange(k + 1, device=p.device) < n, F.pad(drafts, (0, 1)), candidates)
    overlap = torch.minimum(p[:k], q).sum(dim=-1)  # [k]: sum_x min(p_i, q_i)
    return Verdict(n, emitted, overlap)


@dataclass
class HostReads:
    """Device-to-host reads the decoder made (``speculative_generate`` counts them into SpecStats.host_reads)."""

    count: int = 0

    def read(self, values: torch.Tensor) -> list:
        """``values`` as a Python list: one read (a synchronisation on a GPU, the one this counter allows: under
        ``torch.cuda.set_sync_debug_mode("error")`` any other synchronisation of the loop raises)."""
        self.count += 1
        if values.device.type != "cuda":
            return values.tolist()
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)
        try:
            return values.tolist()
        finally:
            torch.cuda.set_sync_debug_mode(mode)


def read_step(verdict: Verdict, reads: HostReads | None = None) -> StepResult:
    """The step's host side in ONE read: n, the emitted tokens and (sampled) the overlaps, read together."""
    k = verdict.emitted.numel() - 1
    parts = [verdict.num_accepted.view(1).double(), verdict.emitted.double()]  # ids < 2^53: exact in float64
    if verdict.overlap is not None:
        parts.append(verdict.overlap.double())
    packed = torch.cat(parts)
    host = (reads or HostReads()).read(packed)
    n = int(host[0])
    verified = min(n + 1, k)  # the accepted positions and the first rejected one, when there is one
    if verdict.overlap is None:  # one-hot p and q: sum_x min(p, q) is 1 on agreement and 0 otherwise
        min_pq = [1.0] * min(n, verified) + [0.0] * (verified - n)
    else:
        min_pq = host[k + 2: k + 2 + verified]
    return StepResult(n, [int(t) for t in host[1: n + 2]], min_pq)


# ----------------------------------------------------------------------------------------------------------------
# the loop
# ----------------------------------------------------------------------------------------------------------------
def prefill(target: CachedLM | StaticLM, drafter: Drafter, input_ids: torch.Tensor) -> torch.Tensor:
    """Cache every prompt token but the last in both models; the last one is `cur`, fed by the first step."""
    prefix, cur = input_ids[:, :-1], input_ids[:, -1:]
    if prefix.shape[1] > 0:
        target.forward(prefix, last_only=True)
    drafter.start(prefix, target.vocab_size)
    if drafter.aux_layers and prefix.shape[1] > 0:  # the prefix's hidden states, from the same pass, and the
        drafter.target_features(target.aux, input_ids[0, 1:])  # token that follows each of them
    return cur


def verify(target: CachedLM | StaticLM, cur: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """One target pass over [cur, d_1..d_k]; logits [k + 1, V]."""
    return target.forward(torch.cat([cur, drafts.view(1, -1)], dim=1))


@torch.inference_mode()
def speculative_generate(
    target: torch.nn.Module,
    draft: object,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    kind: DraftingKind | None = None,
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
    """Generate up to ``max_new_tokens`` tokens after ``input_ids`` [1, L] with ``draft`` (a drafter, or a draft in
    memory with its ``kind``, which builds the drafter) proposing ``gamma`` tokens per target pass (``"auto"``: chosen
    at every step, decode.loop.auto_gamma). Greedy (temperature 0) output equals the target's own greedy decoding;
    sampled output is distributed exactly as the target's warped distribution.
    ``compile``: static KV caches and torch.compiled steps (decode.loop.static), else eager with position-indexed
    caches (decode.loop.cache). ``clock``: records each step's drafting, verifying and remaining time (the cost
    model's measurement, decode.measure.cost_model). ``draft_past_end``: draft ``gamma`` tokens at every step, as vLLM
    does, instead of at most what is left; tokens past ``max_new_tokens`` are then dropped but counted as accepted
    (vLLM's counting; same output).

    A round keeps its state on the device: the drafts, the acceptance rule, the next round's input; caches roll
    back by moving a length; the host reads once per round (read_step: the accepted count and the tokens together),
    counted in ``stats.host_reads`` (with, for a drafter that searches the ids on the host, one read of the prompt).

    Raises ValueError for a batch > 1, an empty prompt, a gamma that is neither >= 1 nor "auto", or models on
    different devices."""
    gammas = check_gamma(gamma)
    check_inputs(input_ids, max_new_tokens)
    cfg = SamplingConfig(temperature, top_k, top_p)
    capacity = input_ids.shape[1] + max_new_tokens + max(gammas) + 1
    drafter = as_drafter(draft, target, kind, compile, capacity, max(gammas))
    stop = eos_set(eos_token_id)
    stats = SpecStats(max(gammas))
    target_lm = cached_lm(target, compile, "target", capacity, tuple(g + 1 for g in gammas), drafter.aux_layers)
    chooser = GammaChooser(gammas, one_pass=getattr(drafter, "one_pass", False)) if is_auto(gamma) else None
    device = input_ids.device
    timed = chooser is not None or clock is not None
    reads = HostReads()

    host_history = getattr(drafter, "host_history", False)  # only a drafter that searches the ids on the host
    history = reads.read(input_ids[0]) if host_history else []  # (prompt lookup) reads the prompt, once
    new: list[int] = []
    committed = [input_ids[0]]  # the sequence, as device tensors (the output is assembled on the device)
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
        if clock is not None:
            synchronize(device)
            verified_at = timing.now()
        verdict = accept_greedy(logits, drafts) if cfg.greedy else accept_sampled(logits, drafts, q, cfg, generator)
        step = read_step(verdict, reads)
        k, n = drafts.numel(), step.num_accepted
        if chooser:
            chooser.observe(step_gamma, k, step.min_pq, drafted_at - started, timing.now() - drafted_at)
        # roll back: the target keeps cur, d_1..d_n; the drafter likewise
        target_lm.rollback(k - n)
        drafter.commit(n)
        if drafter.aux_layers:  # the verify pass's hidden states of cur, d_1..d_n, and the tokens after each
            drafter.target_features(target_lm.aux[: n + 1], verdict.emitted[: n + 1])
        produced = cut_at_eos(step.tokens, stop)[:left]
        stats.record_step(k, n, step.min_pq, len(produced))  # tokens after an eos are never emitted: not counted
        new += produced
        committed.append(verdict.emitted[: len(produced)])
        if host_history:
            history += produced
        cur = verdict.emitted[n: n + 1].view(1, 1)  # stays on the device
        if clock is not None:
            clock.record(k_max, started, drafted_at, verified_at)
        if produced[-1] in stop:
            break
    stats.host_reads += reads.count
    return GenerateOutput(sequences=torch.cat(committed).view(1, -1), stats=stats, new_tokens=new,
                          chosen_gammas=chooser.chosen if chooser else [])


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
