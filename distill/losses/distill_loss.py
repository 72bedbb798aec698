"""The distillation loss of a batch: sums over its kept tokens, from logits or chunk by chunk from hidden states.

`distill_loss` takes the student's logits; `chunked_distill_loss` takes final hidden states and the lm_head, so
at most one chunk's [c, V] logits exist at a time (the fused path, distill/losses/fused.py, for a plain nn.Linear
head; a checkpointed path for any other head). Both resolve the loss names through
distill.losses.divergences.DIVERGENCES; a loss is one name or a weighted combination of names
(distill.losses.options.LossOptions).

Reductions return SUMS over tokens (`LossSums`), never means: the caller divides by the global token count,
so gradient accumulation and several processes give the same update as one large batch.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from distill.losses.divergences import DIVERGENCES, SparseTeacher, bucketize, total_variation, upcast
from distill.losses.fused import fusable_head, fused_head_loss
from distill.losses.options import LossOptions, take_rows
from distill.utils import IGNORE_INDEX


@dataclass
class LossSums:
    """Sums over the kept tokens of one batch; divide by the global `num_tokens` to get means.

    loss: scalar with grad, sum_i weight_i * term_i ((1 - ce_weight) * kd + ce_weight * ce for one named loss).
    kd, ce, tv: detached sums for logging; tv is measured at temperature 1 (0 without a teacher); kd is the
    divergence, or the weighted mean of the divergences of a combination. terms: each term's own detached sum
    (unweighted), by loss name.
    """

    loss: torch.Tensor
    kd: torch.Tensor
    ce: torch.Tensor
    tv: torch.Tensor
    num_tokens: int
    terms: dict[str, torch.Tensor] = field(default_factory=dict)

    def __add__(self, other: LossSums) -> LossSums:
        return LossSums(
            loss=self.loss + other.loss,
            kd=self.kd + other.kd,
            ce=self.ce + other.ce,
            tv=self.tv + other.tv,
            num_tokens=self.num_tokens + other.num_tokens,
            terms={name: self.terms[name] + other.terms[name] for name in self.terms},
        )


def _paired_logprobs(
    student_logits: torch.Tensor, teacher: torch.Tensor | SparseTeacher, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Student and teacher log-probs over a shared support: [n, W] x [n, W]."""
    if isinstance(teacher, SparseTeacher):
        return bucketize(student_logits, teacher)  # W = k + 1
    # padded lm_head rows: compare on the shared first min(Vs, Vt) columns, each renormalised there
    shared = min(student_logits.shape[-1], teacher.shape[-1])
    student_logp = F.log_softmax(student_logits[:, :shared] / temperature, dim=-1)  # [n, W]
    teacher_logp = F.log_softmax(upcast(teacher.detach()[:, :shared]) / temperature, dim=-1)  # [n, W]
    return student_logp, teacher_logp.to(student_logp.dtype)


TokenSums = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]


def _token_sums(
    options: LossOptions,
    student_logits: torch.Tensor,
    teacher: torch.Tensor | SparseTeacher | None,
    labels: torch.Tensor,
) -> TokenSums:
    """(loss, kd, ce, tv, terms) summed over rows that are all kept. student_logits [n, Vs], labels [n]."""
    student_logits = upcast(student_logits)  # [n, Vs]
    zero = student_logits.new_zeros(())
    with torch.set_grad_enabled(torch.is_grad_enabled() and options.ce_term_weight is not None):
        # ce = -sum_i log q(y_i)   (hard labels, temperature 1, full student vocabulary)
        ce = F.cross_entropy(student_logits, labels, reduction="sum")
    values = {"ce": ce}
    if options.needs_teacher:
        student_logp, teacher_logp = _paired_logprobs(student_logits, teacher, options.temperature)  # [n, W]
        for name, _ in options.divergence_terms:
            values[name] = DIVERGENCES[name].value(student_logp, teacher_logp, options.beta).sum()
    tv = zero
    if teacher is not None:
        with torch.no_grad():
            if not options.needs_teacher or options.temperature != 1.0:
                student_logp, teacher_logp = _paired_logprobs(student_logits, teacher, 1.0)  # [n, W]
            tv = total_variation(student_logp, teacher_logp).sum()

    loss = options.combine(values)  # sum_i w_i term_i
    terms = {name: values[name].detach() for name, _ in options.terms}
    kd = options.kd_of(terms, zero) if options.needs_teacher else zero
    return loss, kd, ce.detach(), tv, terms


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
    loss: str | Mapping[str, float],
    beta: float = 0.5,
    temperature: float = 1.0,
    ce_weight: float = 0.0,
) -> LossSums:
    """Distillation loss summed over the kept tokens.

    student_logits [N, Vs]; teacher: logits [N, Vt] (compared on the shared first min(Vs, Vt) columns),
    a SparseTeacher with N rows (temperature 1 only), or None for loss="ce"; labels [N] long (-100 = ignore);
    mask [N] bool. loss: one of distill.losses.divergences.LOSSES, or a combination {name: weight >= 0} summed as
    sum_i weight_i * term_i; beta: JSD mixing weight; temperature softens both models (no T**2; ce stays at 1);
    ce_weight mixes in hard-label cross-entropy: loss = (1 - ce_weight) kd + ce_weight ce (0 with a
    combination); loss="ce" is ce alone.
    Positions with mask False or label -100 contribute nothing (not even NaNs).
    Raises ValueError on a bad option or inconsistent shapes.
    """
    options = LossOptions(loss, beta, temperature, ce_weight)
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
    total, kd, ce, tv, terms = _token_sums(options, student_logits[keep], take_rows(teacher, keep), labels[keep])
    return LossSums(loss=total, kd=kd, ce=ce, tv=tv, num_tokens=int(keep.numel()), terms=terms)


def _head_chunk_sums(
    options: LossOptions,
    student_head: nn.Module,
    teacher_head: nn.Module | None,
    student_hidden: torch.Tensor,
    teacher_chunk: torch.Tensor | SparseTeacher | None,
    labels: torch.Tensor,
) -> TokenSums:
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
    loss: str | Mapping[str, float],
    beta: float = 0.5,
    temperature: float = 1.0,
    ce_weight: float = 0.0,
) -> LossSums:
    """distill_loss from final hidden states, chunk_size kept tokens at a time; same value and gradients.

    student_hidden [B, T, H]; student_head maps [c, H] -> [c, Vs]. teacher: hidden states [B, T, H'] together
    with teacher_head ([c, H'] -> [c, Vt]), a SparseTeacher with B*T rows (flattened positions), or None for
    loss="ce". labels, mask [B, T]. At most one chunk's [c, V] logits exist at a time:
    - a plain nn.Linear student head (the usual lm_head) takes the fused path (distill/losses/fused.py): each chunk's
      gradient with respect to its logits is written in closed form and turned into the hidden states' and the
      head's gradients at once, so each head runs once per chunk and autograd keeps no logits;
    - any other head (a peft wrapper, a ZeRO-3-partitioned weight) runs inside a non-reentrant checkpoint per
      chunk: the teacher's logits under no_grad, the student's recomputed in backward (both heads run twice).
    Raises ValueError like distill_loss, and for chunk_size < 1 or a missing teacher_head.
    """
    options = LossOptions(loss, beta, temperature, ce_weight)
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

    if fusable_head(student_head):  # closed-form gradients, each head runs once per chunk (distill/losses/fused.py)
        total, kd, ce, tv, terms = fused_head_loss(options, hidden, student_head, teacher_rows, teacher_head,
                                                   targets, chunk_size)
        return LossSums(loss=total, kd=kd, ce=ce, tv=tv, num_tokens=int(keep.numel()), terms=terms)

    chunk_sums = partial(_head_chunk_sums, options, student_head, teacher_head)
    totals = []
    # at least one (possibly empty) chunk, so the loss stays connected to the student head's parameters
    for start in range(0, max(keep.numel(), 1), chunk_size):
        rows = slice(start, start + chunk_size)
        teacher_chunk = take_rows(teacher_rows, rows)
        args = (hidden[rows], teacher_chunk, targets[rows])
        if torch.is_grad_enabled():
            totals.append(checkpoint(chunk_sums, *args, use_reentrant=False))
        else:
            totals.append(chunk_sums(*args))
    total, kd, ce, tv = (torch.stack(values).sum() for values in zip(*(chunk[:4] for chunk in totals)))
    terms = {name: torch.stack([chunk[4][name] for chunk in totals]).sum() for name in totals[0][4]}
    return LossSums(loss=total, kd=kd, ce=ce, tv=tv, num_tokens=int(keep.numel()), terms=terms)
