"""A P-EAGLE head as a drafter: an EAGLE-3 head that drafts all gamma tokens in ONE pass (kinds/eagle3/drafter.py has
the head's cache and the state it keeps).

    propose: positions P..M-1 = (x_{p+1}, fc(h_p)), the target-feature positions not yet in the cache, then gamma - 1
             mask slots (m, fc(mask_hidden)) at positions M..M+gamma-2, in one causal pass -> d_1 from position
             M-1's output, d_{k+1} from mask slot k's. Greedy: each row's argmax; sampling: each d_j drawn from its
             own row's q_j, independently of d_<j (q_j is what d_j was drawn from: the output stays the target's).
    commit:  the gamma - 1 mask slots leave the head's cache; the loop then hands over h of cur, d_1..d_n.

This is vLLM's eagle3 proposer with ``parallel_drafting`` for one sequence: there the shifted verified tokens, the
bonus token and gamma - 1 `ptd_token_id` slots (whose hidden state is combine_hidden_states(mask_hidden)) are one
query, and the next step's tokens overwrite the slots' keys.
"""
from __future__ import annotations

import torch

from kinds.eagle3.drafter import HeadCache, HeadDrafter, head_cache
from kinds.eagle3.model import Eagle3Head, parallel_token
from kinds.parallel_drafting import draw_slots, feed_lengths


class ParallelHeadDrafter(HeadDrafter):
    """Drafts gamma tokens per head pass with a P-EAGLE head (config.ptd_token_id, mask_hidden)."""

    one_pass = True  # one head pass per step whatever gamma is (decode.loop.auto_gamma costs it so)

    def __init__(self, head: Eagle3Head, compile: bool = False, capacity: int = 0, max_gamma: int = 8) -> None:
        super().__init__(head, compile=compile, capacity=capacity, max_gamma=max_gamma)
        self.mask_token = parallel_token(head.config)

    def new_cache(self, capacity: int) -> HeadCache:
        """The head's cache with room for the mask slots past the committed end; compiled, one step per feed length
        (the accepted drafts' features, cur's and gamma - 1 slots: gamma..2 * gamma positions)."""
        return head_cache(self.head, capacity + self.max_gamma, self.compile, self.max_gamma,
                          feed_lengths(self.max_gamma))

    def propose(self, history, cur, gamma, cfg, generator):
        assert self.cache is not None, "start() first"
        positions = self.pending_positions() if gamma else None
        if positions is None:  # nothing to draft, or no target feature yet
            self.drafted = 0
            return cur.new_empty(0), None
        tokens, fused = positions  # positions P..M-1 (x_{P+1}..x_M with fc(h_P)..fc(h_{M-1})); then the mask slots
        slots = gamma - 1
        tokens = torch.cat([tokens, tokens.new_full((1, slots), self.mask_token)], dim=1)  # [1, T + slots]
        hidden = torch.cat([fused, self.head.mask_input().expand(slots, -1)]).unsqueeze(0)  # [1, T + slots, H]
        logits, _ = self.cache.step(tokens, hidden)
        self.drafted = slots
        logits = self.target_logits(logits[-gamma:])  # [gamma, V]: d_1 from position M-1, d_{k+1} from slot k
        return draw_slots(logits, cfg, generator)  # q_j: each row's own distribution (zero outside the draft vocab)
