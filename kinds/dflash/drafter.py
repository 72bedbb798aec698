"""The DFlash draft as a drafter: one forward pass per step drafts the whole block, reading the target's own hidden
states, which the verify pass returns (kinds/dflash/model.py has the draft's maths).

State, after the target has processed x_0..x_{M-1} (hidden states h_0..h_{M-1}) and x_M = `cur` is the newest token:
the context cache holds each layer's context keys and values of positions 0..P-1, all from TARGET hidden states of
committed tokens; `features` holds h_P..h_{M-1}, not yet projected.

    propose: c_P..c_{M-1} = hidden_norm(fc(h_P..h_{M-1})) -> each layer's k, v join the cache        (P := M)
             block [cur, mask x gamma] at positions M..M+gamma attends to context 0..M-1 and to the whole block
             -> logits of slots 1..gamma -> d_1..d_gamma at once: greedy, each slot's argmax; sampling, each slot
             drawn from its own q_j = softmax(warped logits_j) (the slots are drafted independently given the block:
             q_j is the distribution d_j was drawn from, which is all the acceptance rule needs)
    commit:  nothing to roll back: the block's keys and values are recomputed at every step and never stored, and
             the loop then hands over h of cur, d_1..d_n (the accepted tokens only), which the next propose projects.

This is vLLM's dflash proposer for one sequence: there the context keys and values of the verified positions are
written into the draft's KV cache (rejected ones masked off by the sequence length) and the block's queries attend
to them and to the block. Drafting is eager (with --compile the target's steps are compiled, the draft's are not).
"""
from __future__ import annotations

import torch

from decode.loop.sampling import SamplingConfig, draw, probs_from_logits
from decode.loop.static import bucket
from kinds.dflash.model import DFlashDraft


def check_block(draft: DFlashDraft, gamma: int) -> None:
    """A block is the newest token and gamma mask tokens: ValueError unless gamma <= block_size - 1."""
    if gamma > draft.block_size - 1:
        raise ValueError(f"gamma {gamma} does not fit this DFlash draft's block of {draft.block_size} tokens (the "
                         f"newest token and gamma masks): use gamma <= {draft.block_size - 1}")


class ContextCache:
    """Each draft layer's context keys and values [1, nkv, capacity, d], slot p = committed position p; ``length``
    of them valid. Only target hidden states of committed tokens ever enter it, so it is never rolled back."""

    def __init__(self, draft: DFlashDraft, capacity: int) -> None:
        self.draft = draft
        self.length = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.reserve(capacity)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def reserve(self, capacity: int) -> None:
        """Hold at least ``capacity`` positions (power-of-two buckets; the valid ones are kept)."""
        if self.keys and capacity <= self.capacity:
            return
        attn, size = self.draft.layers[0].self_attn, bucket(capacity)
        keys, values = [], []
        for layer in range(len(self.draft.layers)):
            k = self.draft.fc.weight.new_zeros(1, attn.num_kv_heads, size, attn.head_dim)
            v = torch.zeros_like(k)
            if self.length:
                k[:, :, : self.length] = self.keys[layer][:, :, : self.length]
                v[:, :, : self.length] = self.values[layer][:, :, : self.length]
            keys.append(k)
            values.append(v)
        self.keys, self.values = keys, values

    def extend(self, aux: torch.Tensor) -> None:
        """Positions length..length+T-1 from the target's hidden states aux [T, k * H_target]."""
        t, start = aux.shape[0], self.length
        self.reserve(start + t)
        positions = torch.arange(start, start + t, device=aux.device).view(1, t)
        kv = self.draft.context_kv(aux.to(self.draft.fc.weight.dtype).unsqueeze(0), positions)
        for (k, v), keys, values in zip(kv, self.keys, self.values):
            keys[:, :, start: start + t], values[:, :, start: start + t] = k, v
        self.length += t

    def context(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's valid context keys and values, [1, nkv, length, d] each."""
        return [(k[:, :, : self.length], v[:, :, : self.length]) for k, v in zip(self.keys, self.values)]


class DFlashDrafter:
    """Drafts with a DFlash draft bound to the target (kinds.dflash.model.DFlashDraft.bind_target). ``aux_layers``: the
    target hidden-state ids the loop hands over (``target_features``). ``max_gamma`` (when given) is checked
    against the block size now rather than at the first step."""

    one_pass = True  # the whole block in one forward (decode.loop.auto_gamma costs it per step)

    def __init__(self, draft: DFlashDraft, capacity: int = 0, max_gamma: int | None = None) -> None:
        if max_gamma is not None:
            check_block(draft, max_gamma)
        self.draft = draft
        self.aux_layers = draft.context_layers
        self.capacity = capacity
        self.cache: ContextCache | None = None
        self.features: list[torch.Tensor] = []  # target hidden states [T, k * H] of positions not yet in the cache

    def start(self, prefix: torch.Tensor, target_vocab_size: int) -> None:
        rows = self.draft.shared()[1].weight.shape[0]
        if rows != target_vocab_size:
            raise ValueError(f"the DFlash draft's lm_head has {rows} rows but the target's has {target_vocab_size}: "
                             "bind it to the target it drafts for")
        self.cache = ContextCache(self.draft, max(self.capacity, prefix.shape[1] + 1))
        self.features = []

    def target_features(self, aux: torch.Tensor, tokens: torch.Tensor | None = None) -> None:
        """The target's hidden states [T, k * H] of the next T committed tokens (those it processed last); the
        tokens that follow them are not needed (the block starts from cur)."""
        self.features.append(aux)

    def propose(self, history, cur, gamma, cfg: SamplingConfig, generator: torch.Generator | None):
        assert self.cache is not None, "start() first"
        if gamma == 0:
            return cur.new_empty(0), None
        check_block(self.draft, gamma)
        if self.features:
            self.cache.extend(torch.cat(self.features))
            self.features = []
        m = self.cache.length
        assert not history or len(history) == m + 1, "the committed tokens and the target's hidden states disagree"
        # the block: cur at position M, then gamma mask tokens at M+1..M+gamma
        block = torch.cat([cur.view(1, 1), cur.new_full((1, gamma), self.draft.mask_token_id)], dim=1)
        positions = torch.arange(m, m + gamma + 1, device=cur.device).view(1, -1)
        logits = self.draft.block_logits(block, positions, self.cache.context())[0, 1:]  # [gamma, V]: slots 1..gamma
        if cfg.greedy:
            return logits.argmax(dim=-1), None
        q = probs_from_logits(logits, cfg)  # [gamma, V]: q_j, each slot's own distribution
        return draw(q, cfg, generator), q  # d_j ~ q_j, one draw per slot

    def commit(self, num_accepted: int) -> None:
        """Nothing to roll back: the cache holds committed positions only (module docstring)."""
        assert self.cache is not None


def bound_draft(draft: DFlashDraft, target: torch.nn.Module) -> DFlashDraft:
    """``draft``, bound to the target's embedding and lm_head when it is not yet."""
    if not draft.is_bound:
        draft.bind_target(target)
    return draft
