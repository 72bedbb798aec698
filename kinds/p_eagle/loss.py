"""Training a P-EAGLE head: every row position is slot 0 (the EAGLE-3 head's own first step), and blocks of mask slots
at random anchors teach it to draft further ahead from a learned hidden state, all in one pass of the head.

Notation (kinds/eagle3/model.py, kinds/eagle3/loss.py): x_t the tokens, h_t the target's aux hidden states, p_t the
target's next-token distribution at position t (it predicts x_{t+1}), m the mask token (model.ptd_token_id), h_m the
learned `mask_hidden`, K = model.ptd_gamma. What the decoder runs when x_{a+1} is the newest token
(kinds/p_eagle/drafter.py), and vLLM's eagle3 proposer with parallel_drafting:

    position t <= a    (x_{t+1}, fc(h_t))  at rope position t   the target-feature positions, causal
    slot 0             position a's output drafts x_{a+2}       scored against p_{a+1}
    slot k (1..K-1)    (m, fc(h_m)) at rope position a + k      drafts x_{a+2+k}, scored against p_{a+1+k}

Training runs the row once (slot 0 at every position, as an EAGLE-3 head's step 0) and appends n blocks of K - 1 mask
slots (anchors a whose x_{a+3}, slot 1's label, is a loss token in the draft vocabulary). Block i's slot k sees the
row's positions 0..a_i and its own slots 1..k (kinds.parallel_drafting.block_allowed, the same mask as a PARD
draft's); the row never sees a slot. The loss is PARD's (kinds.parallel_drafting.step_loss): each slot's per-token
mean over the optimizer step, weighted (distill.pard_position_decay; null: all 1),
L = (S_0 / N_0 + sum_k w_k S_k / N_k) / (1 + sum_k w_k), every S_k the recipe's per-token loss against the target's
distribution restricted to the draft vocabulary (as EAGLE-3's).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from distill.utils import IGNORE_INDEX
from kinds.dflash.loss import sample_anchors
from kinds.dflash.loss import slot_labels as dflash_slot_labels
from kinds.dflash.loss import teacher_rows as dflash_teacher_rows
from kinds.eagle3.loss import UnrolledHead, noisy, shifted
from kinds.eagle3.model import Eagle3Head
from kinds.parallel_drafting import block_allowed, block_positions


def head_anchors(ids: torch.Tensor, attention_mask: torch.Tensor, count: int,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to `count` anchors a per row whose x_{a+3} is kept (`ids`: draft_labels, [B, T]): (anchors [B, count],
    kept [B, count])."""
    return sample_anchors(F.pad(ids[:, 2:], (0, 2), value=IGNORE_INDEX),
                          F.pad(attention_mask[:, 2:], (0, 2), value=0), count, generator)


def slot_labels(ids: torch.Tensor, attention_mask: torch.Tensor, anchors: torch.Tensor, kept: torch.Tensor,
                gamma: int) -> torch.Tensor:
    """x_{a+2+k} (draft ids) for mask slot k = 1..gamma-1 of every block, IGNORE_INDEX where it is past the row, not
    kept, padding or in a block not kept: [B, n, gamma - 1] (DFlash's slot k at anchor a + 2)."""
    return dflash_slot_labels(ids, attention_mask, anchors + 2, kept, gamma)


def teacher_rows(final: torch.Tensor, anchors: torch.Tensor, gamma: int) -> torch.Tensor:
    """The target's final hidden states at a + 1 + k for mask slot k (p_{a+1+k} predicts x_{a+2+k}):
    [B, n, gamma - 1, H']."""
    return dflash_teacher_rows(final, anchors + 2, gamma)


class ParallelHead(UnrolledHead):
    """The module DistillTrainer trains for a P-EAGLE head: `forward` runs the row and its blocks' mask slots in one
    pass of the head (inside the DDP-wrapped forward). Its checkpoints name the head's weights `head.*`, as an
    EAGLE-3 head's."""

    def __init__(self, head: Eagle3Head, gamma: int, token: int, feature_noise: float = 0.0) -> None:
        super().__init__(head, 1, feature_noise)
        self.gamma, self.token = gamma, token

    def forward(self, input_ids: torch.Tensor, aux_hidden: torch.Tensor, anchors: torch.Tensor,
                attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids [B, T], the target's aux hidden states [B, T, k * H'], anchors [B, n] -> the normed outputs of
        the row [B, T, H] (index t predicts x_{t+2}) and of the slots [B, n, gamma - 1, H]."""
        head, (batch, length), slots = self.head, input_ids.shape, anchors.shape[1] * (self.gamma - 1)
        fused = head.fuse(aux_hidden.to(head.fc.weight.dtype))  # [B, T, H]
        if self.training and self.feature_noise > 0:  # distill.feature_noise: the row's features, not the mask slots
            fused = noisy(fused, self.feature_noise)
        tokens = torch.cat([shifted(input_ids, 1), input_ids.new_full((batch, slots), self.token)], dim=1)
        hidden = torch.cat([fused, head.mask_input().expand(batch, slots, -1)], dim=1)
        mask = block_allowed(anchors, attention_mask, self.gamma)  # [B, 1, Q, Q]
        normed, _ = head.run(tokens, hidden, block_positions(anchors, length, self.gamma),
                             lambda layer, q, k, v: head.attend(q, k, v, mask, layer))
        return normed[:, :length], normed[:, length:].view(batch, anchors.shape[1], self.gamma - 1, -1)
