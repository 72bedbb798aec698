"""A PARD draft as a drafter: a causal LM with its own KV cache that drafts all gamma tokens in ONE forward.

State, after commit: the cache holds the committed tokens x_0..x_{M-1} except those in ``pending`` (accepted drafts
not yet fed); x_M = `cur` arrives with propose.

    propose: feed [pending, cur, m x (gamma - 1)] at positions ..M, M+1..M+gamma-1 (m = the pard token), causally
             -> the logits at cur and at each mask slot: d_1 from cur's row (the ordinary next-token prediction),
             d_{k+1} from mask slot k's row. Greedy: each row's argmax; sampling: each d_j drawn from its own row's
             q_j = softmax(warped logits_j), independently of d_<j (q_j is the distribution d_j was drawn from, all the
             acceptance rule needs: the output stays the target's).
    commit(n): the gamma - 1 mask entries leave the cache; d_1..d_n are committed and become ``pending``.

The round is a parallel draft's (kinds/parallel_drafting.py). This is vLLM's draft_model proposer with
``parallel_drafting`` for one sequence: there the verified tokens, the bonus token and gamma - 1 `pard_token` slots
are one query, and the next step's tokens overwrite the slots' keys.

With a draft vocabulary (``vocab``, kinds/draft_vocab.py) every row is read out over those lm_head rows only
(kinds.standalone.drafter.SubsetHeadLM): d_j = vocab[argmax], and q_j is zero outside the vocabulary.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from decode.loop.cache import CachedLM
from decode.loop.static import StaticLM, cached_lm
from kinds.parallel_drafting import draw_slots, feed_lengths
from kinds.standalone.drafter import readout_lm


class ParallelDrafter:
    """Drafts gamma tokens per forward with a PARD draft (``pard_token`` the mask id in its config). ``vocab``: a
    draft vocabulary [k] (ascending target ids): only those lm_head rows are read out and only those tokens proposed;
    None: all."""

    aux_layers: tuple[int, ...] = ()
    one_pass = True  # one draft forward per step whatever gamma is (decode.loop.auto_gamma costs it so)

    def __init__(self, model: torch.nn.Module, compile: bool = False, capacity: int = 0, max_gamma: int = 8,
                 vocab: torch.Tensor | None = None) -> None:
        self.model = model
        self.vocab = vocab
        self.ids: torch.Tensor | None = None  # the vocabulary on the model's device, once started
        self.mask_token = int(model.config.pard_token)
        self.compile, self.capacity, self.max_gamma = compile, capacity, max_gamma
        self.lm: CachedLM | StaticLM | None = None
        self.pending: list[torch.Tensor] = []  # committed tokens not yet in the cache, each [1, t]
        self.proposed: torch.Tensor | None = None
        self.slots = 0  # mask entries the last propose left in the cache
        self.shared_vocab = self.pad_to = self.embed_size = 0

    def start(self, prefix: torch.Tensor, target_vocab_size: int) -> None:
        room = max(self.capacity, prefix.shape[1] + 1) + 2 * self.max_gamma  # the slots live past the committed end
        lm = readout_lm(self.model, self.vocab, target_vocab_size)
        if self.vocab is not None:
            self.ids = lm.ids
        self.lm = cached_lm(lm, self.compile, "draft", room, feed_lengths(self.max_gamma))
        self.shared_vocab = min(self.lm.vocab_size, target_vocab_size)
        self.pad_to = target_vocab_size
        self.embed_size = self.model.get_input_embeddings().weight.shape[0]
        self.pending, self.slots = [], 0
        if prefix.shape[1] > 0:
            self.lm.forward(prefix.clamp_max(self.embed_size - 1), last_only=True)

    def propose(self, history, cur, gamma, cfg, generator):
        assert self.lm is not None, "start() first"
        if gamma == 0:  # nothing to draft: cur joins the tokens still to be fed
            self.pending.append(cur)
            self.proposed, self.slots = cur.new_empty(0), 0
            return self.proposed, None
        slots = cur.new_full((1, gamma - 1), self.mask_token)
        feed = torch.cat([*self.pending, cur, slots], dim=1).clamp_max(self.embed_size - 1)
        self.pending = []
        logits = self.lm.forward(feed, keep=gamma)[:, : self.shared_vocab]  # rows of cur and the gamma - 1 slots
        self.slots = gamma - 1
        drafted, q = draw_slots(logits, cfg, generator)  # q [gamma, V_shared or |vocab|]: q_j, each row's own
        self.proposed = self.target_ids(drafted)
        if q is None:  # greedy
            return self.proposed, None
        if self.ids is not None:  # q is 0 outside the vocabulary: those tokens are never proposed
            return self.proposed, q.new_zeros(q.shape[0], self.pad_to).index_copy_(1, self.ids, q)
        return self.proposed, F.pad(q, (0, self.pad_to - self.shared_vocab))

    def target_ids(self, drafted: torch.Tensor) -> torch.Tensor:
        """Draft ids as target ids (the same without a draft vocabulary)."""
        return drafted if self.ids is None else self.ids[drafted]

    def commit(self, num_accepted: int) -> None:
        assert self.lm is not None and self.proposed is not None
        if self.slots:
            self.lm.rollback(self.slots)
            self.slots = 0
        if num_accepted:
            self.pending = [self.proposed[:num_accepted].view(1, -1)]
