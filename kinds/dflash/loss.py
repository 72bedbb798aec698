"""Training a DFlash draft on blocks: many blocks per row, each filled in one pass, each position scored.

Notation (kinds/dflash/model.py): x_t the row's tokens, h_t the target's hidden states at the draft's layers, p_t the
target's next-token distribution at position t (it predicts x_{t+1}), S = block_size, m the mask token. A block at
anchor a (1 <= a, x_{a+1} a loss token) is what the decoder drafts when x_a is the newest token:

    query   [x_a, m, .., m] at positions a .. a+S-1, attending to the context c_0 .. c_{a-1} (c = hidden_norm(fc(h)),
            each layer's keys and values of it) and to its whole block, non-causally; to nothing of other blocks
    slot k  (k = 1 .. S-1) drafts x_{a+k}: scored against p_{a+k-1} (teacher forcing: the context is the row's)

All blocks of a row run as one pass of n*S queries over a [n*S, T + n*S] boolean mask (`block_mask`): the context
keys are computed once per row. Anchors are drawn at random among the row's positions whose next token is a loss
token (`sample_anchors`, seeded per optimizer step, micro-batch and process so a resumed run draws the same ones).

Loss (a per-position-weighted mean over the optimizer step, as DFlash's authors and SpecForge weight it):

    L = sum_k w_k S_k / sum_k w_k N_k      w_k = exp(-(k - 1) / w)  (distill.dflash_position_decay = w; null: 1)

S_k = the sum over slot k's kept positions of the recipe's per-token loss (distill.losses.distill_loss.
chunked_distill_loss: any divergence against p, the ce mix, or hard-label CE on x_{a+k}), N_k their count. Later
slots weigh less: a block is accepted only up to its first rejected slot, so an early slot's error costs more.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from distill.losses.distill_loss import LossSums, chunked_distill_loss
from distill.utils import IGNORE_INDEX
from kinds.dflash.model import DFlashDraft

if TYPE_CHECKING:  # the recipe section, for annotations only
    from distill.recipe.sections import DistillKeys


class BlockTraining(nn.Module):
    """The module DistillTrainer trains for a DFlash draft: `forward` runs every block of a batch inside the
    (DDP-wrapped) forward. Its checkpoints name the draft's weights `draft.*`."""

    def __init__(self, draft: DFlashDraft) -> None:
        super().__init__()
        self.draft = draft

    def forward(self, input_ids: torch.Tensor, aux: torch.Tensor, anchors: torch.Tensor,
                attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask [B, T], the target's hidden states aux [B, T, k * H'], anchors [B, n] ->
        the blocks' normed hidden states [B, n, S, H] (slot k of block i drafts x_{a_i + k})."""
        draft, size = self.draft, self.draft.block_size
        batch, length = input_ids.shape
        positions = torch.arange(length, device=input_ids.device).expand(batch, length)
        context = draft.context_kv(aux.to(draft.fc.weight.dtype), positions)  # the row's context, once
        tokens = block_tokens(input_ids, anchors, size, draft.mask_token_id)  # [B, n*S]
        block_positions = (anchors[..., None] + torch.arange(size, device=anchors.device)).flatten(1)  # [B, n*S]
        mask = block_mask(anchors, attention_mask, size)
        hidden = draft.block_hidden(tokens, block_positions, context, mask)  # [B, n*S, H]
        return hidden.view(batch, anchors.shape[1], size, -1)


def sample_anchors(labels: torch.Tensor, attention_mask: torch.Tensor, count: int,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to `count` distinct anchors per row, uniformly among positions a >= 1 whose next token x_{a+1} is a loss
    token: (anchors [B, count] long, kept [B, count] bool; a row with fewer such positions keeps fewer blocks, the
    rest are copies marked not kept). Drawn on the CPU with `generator`."""
    labels, attention_mask = labels.cpu(), attention_mask.cpu()
    valid = torch.zeros_like(labels, dtype=torch.bool)
    valid[:, 1:-1] = (labels[:, 2:] != IGNORE_INDEX) & attention_mask[:, 2:].bool()
    scores = torch.rand(labels.shape, generator=generator).masked_fill(~valid, -1.0)
    count = min(count, labels.shape[1])
    top = scores.topk(count, dim=1)
    anchors, kept = top.indices, top.values >= 0
    first = anchors[:, :1].expand_as(anchors)
    return torch.where(kept, anchors, first), kept


def block_tokens(input_ids: torch.Tensor, anchors: torch.Tensor, size: int, mask_token_id: int) -> torch.Tensor:
    """[x_a, m, .., m] for every anchor a: [B, n * size]."""
    first = input_ids.gather(1, anchors)  # [B, n]
    blocks = torch.full((*anchors.shape, size), mask_token_id, dtype=input_ids.dtype, device=input_ids.device)
    blocks[..., 0] = first
    return blocks.flatten(1)


def block_mask(anchors: torch.Tensor, attention_mask: torch.Tensor, size: int) -> torch.Tensor:
    """Which keys each block query may see: [B, 1, n*S, T + n*S] bool. Context key c for block i: c < a_i (and not
    padding); block keys: its own block's S positions, all of them (non-causal); none of another block's."""
    batch, count = anchors.shape
    length = attention_mask.shape[1]
    columns = torch.arange(length, device=anchors.device)
    context = (columns[None, None, :] < anchors[..., None]) & attention_mask.bool()[:, None, :]  # [B, n, T]
    context = context[:, :, None, :].expand(batch, count, size, length).reshape(batch, count * size, length)
    block_of = torch.arange(count * size, device=anchors.device) // size  # [n*S]
    own = (block_of[:, None] == block_of[None, :]).expand(batch, -1, -1)  # [B, n*S, n*S]
    return torch.cat([context, own], dim=2)[:, None]


def slot_labels(labels: torch.Tensor, attention_mask: torch.Tensor, anchors: torch.Tensor, kept: torch.Tensor,
                size: int) -> torch.Tensor:
    """x_{a+k} for slot k = 1..S-1 of every block, IGNORE_INDEX where it is past the row, not a loss token, padding or
    in a block not kept: [B, n, S-1]."""
    length = labels.shape[1]
    index = anchors[..., None] + torch.arange(1, size, device=anchors.device)  # [B, n, S-1]
    inside = index < length
    flat = index.clamp(max=length - 1).flatten(1)
    wanted = labels.gather(1, flat).view_as(index)
    real = attention_mask.bool().gather(1, flat).view_as(index)
    keep = inside & real & (wanted != IGNORE_INDEX) & kept[..., None]
    return torch.where(keep, wanted, IGNORE_INDEX)


def teacher_rows(final: torch.Tensor, anchors: torch.Tensor, size: int) -> torch.Tensor:
    """The target's final hidden states at a + k - 1 for slot k = 1..S-1 (p_{a+k-1} predicts x_{a+k}):
    [B, n, S-1, H']."""
    length = final.shape[1]
    index = (anchors[..., None] + torch.arange(size - 1, device=anchors.device)).clamp(max=length - 1)
    return final.gather(1, index.flatten(1)[..., None].expand(-1, -1, final.shape[-1])).view(
        *index.shape, final.shape[-1])


def position_weights(size: int, decay: float | None) -> list[float]:
    """w_k = exp(-(k - 1) / decay) for k = 1..size-1 (all 1 without a decay)."""
    return [1.0 if decay is None else math.exp(-(k - 1) / decay) for k in range(1, size)]


def slot_token_counts(labels: torch.Tensor) -> torch.Tensor:
    """N_k: the kept positions of each slot, [S-1] long, from slot_labels [B, n, S-1]."""
    return (labels != IGNORE_INDEX).sum(dim=(0, 1))


def slot_sums(hidden: torch.Tensor, final: torch.Tensor, lm_head: nn.Module, labels: torch.Tensor,
              anchors: torch.Tensor, distill: DistillKeys, loss: str | dict | None = None) -> list[LossSums]:
    """The loss sums S_k of every slot k = 1..S-1: hidden [B, n, S, H] (BlockTraining), final the target's normed
    hidden states [B, T, H'], lm_head the target's (the draft's read-out and the teacher's), labels from
    slot_labels."""
    size = hidden.shape[2]
    teacher = teacher_rows(final, anchors, size).detach()  # [B, n, S-1, H']
    sums = []
    for k in range(1, size):
        slot = labels[:, :, k - 1]  # [B, n]
        sums.append(chunked_distill_loss(
            hidden[:, :, k], lm_head, teacher[:, :, k - 1], slot, slot != IGNORE_INDEX, teacher_head=lm_head,
            chunk_size=distill.chunk_size, loss=distill.loss if loss is None else loss, beta=distill.beta,
            temperature=distill.temperature, ce_weight=distill.ce_weight))
    return sums


def weighted_block_loss(sums: list[LossSums], weights: list[float], weighted_count: torch.Tensor) -> torch.Tensor:
    """sum_k w_k S_k / W, with W = sum_k w_k N_k over the whole optimizer step (its processes too)."""
    total = sums[0].loss * 0.0
    for weight, slot in zip(weights, sums):
        total = total + weight * slot.loss
    return total / weighted_count.clamp(min=1e-12)
