"""Distillation losses: per-token divergences between the draft (student) and the target (teacher).

Pure functions over tensors, and the one table `DIVERGENCES` that the loss names of a recipe (`distill.loss`)
resolve through. N = tokens, V = vocabulary, k = width of a cached top-k teacher, W = width of a shared support.
p is the teacher distribution, q the student's; both arrive as log-probabilities over the same support.

Each entry of DIVERGENCES holds the divergence's value per token and, for the fused chunked path
(distill/losses/fused.py), the same value with its gradient with respect to the student's logits in closed form.
The batch-level sums (masking, temperature, the ce mix, chunking) are in distill/losses/distill_loss.py; weighted
combinations of losses with schedules (`distill.loss: {ce: 0.5, tv: ...}`) in distill/losses/loss_mix.py.

Stable entry point for other trainers (e.g. hidden-state draft heads): `per_token_divergence(name, student_logp,
teacher_logp, beta=0.5) -> [N]`, the value of DIVERGENCES[name] per token, differentiable through student_logp.
Its signature and the names in DIVERGENCES only grow; a new divergence is one function pair plus one table line.

Acceptance: alpha = sum_x min(p, q) is the probability that speculative sampling accepts a draft token drawn
from q when the target is p (Leviathan et al. 2023), and TV = 1 - alpha. `nla` and `lk_hybrid` are the LK losses
(arXiv 2602.23881), as shipped by vLLM's speculators (`--loss-fn nla | lk_hybrid`).

Temperature T softens both models: log_softmax(logits / T). No T**2 factor is applied (Hinton et al. scale the
soft loss by T**2 to keep its gradient size comparable across T); fold such a factor into the learning rate.
"""
from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# A cached teacher's tail mass 1 - sum_topk p is only known to float32 resolution. Where the student has a tail,
# the teacher's tail is floored here so that rounding cannot make reverse KL infinite.
TAIL_FLOOR = torch.finfo(torch.float32).eps
# nla = -log alpha: alpha is floored here (-log 1e-6 = 13.8), so disjoint supports give a finite value and no gradient.
ALPHA_FLOOR = 1e-6
# lk_hybrid: lambda = exp(-LK_SHARPNESS * alpha), the LK-losses paper's and vLLM speculators' 3.
LK_SHARPNESS = 3.0


# ----------------------------------------------------------------------------------------------------------------
# Divergences on log-probabilities, per token: [N, V] x [N, V] -> [N]
# ----------------------------------------------------------------------------------------------------------------

def _safe_logsumexp(x: torch.Tensor, dim: int) -> torch.Tensor:
    """logsumexp that returns -inf for an all -inf slice with a zero (not NaN) gradient."""
    empty = (x == -math.inf).all(dim=dim, keepdim=True)
    out = torch.logsumexp(x.masked_fill(empty, 0.0), dim=dim)
    return out.masked_fill(empty.squeeze(dim), -math.inf)


def _kl(logp_a: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    """KL(a || b) per row, with 0 * log 0 = 0 and finite gradients where a = 0."""
    a = logp_a.exp()  # [N, V]
    # KL(a || b) = sum_x a(x) (log a(x) - log b(x)); terms with a(x) = 0 are 0 (masked before the product)
    log_ratio = torch.where(a > 0, logp_a - logp_b, 0.0)  # [N, V]
    return (a * log_ratio).sum(dim=-1)  # [N]


def forward_kl(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """KL(p_teacher || q_student) per token (mode-covering). [N, V] x [N, V] -> [N]."""
    # KL(p || q) = sum_x p (log p - log q)
    return _kl(teacher_logp, student_logp)


def reverse_kl(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """KL(q_student || p_teacher) per token (mode-seeking). [N, V] x [N, V] -> [N]."""
    # KL(q || p) = sum_x q (log q - log p)
    return _kl(student_logp, teacher_logp)


def jsd(student_logp: torch.Tensor, teacher_logp: torch.Tensor, beta: float) -> torch.Tensor:
    """Generalized Jensen-Shannon divergence of TRL's GKD per token. [N, V] x [N, V] -> [N].

    beta == 0 returns forward_kl and beta == 1 reverse_kl exactly (TRL's convention; the formula itself tends to
    0 at both ends, so the endpoints are a switch of loss, not a limit). Raises ValueError for beta outside [0, 1].
    """
    check_beta(beta)
    if beta == 0.0:
        return forward_kl(student_logp, teacher_logp)
    if beta == 1.0:
        return reverse_kl(student_logp, teacher_logp)
    # log m = log(beta p + (1 - beta) q), in log space
    stacked = torch.stack([teacher_logp + math.log(beta), student_logp + math.log1p(-beta)])  # [2, N, V]
    mixture_logp = _safe_logsumexp(stacked, dim=0)  # [N, V]
    # JSD_beta = beta KL(p || m) + (1 - beta) KL(q || m)
    return beta * _kl(teacher_logp, mixture_logp) + (1.0 - beta) * _kl(student_logp, mixture_logp)


def total_variation(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """Total variation distance per token, in [0, 1]. [N, V] x [N, V] -> [N].

    1 - TV(p, q) = sum_x min(p, q) is the probability that speculative sampling accepts a draft token drawn from
    q when the target is p, so minimising TV targets the acceptance rate directly.
    """
    # TV(p, q) = 0.5 sum_x |p - q|
    return 0.5 * (teacher_logp.exp() - student_logp.exp()).abs().sum(dim=-1)


def acceptance_probability(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """alpha = sum_x min(p, q) per token, in [0, 1]: the chance a draft token from q is accepted. [N, V] -> [N]."""
    # alpha = sum_x min(p(x), q(x)) = 1 - TV(p, q)
    return torch.minimum(teacher_logp.exp(), student_logp.exp()).sum(dim=-1)


def negative_log_acceptance(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """nla = -log alpha per token (alpha floored at ALPHA_FLOOR). [N, V] x [N, V] -> [N].

    Same minimiser as TV, with the gradient scaled by 1 / alpha: it keeps training where the overlap is small.
    """
    # nla = -log max(alpha, floor)
    return -acceptance_probability(student_logp, teacher_logp).clamp_min(ALPHA_FLOOR).log()


def lk_hybrid(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """lambda KL(p || q) + (1 - lambda) TV(p, q) per token, lambda = exp(-3 alpha) detached. [N, V] -> [N].

    Forward KL while the overlap is small (lambda near 1), moving toward TV (the acceptance itself) as it grows.
    lambda is a constant of the gradient: d/ds = lambda dKL/ds + (1 - lambda) dTV/ds.
    """
    alpha = acceptance_probability(student_logp, teacher_logp)
    lam = torch.exp(-LK_SHARPNESS * alpha).detach()  # [N]
    # L = lambda KL(p || q) + (1 - lambda) TV(p, q)
    return lam * forward_kl(student_logp, teacher_logp) + (1.0 - lam) * total_variation(student_logp, teacher_logp)



# ----------------------------------------------------------------------------------------------------------------
# The same divergences with their gradients with respect to the student's logits s (q = softmax(s)), per token:
# (value [N], dL/ds [N, W], total variation 0.5 sum |q - p| [N] for logging, reusing q and p)
# ----------------------------------------------------------------------------------------------------------------

def _forward_kl_and_grad(logq: torch.Tensor, logp: torch.Tensor, beta: float):
    q, p = logq.exp(), logp.exp()  # [N, W]
    # KL(p || q) = sum p (log p - log q);  d/ds = q - p
    value = (p * (logp - logq)).sum(-1)
    grad = q.sub_(p)  # q is ours: no second [N, W] buffer
    return value, grad, 0.5 * grad.abs().sum(-1)


def _reverse_kl_and_grad(logq: torch.Tensor, logp: torch.Tensor, beta: float):
    q, p = logq.exp(), logp.exp()  # [N, W]
    tv = 0.5 * (q - p).abs_().sum(-1)
    # KL(q || p) = sum q (log q - log p);  d/ds = q (log q - log p - KL)
    log_ratio = logq - logp
    value = (q * log_ratio).sum(-1)
    return value, q * (log_ratio - value[:, None]), tv


def _jsd_and_grad(logq: torch.Tensor, logp: torch.Tensor, beta: float):
    check_beta(beta)
    if beta == 0.0:  # the endpoints are the KLs exactly, as in jsd()
        return _forward_kl_and_grad(logq, logp, beta)
    if beta == 1.0:
        return _reverse_kl_and_grad(logq, logp, beta)
    q, p = logq.exp(), logp.exp()  # [N, W]
    tv = 0.5 * (q - p).abs_().sum(-1)
    # log m = log(beta p + (1 - beta) q)
    logm = torch.logaddexp(logp + math.log(beta), logq + math.log1p(-beta))
    kl_pm = (p * (logp - logm)).sum(-1)
    log_ratio = logq - logm
    kl_qm = (q * log_ratio).sum(-1)
    # d/ds = (1 - beta) q (log q - log m - KL(q || m))
    return beta * kl_pm + (1.0 - beta) * kl_qm, (1.0 - beta) * q * (log_ratio - kl_qm[:, None]), tv


def _total_variation_and_grad(logq: torch.Tensor, logp: torch.Tensor, beta: float):
    q, p = logq.exp(), logp.exp()  # [N, W]
    diff = q - p
    g = 0.5 * diff.sign()  # d TV / dq
    value = 0.5 * diff.abs_().sum(-1)
    # d/ds_j = q_j (g_j - sum_i q_i g_i)
    return value, q * (g - (q * g).sum(-1, keepdim=True)), value


def _nla_and_grad(logq: torch.Tensor, logp: torch.Tensor, beta: float):
    q, p = logq.exp(), logp.exp()  # [N, W]
    alpha = torch.minimum(q, p).sum(-1)  # [N]
    tv, tv_grad, _ = _total_variation_and_grad(logq, logp, beta)
    floored = alpha.clamp_min(ALPHA_FLOOR)
    # -log alpha = -log(1 - TV);  d/ds = dTV/ds / alpha  (0 below the floor, where the value is constant)
    scale = torch.where(alpha >= ALPHA_FLOOR, 1.0 / floored, 0.0)
    return -floored.log(), tv_grad.mul_(scale[:, None]), tv


def _lk_hybrid_and_grad(logq: torch.Tensor, logp: torch.Tensor, beta: float):
    q, p = logq.exp(), logp.exp()  # [N, W]
    lam = torch.exp(-LK_SHARPNESS * torch.minimum(q, p).sum(-1))  # [N], a constant of the gradient
    kl, kl_grad, _ = _forward_kl_and_grad(logq, logp, beta)
    tv, tv_grad, _ = _total_variation_and_grad(logq, logp, beta)
    # L = lambda KL + (1 - lambda) TV;  d/ds = lambda (q - p) + (1 - lambda) dTV/ds
    value = lam * kl + (1.0 - lam) * tv
    grad = kl_grad.mul_(lam[:, None]).add_(tv_grad.mul_((1.0 - lam)[:, None]))
    return value, grad, tv


# ----------------------------------------------------------------------------------------------------------------
# The table: loss name -> divergence
# ----------------------------------------------------------------------------------------------------------------

PerToken = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
PerTokenWithGrad = Callable[[torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Divergence:
    """One divergence D(p, q) of the student q from the teacher p, both given as log-probabilities [N, W].

    value(student_logp, teacher_logp, beta) -> [N]; value_and_grad(student_logp, teacher_logp, beta) ->
    (value [N], dD/ds [N, W] with s the student's logits, total variation [N]). beta is used by jsd only.
    """

    value: PerToken
    value_and_grad: PerTokenWithGrad


DIVERGENCES: dict[str, Divergence] = {
    "forward_kl": Divergence(lambda s, t, beta: forward_kl(s, t), _forward_kl_and_grad),  # KL(p || q)
    "reverse_kl": Divergence(lambda s, t, beta: reverse_kl(s, t), _reverse_kl_and_grad),  # KL(q || p)
    "jsd": Divergence(jsd, _jsd_and_grad),  # beta KL(p || m) + (1 - beta) KL(q || m), m = beta p + (1 - beta) q
    "tv": Divergence(lambda s, t, beta: total_variation(s, t), _total_variation_and_grad),  # 0.5 sum |p - q|
    "nla": Divergence(lambda s, t, beta: negative_log_acceptance(s, t), _nla_and_grad),  # -log sum min(p, q)
    # exp(-3 alpha) KL(p || q) + (1 - exp(-3 alpha)) TV, the weight detached
    "lk_hybrid": Divergence(lambda s, t, beta: lk_hybrid(s, t), _lk_hybrid_and_grad),
}

# Recipe values of distill.loss: a divergence, or "ce" (hard-label cross-entropy alone, no teacher term).
LOSSES = (*DIVERGENCES, "ce")


def unknown_loss_message(name: object, allowed: tuple[str, ...] = LOSSES) -> str:
    """"unknown loss 'tvd' (did you mean 'tv'?); allowed values: ...": one line for a name not in `allowed`."""
    close = difflib.get_close_matches(str(name), allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown loss {name!r}{hint}; allowed values: {', '.join(allowed)}"


def per_token_divergence(name: str, student_logp: torch.Tensor, teacher_logp: torch.Tensor,
                         beta: float = 0.5) -> torch.Tensor:
    """DIVERGENCES[name] per token: student_logp, teacher_logp [N, W] log-probabilities on one support -> [N].

    The stable entry point for trainers outside distill_loss (hidden-state draft heads); differentiable through
    student_logp. beta is used by jsd only. Raises ValueError for a name that is not a divergence ("ce" included).
    """
    if name not in DIVERGENCES:
        raise ValueError(unknown_loss_message(name, tuple(DIVERGENCES)))
    return DIVERGENCES[name].value(student_logp, teacher_logp, beta)


# ----------------------------------------------------------------------------------------------------------------
# Sparse (cached top-k) teacher
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class SparseTeacher:
    """Cached top-k teacher log-probabilities (temperature 1, normalised over the full teacher vocabulary).

    Row i belongs to token position i. The ids of one row must be distinct.
    """

    topk_ids: torch.Tensor  # [N, k] long
    topk_logprobs: torch.Tensor  # [N, k] float

    def __post_init__(self) -> None:
        if self.topk_ids.dim() != 2 or self.topk_ids.shape != self.topk_logprobs.shape:
            raise ValueError(
                f"SparseTeacher needs topk_ids and topk_logprobs of the same shape [N, k], got "
                f"{tuple(self.topk_ids.shape)} and {tuple(self.topk_logprobs.shape)}"
            )

    @classmethod
    def from_logits(cls, logits: torch.Tensor, k: int) -> SparseTeacher:
        """Keep the k most likely tokens of teacher logits [N, V] (temperature 1; at least float32)."""
        logprobs = F.log_softmax(upcast(logits.detach()), dim=-1)  # [N, V]
        top = logprobs.topk(k, dim=-1)
        return cls(topk_ids=top.indices, topk_logprobs=top.values)

    def take(self, rows: torch.Tensor | slice) -> SparseTeacher:
        """The rows at `rows` (a slice, [n] long indices or an [N] bool mask)."""
        return SparseTeacher(topk_ids=self.topk_ids[rows], topk_logprobs=self.topk_logprobs[rows])

    def __len__(self) -> int:
        return self.topk_ids.shape[0]


def bucketize(student_logits: torch.Tensor, teacher: SparseTeacher) -> tuple[torch.Tensor, torch.Tensor]:
    """Student and teacher log-probs over k + 1 buckets: the teacher's top-k tokens, then one tail bucket.

    student_logits [N, V] (temperature 1) -> (student_logp [N, k+1], teacher_logp [N, k+1]).
    With k = V the tail is empty on both sides and any divergence equals the dense one.
    Raises ValueError when a top-k id is outside [0, V) or the row counts differ.
    """
    ids = teacher.topk_ids.long()  # [N, k]
    num_tokens, vocab = student_logits.shape
    if len(teacher) != num_tokens:
        raise ValueError(f"SparseTeacher has {len(teacher)} rows but the student has {num_tokens} tokens")
    if ids.numel() > 0 and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(
            f"SparseTeacher topk_ids must lie in [0, {vocab}) (the student vocabulary), "
            f"got ids in [{int(ids.min())}, {int(ids.max())}]"
        )
    # log q(bucket) for the top-k tokens: logit - logsumexp(all logits)
    student_lse = torch.logsumexp(student_logits, dim=-1, keepdim=True)  # [N, 1]
    student_topk = student_logits.gather(-1, ids) - student_lse  # [N, k]
    # log q(tail) = logsumexp(logits outside top-k) - logsumexp(all logits); -inf when top-k covers the vocab
    in_topk = torch.zeros_like(student_logits, dtype=torch.bool).scatter_(-1, ids, True)  # [N, V]
    student_tail = _safe_logsumexp(student_logits.masked_fill(in_topk, -math.inf), dim=-1) - student_lse[:, 0]
    student_logp = torch.cat([student_topk, student_tail[:, None]], dim=-1)  # [N, k+1]

    teacher_topk = teacher.topk_logprobs.detach().to(student_logp.dtype)  # [N, k]
    # p(tail) = 1 - sum_topk p = -expm1(logsumexp(log p_topk)), clamped at 0 against rounding
    tail_mass = (-torch.expm1(torch.logsumexp(teacher_topk, dim=-1))).clamp_min(0.0)  # [N]
    student_has_tail = student_tail > -math.inf
    tail_mass = torch.where(student_has_tail, tail_mass.clamp_min(TAIL_FLOOR), 0.0)
    # renormalise over the k + 1 buckets so that rounding in the cache cannot leave a mass above 1
    teacher_logp = F.log_softmax(torch.cat([teacher_topk, tail_mass.log()[:, None]], dim=-1), dim=-1)
    return student_logp, teacher_logp


def check_beta(beta: float) -> None:
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta!r}")


def upcast(logits: torch.Tensor) -> torch.Tensor:
    """Half-precision logits to float32 (float64 stays float64)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))
