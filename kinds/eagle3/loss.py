"""Training-time test (TTT) of an EAGLE-3 head: the head unrolled K steps on its own outputs, each step scored.

Notation (kinds/eagle3/model.py): x_t the tokens, h_t the target's fused aux hidden states, p_t the target's next-token
distribution computed at position t (it predicts x_{t+1}). With K = distill.ttt_steps, for every index t:

    step 0:  (x_{t+1}, fuse(h_t))  -> g^0_t  at rope position t,      predicts x_{t+2},   scored against p_{t+1}
    step j:  (x_{t+1+j}, g^{j-1}_t) -> g^j_t at rope position t + j,  predicts x_{t+2+j}, scored against p_{t+1+j}

Attention at step j, index t: the step-0 keys at s <= t (the target-feature positions) and the step-i keys at
index t for i = 1..j (its own drafted positions): exactly the head's KV cache (each decoder layer's alike) when the
decoder drafts the (j+1)-th token from a context ending at position t. All indices t of one step run as one batched
pass over a [T, (j+1) T] boolean mask (`ttt_mask`); tokens are the data's (teacher forcing), features the head's own.

Loss (per-token mean over the optimizer step, as for standalone drafts, one mean per step):

    L = sum_j ttt_decay^j * S_j / N_j      S_j = sum over step j's kept positions of the recipe's per-token loss

The per-token loss is distill.losses.distill_loss.chunked_distill_loss (any divergence of
distill.losses.divergences.DIVERGENCES, the ce mix, the temperature) between the head's draft-vocabulary distribution
and the target's distribution restricted to the draft vocabulary and renormalised (`restricted_head`: the target's
lm_head rows of the draft ids). A position whose next token lies outside the draft vocabulary is not kept (the head can
never draft it). With distill.soft_target_top_k = k that distribution is cut to its k most likely tokens and
renormalised (`TopKTeacher`): p_k(x) = p(x) / sum_{y in top_k} p(y) on the top k, 0 elsewhere.

With distill.feature_weight = w > 0 each kept position of step j adds w * F to its per-token loss (EAGLE-1's feature
regression; `feature_sum`), F the smooth-L1 distance between the head's normed output g^j_t (after its final norm)
and the target's final normed hidden state f_{t+1+j} (what the target's lm_head reads to give p_{t+1+j}):

    F = (1 / H) sum_d huber(g^j_t[d] - f_{t+1+j}[d]),   huber(e) = e^2 / 2 if |e| < 1 else |e| - 1/2
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from distill.losses.distill_loss import LossSums, chunked_distill_loss
from distill.utils import IGNORE_INDEX
from kinds.eagle3.model import Eagle3Head

if TYPE_CHECKING:  # the recipe section, for annotations only: recipe/ itself imports losses/
    from distill.recipe.sections import DistillKeys


class UnrolledHead(nn.Module):
    """The module DistillTrainer trains for an EAGLE-3 head: `forward` unrolls `head` over K steps, so the whole
    unroll runs inside the (DDP-wrapped) forward. Its checkpoints name the head's weights `head.*`."""

    def __init__(self, head: Eagle3Head, steps: int, feature_noise: float = 0.0) -> None:
        super().__init__()
        if steps < 1:
            raise ValueError(f"ttt steps must be >= 1, got {steps}")
        self.head, self.steps, self.feature_noise = head, steps, feature_noise

    def forward(self, input_ids: torch.Tensor, aux_hidden: torch.Tensor) -> list[torch.Tensor]:
        """input_ids [B, T], the target's aux hidden states [B, T, k * H'] -> the normed output of each step,
        K tensors [B, T, H] (index t of step j predicts x_{t+2+j})."""
        fused = self.head.fuse(aux_hidden.to(self.head.fc.weight.dtype))  # a bf16 target, a float32 head
        if self.training and self.feature_noise > 0:
            fused = noisy(fused, self.feature_noise)
        return unroll(self.head, input_ids, fused, self.steps)


def noisy(features: torch.Tensor, scale: float) -> torch.Tensor:
    """distill.feature_noise: features [B, T, H] + scale * rms_t * eps, eps ~ N(0, 1), rms_t the RMS of position t's
    features (so the noise is the same fraction of every position's features, whatever its layer's scale)."""
    rms = features.detach().pow(2).mean(-1, keepdim=True).sqrt()  # [B, T, 1]
    return features + scale * rms * torch.randn_like(features)


def ttt_mask(length: int, step: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Which keys a step-`step` query may see: [1, 1, T, (step+1) T] bool. Key block 0 (step-0 keys) is causal,
    key block i >= 1 (step-i keys) is the diagonal: index t sees only its own earlier drafted positions."""
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()  # s <= t
    diagonal = torch.eye(length, dtype=torch.bool, device=device)  # s == t
    return torch.cat([causal] + [diagonal] * step, dim=1).view(1, 1, length, (step + 1) * length)


def shifted(input_ids: torch.Tensor, offset: int) -> torch.Tensor:
    """x_{t+offset} at index t, [B, T]; indices past the end get token 0 (never scored)."""
    out = torch.zeros_like(input_ids)
    if offset < input_ids.shape[1]:
        out[:, : input_ids.shape[1] - offset] = input_ids[:, offset:]
    return out


def unroll(head: Eagle3Head, input_ids: torch.Tensor, fused: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The head's normed outputs [B, T, H] at steps 0..steps-1 (module docstring), fused = fuse(h) [B, T, H]."""
    batch, length = input_ids.shape
    positions = torch.arange(length, device=input_ids.device).expand(batch, length)  # [B, T]
    keys = [[] for _ in range(head.num_layers)]  # per layer, each step's keys [B, nkv, T, d]
    values = [[] for _ in range(head.num_layers)]
    outputs, hidden = [], fused
    for step in range(steps):
        mask = ttt_mask(length, step, input_ids.device)  # [1, 1, T, (j+1) T]

        def attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            keys[layer].append(k)
            values[layer].append(v)
            return head.attend(q, torch.cat(keys[layer], dim=2), torch.cat(values[layer], dim=2), mask, layer)

        # (x_{t+1+j}, hidden) at rope position t + j; hidden: the prenorm output, fed back at the next step
        normed, hidden = head.run(shifted(input_ids, 1 + step), hidden, positions + step, attention)
        outputs.append(normed)
    return outputs


# ---------------------------------------------------------------------------------------------------------------
# What each step is scored on
# ---------------------------------------------------------------------------------------------------------------

def draft_labels(labels: torch.Tensor, attention_mask: torch.Tensor, head: Eagle3Head) -> torch.Tensor:
    """labels [B, T] (target ids, -100 = no loss) as draft ids; -100 also where the token is outside the draft
    vocabulary or padding."""
    in_draft = head.t2d.to(labels.device)
    draft_id = torch.cumsum(in_draft.long(), 0) - 1  # target ids ascend with draft ids: rank among draft tokens
    ids = labels.clamp(min=0)
    keep = (labels != IGNORE_INDEX) & attention_mask.bool() & in_draft[ids]
    return torch.where(keep, draft_id[ids], IGNORE_INDEX)


def step_token_counts(labels: torch.Tensor, attention_mask: torch.Tensor, head: Eagle3Head,
                      steps: int) -> torch.Tensor:
    """N_j: the kept positions of each step, [K] long; step j at index t is kept when its label x_{t+2+j} is."""
    kept = draft_labels(labels, attention_mask, head) != IGNORE_INDEX  # [B, T]
    return torch.stack([kept[:, 2 + step:].sum() for step in range(steps)])


def restricted_head(target_head: nn.Module, head: Eagle3Head) -> nn.Module:
    """The target's lm_head reduced to the draft vocabulary's rows: its logits are the target's logits of the
    draft ids, whose softmax is p restricted to the draft vocabulary and renormalised."""
    ids = head.target_ids.to(target_head.weight.device)
    if ids.numel() == target_head.weight.shape[0] and bool((ids == torch.arange(ids.numel(), device=ids.device)).all()):
        return target_head
    bias = getattr(target_head, "bias", None)
    restricted = nn.Linear(target_head.weight.shape[1], ids.numel(), bias=bias is not None,
                           device=ids.device, dtype=target_head.weight.dtype)
    with torch.no_grad():
        restricted.weight.copy_(target_head.weight[ids])
        if bias is not None:
            restricted.bias.copy_(bias[ids])
    return restricted.requires_grad_(False)


# A token outside the teacher's top k gets a logit this far below its row's largest: exp(-1e4) is 0 in float32, so its
# probability is 0 (as -inf would give) while every value stays finite (the fused losses' p * log p is then 0, not NaN).
TOP_K_GAP = 1e4


class TopKTeacher(nn.Module):
    """distill.soft_target_top_k: the teacher head's logits with all but each row's k largest pushed TOP_K_GAP below
    that row's largest, so that their softmax is the teacher's distribution restricted to its top k and renormalised
    (tokens tied with the k-th largest are kept too)."""

    def __init__(self, head: nn.Module, k: int) -> None:
        super().__init__()
        if k < 1:
            raise ValueError(f"soft_target_top_k must be >= 1, got {k}")
        self.head, self.k = head, k

    @property
    def weight(self) -> torch.Tensor:
        """The teacher head's weight (its dtype and device are the teacher's)."""
        return self.head.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden)  # [..., V]
        if self.k >= logits.shape[-1]:
            return logits
        kth = logits.topk(self.k, dim=-1).values[..., -1:]  # [..., 1]
        return torch.where(logits >= kth, logits, logits.amax(-1, keepdim=True) - TOP_K_GAP)


def teacher_of(target_head: nn.Module, head: Eagle3Head, top_k: int | None) -> nn.Module:
    """The head's teacher: the target's lm_head on the draft vocabulary (`restricted_head`), cut to its top k tokens
    when distill.soft_target_top_k is set."""
    restricted = restricted_head(target_head, head)
    return restricted if top_k is None else TopKTeacher(restricted, top_k)


def ttt_step_sums(head: Eagle3Head, outputs: list[torch.Tensor], teacher_hidden: torch.Tensor,
                  teacher_head: nn.Module, labels: torch.Tensor, attention_mask: torch.Tensor,
                  distill: DistillKeys, loss: str | Mapping[str, float] | None = None) -> list[LossSums]:
    """Loss sums of every step: outputs (from unroll) K x [B, T, H], teacher_hidden the target's final normed
    hidden states [B, T, H'], teacher_head from restricted_head, labels and attention_mask [B, T]; the loss
    settings are the recipe's distill section (beta, temperature, ce_weight, chunk_size) and `loss`, a loss name or
    a combination's weights at this step (DistillKeys.loss_at; None: distill.loss)."""
    ids = draft_labels(labels, attention_mask, head)  # [B, T]
    length, sums = labels.shape[1], []
    for step, normed in enumerate(outputs):
        n = length - 2 - step  # indices t with a label x_{t+2+j} inside the row
        if n <= 0:
            zero = normed.sum() * 0.0  # keeps every step in the graph (DDP expects each parameter used)
            sums.append(LossSums(loss=zero, kd=zero.detach(), ce=zero.detach(), tv=zero.detach(), num_tokens=0))
            continue
        step_labels = ids[:, 2 + step:]  # [B, n]: x_{t+2+j}
        teacher = teacher_hidden[:, 1 + step:1 + step + n].detach()  # f_{t+1+j}
        step_sums = chunked_distill_loss(
            normed[:, :n], head.lm_head, teacher, step_labels, step_labels != IGNORE_INDEX,
            teacher_head=teacher_head, chunk_size=distill.chunk_size, loss=distill.loss if loss is None else loss,
            beta=distill.beta, temperature=distill.temperature, ce_weight=distill.ce_weight)
        if distill.feature_weight > 0:
            feature = feature_sum(normed[:, :n], teacher, step_labels != IGNORE_INDEX)
            step_sums = dataclasses.replace(step_sums, loss=step_sums.loss + distill.feature_weight * feature,
                                            terms={**step_sums.terms, "feature": feature.detach()})
        sums.append(step_sums)
    return sums


def feature_sum(normed: torch.Tensor, teacher: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """sum over the kept positions of F (module docstring): normed, teacher [B, n, H], kept [B, n] bool -> scalar."""
    if normed.shape[-1] != teacher.shape[-1]:
        raise ValueError(f"distill.feature_weight: the head's hidden size {normed.shape[-1]} is not the target's "
                         f"{teacher.shape[-1]}")
    distance = nn.functional.smooth_l1_loss(normed, teacher.to(normed.dtype), reduction="none", beta=1.0).mean(-1)
    return (distance * kept).sum()


def weighted_loss(sums: list[LossSums], counts: torch.Tensor, decay: float) -> torch.Tensor:
    """sum_j decay^j S_j / N_j (a step with N_j = 0 adds nothing, but stays in the graph)."""
    total = sums[0].loss * 0.0
    for step, step_sums in enumerate(sums):
        total = total + decay ** step * step_sums.loss / counts[step].clamp(min=1)
    return total
