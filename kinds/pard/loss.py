"""Training a PARD draft: every row position is slot 0 (the ordinary next-token prediction), and blocks of mask slots
at random anchors teach the draft to predict further ahead, all in one forward of the draft.

Notation: x_t the row's tokens, p_t the target's next-token distribution at position t (it predicts x_{t+1}),
K = model.pard_gamma, m = model.pard_token. What the decoder runs when x_a is the newest token (kinds/pard/drafter.py):

    query   x_0 .. x_a (the cache and cur), then m at positions a+1 .. a+K-1, causal
    slot 0  the output at x_a drafts x_{a+1}                  scored against p_a
    slot k  the output at the k-th m drafts x_{a+k+1}         scored against p_{a+k}   (k = 1 .. K-1)

Training runs the row once, causally, which gives slot 0 at every position, and appends n blocks of K - 1 mask slots
(anchors a among the positions whose x_{a+2} is a loss token: kinds.dflash.loss.sample_anchors on labels shifted by
one). Block i's slot k sits at position a_i + k and sees the row's x_0 .. x_{a_i} and its own slots 1 .. k, nothing
else (kinds.parallel_drafting.block_allowed, as `block_attention`: an additive 4D mask; transformers passes a 4D mask
through unchanged). The row's queries
never see a slot, so slot 0 is the standalone draft's own forward.

Loss: each slot's per-token mean over the optimizer step, weighted (distill.pard_position_decay = w; null: all 1),

    L = (S_0 / N_0 + sum_k w_k S_k / N_k) / (1 + sum_k w_k)        w_k = exp(-k / w)

S_k = the sum over slot k's positions of the recipe's per-token loss (distill.losses.distill_loss.chunked_distill_loss:
any divergence against p, a mix with CE, or CE on the data alone), N_k their count over the step and every process.
Equal weights are PARD's own objective (each mask offset's copy of the data counts the same). The weights and the
weighted loss are a parallel draft's (kinds/parallel_drafting.py: slot_weights, weighted_slot_loss, step_loss).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from distill.utils import IGNORE_INDEX
from kinds.dflash.loss import sample_anchors
from kinds.dflash.loss import slot_labels as dflash_slot_labels
from kinds.dflash.loss import teacher_rows as dflash_teacher_rows
from kinds.parallel_drafting import block_allowed, block_positions
from kinds.parallel_drafting import slot_weights as slot_weights  # re-exported: the loss's w_k


def pard_anchors(labels: torch.Tensor, attention_mask: torch.Tensor, count: int,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to `count` anchors a per row whose x_{a+2} is a loss token (slot 1 has something to learn): (anchors
    [B, count], kept [B, count])."""
    shifted = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
    return sample_anchors(shifted, F.pad(attention_mask[:, 1:], (0, 1), value=0), count, generator)


def block_inputs(input_ids: torch.Tensor, anchors: torch.Tensor, gamma: int,
                 pard_token: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The row and its blocks' slots as one query: tokens and position ids [B, T + n * (gamma - 1)]."""
    batch, length = input_ids.shape
    slots = torch.full((batch, anchors.shape[1] * (gamma - 1)), pard_token, dtype=input_ids.dtype,
                       device=input_ids.device)
    return torch.cat([input_ids, slots], dim=1), block_positions(anchors, length, gamma)


def block_attention(anchors: torch.Tensor, attention_mask: torch.Tensor, gamma: int,
                    dtype: torch.dtype) -> torch.Tensor:
    """block_allowed as the additive mask a transformers model takes: 0 where a query may attend, the dtype's minimum
    elsewhere, [B, 1, Q, Q]."""
    allowed = block_allowed(anchors, attention_mask, gamma)
    return torch.where(allowed, 0.0, torch.finfo(dtype).min).to(dtype)


def slot_labels(labels: torch.Tensor, attention_mask: torch.Tensor, anchors: torch.Tensor, kept: torch.Tensor,
                gamma: int) -> torch.Tensor:
    """x_{a+k+1} for mask slot k = 1..gamma-1 of every block, IGNORE_INDEX where it is past the row, not a loss token,
    padding or in a block not kept: [B, n, gamma - 1]. Mask slot k at anchor a drafts what DFlash's block slot k at
    anchor a + 1 drafts (kinds.dflash.loss.slot_labels)."""
    return dflash_slot_labels(labels, attention_mask, anchors + 1, kept, gamma)


def teacher_rows(final: torch.Tensor, anchors: torch.Tensor, gamma: int) -> torch.Tensor:
    """The target's final hidden states at a + k for mask slot k = 1..gamma-1 (p_{a+k} predicts x_{a+k+1}):
    [B, n, gamma - 1, H'] (kinds.dflash.loss.teacher_rows at anchor a + 1)."""
    return dflash_teacher_rows(final, anchors + 1, gamma)
