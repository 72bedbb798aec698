"""Distillation losses: per-token divergences between the draft (student) and the target (teacher).

Pure functions over tensors. N = tokens, V = vocabulary, k = width of a cached top-k teacher, H = hidden size.
p is the teacher distribution, q the student's; both arrive as log-probabilities over the same support.

Reductions return SUMS over tokens (`LossSums`), never means: the caller divides by the global token count,
so gradient accumulation and several processes give the same update as one large batch.

Temperature T softens both models: log_softmax(logits / T). No T**2 factor is applied (Hinton et al. scale the
soft loss by T**2 to keep its gradient size comparable across T); fold such a factor into the learning rate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

LOSSES = ("forward_kl", "reverse_kl", "jsd", "tv", "ce")

IGNORE_INDEX = -100

# A cached teacher's tail mass 1 - sum_topk p is only known to float32 resolution. Where the student has a tail,
# the teacher's tail is floored here so that rounding cannot make reverse KL infinite.
_TAIL_FLOOR = torch.finfo(torch.float32).eps


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
    _check_beta(beta)
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
        logprobs = F.log_softmax(_upcast(logits.detach()), dim=-1)  # [N, V]
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
    tail_mass = torch.where(student_has_tail, tail_mass.clamp_min(_TAIL_FLOOR), 0.0)
    # renormalise over the k + 1 buckets so that rounding in the cache cannot leave a mass above 1
    teacher_logp = F.log_softmax(torch.cat([teacher_topk, tail_mass.log()[:, None]], dim=-1), dim=-1)
    return student_logp, teacher_logp


# ----------------------------------------------------------------------------------------------------------------
# Distillation loss: options, per-batch sums, chunked over the vocabulary projection
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class LossSums:
    """Sums over the kept tokens of one batch; divide by the global `num_tokens` to get means.

    loss: scalar with grad, (1 - ce_weight) * kd + ce_weight * ce. kd, ce, tv: detached sums for logging;
    tv is measured at temperature 1 (0 without a teacher).
    """

    loss: torch.Tensor
    kd: torch.Tensor
    ce: torch.Tensor
    tv: torch.Tensor
    num_tokens: int

    def __add__(self, other: LossSums) -> LossSums:
        return LossSums(
            loss=self.loss + other.loss,
            kd=self.kd + other.kd,
            ce=self.ce + other.ce,
            tv=self.tv + other.tv,
            num_tokens=self.num_tokens + other.num_tokens,
        )


def _check_beta(beta: float) -> None:
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta!r}")


@dataclass(frozen=True)
class _LossOptions:
    loss: str
    beta: float
    temperature: float
    ce_weight: float

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; allowed values: {', '.join(LOSSES)}")
        _check_beta(self.beta)
        if not self.temperature > 0.0:
            raise ValueError(f"temperature must be > 0, got {self.temperature!r}")
        if not 0.0 <= self.ce_weight <= 1.0:
            raise ValueError(f"ce_weight must be in [0, 1], got {self.ce_weight!r}")

    def check_teacher(self, teacher: torch.Tensor | SparseTeacher | None) -> None:
        if teacher is None and self.loss != "ce":
            raise ValueError(f"loss={self.loss!r} needs a teacher (logits or a SparseTeacher), got None")
        if isinstance(teacher, SparseTeacher) and self.temperature != 1.0:
            raise ValueError(
                f"temperature={self.temperature!r} cannot be used with a SparseTeacher: cached top-k "
                "log-probabilities are at temperature 1 and cannot be re-softened; use temperature=1.0 "
                "or dense teacher logits"
            )


def _upcast(logits: torch.Tensor) -> torch.Tensor:
    """Half-precision logits to float32 (float64 stays float64)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def _paired_logprobs(
    student_logits: torch.Tensor, teacher: torch.Tensor | SparseTeacher, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Student and teacher log-probs over a shared support: [n, W] x [n, W]."""
    if isinstance(teacher, SparseTeacher):
        return bucketize(student_logits, teacher)  # W = k + 1
    # padded lm_head rows: compare on the shared first min(Vs, Vt) columns, each renormalised there
    shared = min(student_logits.shape[-1], teacher.shape[-1])
    student_logp = F.log_softmax(student_logits[:, :shared] / temperature, dim=-1)  # [n, W]
    teacher_logp = F.log_softmax(_upcast(teacher.detach()[:, :shared]) / temperature, dim=-1)  # [n, W]
    return student_logp, teacher_logp.to(student_logp.dtype)


def _divergence(options: _LossOptions, student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    if options.loss == "forward_kl":
        return forward_kl(student_logp, teacher_logp)
    if options.loss == "reverse_kl":
        return reverse_kl(student_logp, teacher_logp)
    if options.loss == "jsd":
        return jsd(student_logp, teacher_logp, options.beta)
    return total_variation(student_logp, teacher_logp)


def _token_sums(
    options: _LossOptions,
    student_logits: torch.Tensor,
    teacher: torch.Tensor | SparseTeacher | None,
    labels: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, kd, ce, tv) summed over rows that are all kept. student_logits [n, Vs], labels [n]."""
    student_logits = _upcast(student_logits)  # [n, Vs]
    zero = student_logits.new_zeros(())
    ce_in_loss = options.loss == "ce" or options.ce_weight > 0.0
    with torch.set_grad_enabled(torch.is_grad_enabled() and ce_in_loss):
        # ce = -sum_i log q(y_i)   (hard labels, temperature 1, full student vocabulary)
        ce = F.cross_entropy(student_logits, labels, reduction="sum")
    if teacher is None:
        return ce, zero, ce.detach(), zero

    kd = zero
    if options.loss != "ce":
        student_logp, teacher_logp = _paired_logprobs(student_logits, teacher, options.temperature)  # [n, W]
        kd = _divergence(options, student_logp, teacher_logp).sum()
    with torch.no_grad():
        if options.loss == "ce" or options.temperature != 1.0:
            student_logp, teacher_logp = _paired_logprobs(student_logits, teacher, 1.0)  # [n, W]
        tv = total_variation(student_logp, teacher_logp).sum()

    if options.loss == "ce":
        loss = ce
    elif options.ce_weight == 0.0:
        loss = kd
    else:
        # total = (1 - w) kd + w ce
        loss = (1.0 - options.ce_weight) * kd + options.ce_weight * ce
    return loss, kd.detach(), ce.detach(), tv


def _take_rows(
    teacher: torch.Tensor | SparseTeacher | None, rows: torch.Tensor | slice
) -> torch.Tensor | SparseTeacher | None:
    if teacher is None:
        return None
    return teacher.take(rows) if isinstance(teacher, SparseTeacher) else teacher[rows]


def _kept_positions(labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Indices [n] of the positions with mask True and a label other than -100."""
    if labels.shape != mask.shape:
        raise ValueError(f"labels and mask must have one shape, got {tuple(labels.shape)} and {tuple(mask.shape)}")
    keep = mask.bool() & (labels != IGNORE_INDEX)
    return keep.nonzero(as_tuple=True)[0]


def distill_loss(
    student_logits: torch.Tensor,
    teacher: torch.Tensor | SparseTeacher | None,
    labels: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss: str,
    beta: float = 0.5,
    temperature: float = 1.0,
    ce_weight: float = 0.0,
) -> LossSums:
    """Distillation loss summed over the kept tokens.

    student_logits [N, Vs]; teacher: logits [N, Vt] (compared on the shared first min(Vs, Vt) columns),
    a SparseTeacher with N rows (temperature 1 only), or None for loss="ce"; labels [N] long (-100 = ignore);
    mask [N] bool. loss: one of LOSSES; beta: JSD mixing weight; temperature softens both models (no T**2);
    ce_weight mixes in hard-label cross-entropy: loss = (1 - ce_weight) kd + ce_weight ce; loss="ce" is ce alone.
    Positions with mask False or label -100 contribute nothing (not even NaNs).
    Raises ValueError on a bad option or inconsistent shapes.
    """
    options = _LossOptions(loss, beta, temperature, ce_weight)
    options.check_teacher(teacher)
    if student_logits.dim() != 2 or labels.shape != student_logits.shape[:1]:
        raise ValueError(
            f"student_logits must be [N, V] and labels [N], got {tuple(student_logits.shape)} "
            f"and {tuple(labels.shape)}"
        )
    if isinstance(teacher, torch.Tensor) and teacher.shape[0] != student_logits.shape[0]:
        raise ValueError(f"teacher logits have {teacher.shape[0]} rows, student logits {student_logits.shape[0]}")
    if isinstance(teacher, SparseTeacher) and len(teacher) != student_logits.shape[0]:
        raise ValueError(f"SparseTeacher has {len(teacher)} rows, student logits {student_logits.shape[0]}")

    keep = _kept_positions(labels, mask)  # [n]
    total, kd, ce, tv = _token_sums(options, student_logits[keep], _take_rows(teacher, keep), labels[keep])
    return LossSums(loss=total, kd=kd, ce=ce, tv=tv, num_tokens=int(keep.numel()))


def _head_chunk_sums(
    options: _LossOptions,
    student_head: nn.Module,
    teacher_head: nn.Module | None,
    student_hidden: torch.Tensor,
    teacher_chunk: torch.Tensor | SparseTeacher | None,
    labels: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """_token_sums of one chunk, projecting hidden states [c, H] to logits [c, V] inside."""
    if teacher_head is not None and teacher_chunk is not None:
        with torch.no_grad():
            teacher_chunk = teacher_head(teacher_chunk)  # [c, Vt]
    student_logits = student_head(student_hidden)  # [c, Vs]
    return _token_sums(options, student_logits, teacher_chunk, labels)


def _kept_teacher_rows(
    teacher: torch.Tensor | SparseTeacher | None,
    teacher_head: nn.Module | None,
    batch_shape: torch.Size,
    keep: torch.Tensor,
) -> torch.Tensor | SparseTeacher | None:
    """The teacher's rows at the kept flattened positions: hidden states [n, H'] or a SparseTeacher with n rows."""
    positions = math.prod(batch_shape)
    if teacher is None:
        return None
    if isinstance(teacher, SparseTeacher):
        if len(teacher) != positions:
            raise ValueError(f"SparseTeacher has {len(teacher)} rows, expected B*T = {positions}")
        return teacher.take(keep)
    if teacher_head is None:
        raise ValueError("teacher hidden states need a teacher_head to project them to logits")
    if teacher.shape[:2] != batch_shape:
        raise ValueError(f"teacher hidden states {tuple(teacher.shape)} do not match [B, T] = {tuple(batch_shape)}")
    return teacher.detach().reshape(positions, -1)[keep]  # [n, H']


def chunked_distill_loss(
    student_hidden: torch.Tensor,
    student_head: nn.Module,
    teacher: torch.Tensor | SparseTeacher | None,
    labels: torch.Tensor,
    mask: torch.Tensor,
    *,
    teacher_head: nn.Module | None = None,
    chunk_size: int = 1024,
    loss: str,
    beta: float = 0.5,
    temperature: float = 1.0,
    ce_weight: float = 0.0,
) -> LossSums:
    """distill_loss from final hidden states, chunk_size kept tokens at a time; same value and gradients.

    student_hidden [B, T, H]; student_head maps [c, H] -> [c, Vs]. teacher: hidden states [B, T, H'] together
    with teacher_head ([c, H'] -> [c, Vt]), a SparseTeacher with B*T rows (flattened positions), or None for
    loss="ce". labels, mask [B, T]. At most one chunk's [c, V] logits exist at a time:
    - a plain nn.Linear student head (the usual lm_head) takes the fused path (distill/fused.py): each chunk's
      gradient with respect to its logits is written in closed form and turned into the hidden states' and the
      head's gradients at once, so each head runs once per chunk and autograd keeps no logits;
    - any other head (a peft wrapper, a ZeRO-3-partitioned weight) runs inside a non-reentrant checkpoint per
      chunk: the teacher's logits under no_grad, the student's recomputed in backward (both heads run twice).
    Raises ValueError like distill_loss, and for chunk_size < 1 or a missing teacher_head.
    """
    options = _LossOptions(loss, beta, temperature, ce_weight)
    options.check_teacher(teacher)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size!r}")
    if student_hidden.dim() != 3 or labels.shape != student_hidden.shape[:2]:
        raise ValueError(
            f"student_hidden must be [B, T, H] and labels [B, T], got {tuple(student_hidden.shape)} "
            f"and {tuple(labels.shape)}"
        )
    positions = labels.numel()
    keep = _kept_positions(labels.reshape(-1), mask.reshape(-1))  # [n]
    hidden = student_hidden.reshape(positions, -1)[keep]  # [n, H]
    targets = labels.reshape(-1)[keep]  # [n]
    teacher_rows = _kept_teacher_rows(teacher, teacher_head, student_hidden.shape[:2], keep)
    if isinstance(teacher, SparseTeacher):
        teacher_head = None  # cached teacher: no head to run

    from distill.fused import fusable_head, fused_head_loss

    if fusable_head(student_head):  # closed-form gradients, each head runs once per chunk (distill/fused.py)
        total, kd, ce, tv = fused_head_loss(options, hidden, student_head, teacher_rows, teacher_head, targets,
                                            chunk_size)
        return LossSums(loss=total, kd=kd, ce=ce, tv=tv, num_tokens=int(keep.numel()))

    chunk_sums = partial(_head_chunk_sums, options, student_head, teacher_head)
    totals = []
    # at least one (possibly empty) chunk, so the loss stays connected to the student head's parameters
    for start in range(0, max(keep.numel(), 1), chunk_size):
        rows = slice(start, start + chunk_size)
        teacher_chunk = _take_rows(teacher_rows, rows)
        args = (hidden[rows], teacher_chunk, targets[rows])
        if torch.is_grad_enabled():
            totals.append(checkpoint(chunk_sums, *args, use_reentrant=False))
        else:
            totals.append(chunk_sums(*args))
    total, kd, ce, tv = (torch.stack(values).sum() for values in zip(*totals))
    return LossSums(loss=total, kd=kd, ce=ce, tv=tv, num_tokens=int(keep.numel()))
