"""A standalone draft's drafter for our decoder: a small causal LM with its own KV cache, gamma sequential
forwards per step; and the settings that make transformers' assisted generation draft exactly gamma tokens."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from decode.loop.cache import CachedLM
from decode.loop.sampling import draw, probs_from_logits
from decode.loop.static import StaticLM, cached_lm

# transformers' assisted generation reads these from the draft's generation_config (decode.measure.evaluate, the export)
ASSISTED_SETTINGS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


class ModelDrafter:
    """A small causal LM as the draft, with its own KV cache (static, with a compiled 1-token step, when
    ``compile``; ``capacity`` positions are then preallocated)."""

    aux_layers: tuple[int, ...] = ()

    def __init__(self, model: torch.nn.Module, compile: bool = False, capacity: int = 0) -> None:
        self.model = model
        self.compile, self.capacity = compile, capacity
        self.lm: CachedLM | StaticLM | None = None
        self.pending: list[torch.Tensor] = []  # committed tokens not yet in the cache, each [1, 1]
        self.proposed: torch.Tensor | None = None
        self.shared_vocab = 0
        self.pad_to = 0

    def start(self, prefix: torch.Tensor, target_vocab_size: int) -> None:
        self.lm = cached_lm(self.model, self.compile, "draft", max(self.capacity, prefix.shape[1] + 1), (1,))
        # A padded lm_head (Qwen-style 151936 vs 152064) is harmless: both sides work on the shared ids.
        self.shared_vocab = min(self.lm.vocab_size, target_vocab_size)
        self.pad_to = target_vocab_size
        self.embed_size = self.model.get_input_embeddings().weight.shape[0]
        self.pending = []
        if prefix.shape[1] > 0:
            self.lm.forward(prefix.clamp_max(self.embed_size - 1), last_only=True)

    def propose(self, history, cur, gamma, cfg, generator):
        assert self.lm is not None, "start() first"
        if gamma == 0:  # nothing to draft: cur joins the tokens still to be fed
            self.pending.append(cur)
            self.proposed = cur.new_empty(0)
            return self.proposed, None
        # ids beyond the draft's embedding (a target's padded lm_head rows, never real tokens) are clamped: only
        # the draft's proposals can suffer from it, and the target verifies every proposal.
        feed = torch.cat([*self.pending, cur], dim=1).clamp_max(self.embed_size - 1)  # [1, 1 or 2]
        self.pending = []
        if isinstance(self.lm, StaticLM) and feed.shape[1] > 1:  # one compiled shape: pending tokens go in alone
            self.lm.forward(feed[:, :-1], last_only=True)
            feed = feed[:, -1:]
        tokens, rows = [], []
        for _ in range(gamma):
            logits = self.lm.forward(feed, last_only=True)[-1:, : self.shared_vocab]  # [1, V_shared]
            if cfg.greedy:
                token = logits.argmax(dim=-1)
            else:
                q = probs_from_logits(logits, cfg)
                token = draw(q, cfg, generator)
                rows.append(q)
            tokens.append(token)
            feed = token.view(1, 1)
        self.proposed = torch.cat(tokens) if tokens else cur.new_empty(0)
        if cfg.greedy or not rows:
            return self.proposed, None
        q = torch.cat(rows)  # [k, V_shared]
        return self.proposed, F.pad(q, (0, self.pad_to - self.shared_vocab))

    def commit(self, num_accepted: int) -> None:
        assert self.lm is not None and self.proposed is not None
        drafted = self.proposed.numel()
        if drafted == 0:
            return
        # The cache holds cur, d_1..d_{k-1}; keep cur, d_1..d_n.
        if num_accepted < drafted:
            self.lm.rollback(drafted - 1 - num_accepted)
        else:  # every draft token accepted: d_k was never fed to the draft
            self.pending = [self.proposed[-1:].view(1, 1)]




def set_assisted_generation(draft: torch.nn.Module, gamma: int) -> None:
    """Make transformers' assisted generation draft exactly `gamma` tokens per step, as measured.

    A constant schedule with confidence threshold 0 reproduces the measured setting; the defaults (20 tokens,
    'constant', threshold 0.4) would stop drafting early on low-confidence tokens and draft far more than measured.
    """
    draft.generation_config.num_assistant_tokens = gamma
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
