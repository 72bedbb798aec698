"""The chunked distillation loss fused with the student's lm_head, with closed-form gradients.

`chunked_distill_loss` (distill/losses/distill_loss.py) uses this path when the student head is a plain `nn.Linear`
whose weight is whole (not ZeRO-3-partitioned). For each chunk of c kept positions the forward pass

    z  = h W^T + b                       student logits [c, V] (float32 or wider)
    p  = the teacher's distribution      from teacher logits [c, V'] (one head call, no grad) or a cached top-k
    L  = sum_i w_i D_i(p, q) + w * CE(y, q)   the chunk's sums, q = softmax(z) (one divergence, or several)
    dz = dL/dz                           in closed form (below), never through autograd
    grad_h = dz W,  grad_W += dz^T h,  grad_b += sum_rows dz

so the backward only scales the saved grad_h / grad_W / grad_b by the incoming gradient. Nothing of size V
outlives its chunk and no head runs twice (the checkpointed path recomputes both heads in the backward). Under
bfloat16 autocast (train.bf16: DistillTrainer.autocast_smart_context_manager) the matmuls (z, the teacher's
logits, grad_h and grad_W) run in bfloat16; z and the teacher's logits are upcast before any softmax, and grad_W
accumulates over chunks in float32.

Gradients with respect to the student's logits s = z / T over a support of W columns (q = softmax(s), p the
teacher's distribution on the same support; each `Divergence.value_and_grad` in distill/losses/divergences.py):

    forward KL   KL(p || q)                           dL/ds = q - p
    reverse KL   KL(q || p)                           dL/ds = q (log q - log p - KL(q || p))
    JSD_beta     beta KL(p || m) + (1-beta) KL(q || m),  m = beta p + (1-beta) q
                                                      dL/ds = (1-beta) q (log q - log m - KL(q || m))
    TV           0.5 sum |p - q|                      dL/ds = q (g - sum q g),  g = 0.5 sign(q - p)
    nla          -log alpha,  alpha = sum min(p, q)   dL/ds = dTV/ds / alpha   (alpha = 1 - TV)
    lk_hybrid    lam KL(p || q) + (1-lam) TV,  lam = exp(-3 alpha) held constant
                                                      dL/ds = lam (q - p) + (1-lam) dTV/ds
    CE           -log q_T=1(y)                        dL/dz = softmax(z) - onehot(y)

A cached top-k teacher compares k + 1 buckets (the top-k tokens and the tail). A bucket's student log-prob is
the logsumexp of its members' logits, so a bucket gradient G_b reaches member i as G_b * q_i / Q_b: a top-k
token gets G_j itself, a token in the tail gets q_i * G_tail / Q_tail. The student's tail mass is taken from
the top-k alone, Q_tail = 1 - sum_topk q (no [c, V] mask); with k = V there is no tail and the loss is the
dense one.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from distill.losses.divergences import DIVERGENCES, TAIL_FLOOR, SparseTeacher, upcast
from distill.losses.options import LossOptions, take_rows
from distill.utils import plain_class


def fusable_head(head: nn.Module) -> bool:
    """Whether `head` is a plain linear layer with whole weights: the fused path can read W and b directly.

    An FSDP2-wrapped nn.Linear whose weight is whole at the moment (the draft's head, which accelerate keeps whole
    from the forward to the backward) counts as plain. Anything else (a peft wrapper, a ZeRO-3-partitioned weight or
    FSDP2 shard, accelerate's offload hooks) takes the checkpointed path, which calls the module itself.
    """
    return (plain_class(head) is nn.Linear and not hasattr(head.weight, "ds_id") and not hasattr(head, "_hf_hook")
            and not isinstance(head.weight, DTensor))


# ----------------------------------------------------------------------------------------------------------------
# Divergence values and their gradients with respect to the student's logits, per row
# ----------------------------------------------------------------------------------------------------------------

def divergence_and_grad(options: LossOptions, logq: torch.Tensor, logp: torch.Tensor,
                        ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """({name: per-row divergence [c]} for every divergence term of options, the gradient of sum_i w_i D_i with
    respect to the student logits [c, W], per-row total variation 0.5 sum |q - p| [c]), from log-probabilities
    logq (student), logp (teacher) over W columns."""
    logp = logp.clamp_min(torch.finfo(logp.dtype).min)  # a teacher zero: p log p = 0, never 0 * inf = nan
    values, grad, tv = {}, None, None
    for name, weight in options.divergence_terms:
        values[name], g, tv = DIVERGENCES[name].value_and_grad(logq, logp, options.beta)
        if weight == 0.0:
            continue
        g = g if weight == 1.0 else g.mul_(weight)  # each value_and_grad hands back a fresh gradient
        grad = g if grad is None else grad.add_(g)
    return values, grad if grad is not None else torch.zeros_like(logq), tv


# ----------------------------------------------------------------------------------------------------------------
# One chunk: sums and dL/dz
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class ChunkResult:
    loss: torch.Tensor  # scalar sums over the chunk's rows
    kd: torch.Tensor
    ce: torch.Tensor
    tv: torch.Tensor
    terms: dict[str, torch.Tensor]  # each term's own sum, by loss name
    grad_logits: torch.Tensor | None  # [c, V] dL/dz, None when no gradient was asked for


def _result(options: LossOptions, values: dict[str, torch.Tensor], tv: torch.Tensor,
            grad: torch.Tensor | None) -> ChunkResult:
    """The chunk's sums from each term's sum: loss = sum_i w_i term_i, kd as logged (LossOptions.kd_of)."""
    zero = values["ce"].new_zeros(())
    terms = {name: values[name] for name, _ in options.terms}
    kd = options.kd_of(values, zero) if options.needs_teacher else zero
    return ChunkResult(options.combine(values), kd, values["ce"], tv, terms, grad)


def _add_ce_grad(grad: torch.Tensor, z: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor, w: float) -> None:
    """grad += w (softmax(z) - onehot(y)), in place: the gradient of w * CE at temperature 1."""
    if w != 0.0:
        grad.add_((z - lse[:, None]).exp_(), alpha=w)
        grad[torch.arange(len(labels)), labels] -= w


def _dense_chunk(options: LossOptions, z: torch.Tensor, teacher_logits: torch.Tensor | None, labels: torch.Tensor,
                 need_grad: bool) -> ChunkResult:
    """Student logits z [c, V] against dense teacher logits [c, V'] (shared first min(V, V') columns) or None."""
    w = options.ce_term_weight or 0.0
    lse = torch.logsumexp(z, dim=-1)  # [c]
    values = {"ce": (lse - z.gather(1, labels[:, None])[:, 0]).sum()}  # -log q(y) at temperature 1
    tv = z.new_zeros(())
    g, shared = None, z.shape[-1]
    if teacher_logits is not None:
        shared = min(z.shape[-1], teacher_logits.shape[-1])
        t = upcast(teacher_logits[:, :shared]).to(z.dtype)
        if options.needs_teacher:
            logq = F.log_softmax(z[:, :shared] / options.temperature, dim=-1)  # [c, W]
            logp = F.log_softmax(t / options.temperature, dim=-1)  # [c, W]
            rows, g, tv_rows = divergence_and_grad(options, logq, logp)
            values.update({name: value.sum() for name, value in rows.items()})
            if options.temperature == 1.0:
                tv = tv_rows.sum()
        if not options.needs_teacher or options.temperature != 1.0:  # tv is logged at temperature 1
            tv = 0.5 * (F.softmax(z[:, :shared], dim=-1) - F.softmax(t, dim=-1)).abs().sum()
    grad = None
    if need_grad:
        if g is not None and shared == z.shape[-1]:  # the KD gradient covers every column: scale it in place
            grad = g if options.temperature == 1.0 else g.mul_(1.0 / options.temperature)  # ds/dz = 1 / T
        else:
            grad = torch.zeros_like(z)
            if g is not None:
                grad[:, :shared] = g.mul_(1.0 / options.temperature)
        _add_ce_grad(grad, z, lse, labels, w)
    return _result(options, values, tv, grad)


def _sparse_chunk(options: LossOptions, z: torch.Tensor, teacher: SparseTeacher, labels: torch.Tensor,
                  need_grad: bool) -> ChunkResult:
    """Student logits z [c, V] against a cached top-k teacher: k + 1 buckets (top-k, tail); temperature 1."""
    w = options.ce_term_weight or 0.0
    ids = teacher.topk_ids.long()  # [c, k]
    vocab = z.shape[-1]
    if ids.numel() > 0 and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"SparseTeacher topk_ids must lie in [0, {vocab}) (the student vocabulary), "
                         f"got ids in [{int(ids.min())}, {int(ids.max())}]")
    lse = torch.logsumexp(z, dim=-1, keepdim=True)  # [c, 1]
    values = {"ce": (lse[:, 0] - z.gather(1, labels[:, None])[:, 0]).sum()}
    logq_top = z.gather(1, ids) - lse  # [c, k]
    teacher_top = teacher.topk_logprobs.detach().to(z.dtype)  # [c, k]
    has_tail = ids.shape[1] < vocab
    if has_tail:
        # Q_tail = 1 - sum_topk q, from the top-k alone (float64 sum against cancellation)
        q_tail = (1.0 - logq_top.double().exp().sum(-1)).clamp_min(torch.finfo(z.dtype).tiny).to(z.dtype)
        # P_tail = 1 - sum_topk p, floored so that rounding in the cache cannot make reverse KL infinite
        p_tail = (-torch.expm1(torch.logsumexp(teacher_top, dim=-1))).clamp_min(TAIL_FLOOR)
        logq = torch.cat([logq_top, q_tail.log()[:, None]], dim=-1)  # [c, k+1]
        logp = F.log_softmax(torch.cat([teacher_top, p_tail.log()[:, None]], dim=-1), dim=-1)  # renormalised
    else:  # k = V: the buckets are the tokens
        logq, logp = logq_top, F.log_softmax(teacher_top, dim=-1)
    g = None
    if options.needs_teacher:
        rows, g, tv_rows = divergence_and_grad(options, logq, logp)
        values.update({name: value.sum() for name, value in rows.items()})
        tv = tv_rows.sum()
    else:
        tv = 0.5 * (logq.exp() - logp.exp()).abs().sum()
    grad = None
    if need_grad:
        q = (z - lse).exp_()  # [c, V]
        top_grad = w * logq_top.exp()  # [c, k]: the ce part at the top-k columns, softmax(z) there
        if g is not None:
            top_grad += g[:, :ids.shape[1]]
        # a tail token i gets (w + G_tail / Q_tail) q_i: the ce part plus its share of the tail bucket's gradient
        tail_scale = w + (g[:, -1] / q_tail if g is not None and has_tail else 0.0)  # [c] or scalar
        grad = q.mul_(tail_scale[:, None] if torch.is_tensor(tail_scale) else tail_scale)
        grad.scatter_(1, ids, top_grad)
        grad[torch.arange(len(labels)), labels] -= w
    return _result(options, values, tv, grad)


# ----------------------------------------------------------------------------------------------------------------
# All chunks, and the autograd Function that hands back the gradients computed on the way
# ----------------------------------------------------------------------------------------------------------------

def _run_chunks(options: LossOptions, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                teacher_rows: torch.Tensor | SparseTeacher | None, teacher_head: nn.Module | None,
                targets: torch.Tensor, chunk_size: int, need: tuple[bool, bool, bool]):
    """Sums over all kept rows and the gradients asked for by `need` = (hidden, weight, bias)."""
    wide = torch.promote_types(weight.dtype, torch.float32)
    names = [name for name, _ in options.terms]
    totals = torch.zeros(4 + len(names), dtype=wide, device=hidden.device)  # loss, kd, ce, tv, each term
    grad_h = torch.zeros_like(hidden) if need[0] else None
    grad_w = torch.zeros(weight.shape, dtype=wide, device=weight.device) if need[1] else None
    grad_b = torch.zeros(bias.shape, dtype=wide, device=bias.device) if need[2] else None
    for start in range(0, hidden.shape[0], chunk_size):
        rows = slice(start, start + chunk_size)
        h = hidden[rows]
        z = upcast(F.linear(h, weight, bias))  # [c, V]
        teacher = take_rows(teacher_rows, rows)
        if isinstance(teacher, SparseTeacher):
            result = _sparse_chunk(options, z, teacher, targets[rows], any(need))
        else:
            teacher_logits = teacher_head(teacher) if teacher is not None else None  # [c, V']
            result = _dense_chunk(options, z, teacher_logits, targets[rows], any(need))
        sums = [result.loss, result.kd, result.ce, result.tv, *(result.terms[name] for name in names)]
        totals += torch.stack(sums).to(wide)
        if result.grad_logits is not None:
            dz = result.grad_logits.to(weight.dtype)
            if grad_h is not None:
                grad_h[rows] = dz @ weight  # [c, H]
            if grad_w is not None:
                grad_w += (dz.T @ h.to(weight.dtype)).to(wide)  # [V, H]
            if grad_b is not None:
                grad_b += result.grad_logits.sum(0).to(wide)
    return totals, grad_h, grad_w, grad_b


class _FusedHeadLoss(torch.autograd.Function):
    """(loss, kd, ce, tv, each term) of every chunk; only loss carries a gradient, computed during the forward."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, teacher_rows, teacher_head, targets, options, chunk_size, need):
        totals, grad_h, grad_w, grad_b = _run_chunks(options, hidden, weight, bias, teacher_rows, teacher_head,
                                                     targets, chunk_size, need)
        ctx.weight_dtype = weight.dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        loss, *logged = (value.clone() for value in totals.unbind())
        ctx.mark_non_differentiable(*logged)
        return loss, *logged

    @staticmethod
    def backward(ctx, grad_loss, *unused):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        scale = grad_loss
        return (grad_h * scale.to(grad_h.dtype) if grad_h is not None else None,
                (grad_w * scale).to(ctx.weight_dtype) if grad_w is not None else None,
                (grad_b * scale).to(ctx.bias_dtype) if grad_b is not None else None,
                None, None, None, None, None, None)


def fused_head_loss(options: LossOptions, hidden: torch.Tensor, head: nn.Linear,
                    teacher_rows: torch.Tensor | SparseTeacher | None, teacher_head: nn.Module | None,
                    targets: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, ...]:
    """(loss, kd, ce, tv, {name: term}) sums over the kept rows: hidden [n, H], targets [n], teacher_rows hidden
    states [n, H'] (with teacher_head), a SparseTeacher with n rows, or None (ce). The loss is differentiable with
    respect to hidden and the head's weight and bias; the others are detached."""
    weight, bias = head.weight, head.bias
    grad_on = torch.is_grad_enabled()
    need = (grad_on and hidden.requires_grad, grad_on and weight.requires_grad,
            grad_on and bias is not None and bias.requires_grad)
    if not any(need):
        with torch.no_grad():
            totals, *_ = _run_chunks(options, hidden, weight, bias, teacher_rows, teacher_head, targets,
                                     chunk_size, need)
        sums = totals.unbind()
    else:
        sums = _FusedHeadLoss.apply(hidden, weight, bias, teacher_rows, teacher_head, targets, options, chunk_size,
                                    need)
    names = [name for name, _ in options.terms]
    return (*sums[:4], dict(zip(names, sums[4:])))
