"""Drafters propose up to ``gamma`` tokens per step; the target verifies them.

A drafter keeps whatever state it needs (a KV cache for a model) consistent with the committed sequence:
after ``commit(n)`` its state covers the committed tokens except the newest one, which arrives as ``cur`` in the
next ``propose``.

A drafter that reads the target's hidden states (decode/head_drafter.py, decode/dflash_drafter.py) names their
layers in ``aux_layers``; the target's prefill and verify passes then return them (no second target pass), and the
loop hands over those of the committed tokens with ``target_features`` (after ``start`` and after each ``commit``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F

from decode.cache import CachedLM
from decode.loading import load_causal_lm
from decode.sampling import SamplingConfig, draw, probs_from_logits
from decode.static import StaticLM, cached_lm, session

PROMPT_LOOKUP = "prompt-lookup"  # the --draft value that names prompt lookup
# transformers' assisted generation reads these from the draft's generation_config (decode.evaluate, the export)
ASSISTED_SETTINGS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


class Drafter(Protocol):
    aux_layers: tuple[int, ...]  # target layer ids whose hidden states the drafter reads; () for none

    def start(self, prefix: torch.Tensor, target_vocab_size: int) -> None:
        """Begin a sequence whose committed tokens, all but the newest, are ``prefix`` [1, L]."""

    def propose(
        self, history: list[int], cur: torch.Tensor, gamma: int, cfg: SamplingConfig, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Up to ``gamma`` draft tokens [k] after ``cur`` [1, 1], and their distributions q [k, V_target]
        (None when greedy: q is then the one-hot of each token)."""

    def commit(self, num_accepted: int) -> None:
        """The target kept the first ``num_accepted`` proposed tokens."""

    def target_features(self, aux: torch.Tensor) -> None:
        """(Only with ``aux_layers``.) The target's hidden states [T, len(aux_layers) * H] at ``aux_layers`` of the
        next T committed tokens: the prefix after ``start``; cur, d_1..d_n after ``commit(n)``."""


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


class PromptLookupDrafter:
    """Model-free drafting by n-gram lookup in the context (prompt lookup decoding).

    The longest suffix n-gram (``max_ngram_size`` down to ``min_ngram_size``) of the sequence is searched for
    earlier in the sequence; the tokens that followed its most recent occurrence are proposed. The proposal is
    deterministic, so q is the one-hot of each proposed token. The free baseline every trained draft must beat.
    ``earliest``: take the earliest occurrence instead (what vLLM's ``ngram`` method does; used for parity).
    """

    aux_layers: tuple[int, ...] = ()

    def __init__(self, max_ngram_size: int = 3, min_ngram_size: int = 1, earliest: bool = False) -> None:
        if not 1 <= min_ngram_size <= max_ngram_size:
            raise ValueError(
                f"need 1 <= min_ngram_size <= max_ngram_size, got {min_ngram_size} and {max_ngram_size}")
        self.max_ngram_size = max_ngram_size
        self.min_ngram_size = min_ngram_size
        self.earliest = earliest
        self.vocab_size = 0

    def start(self, prefix: torch.Tensor, target_vocab_size: int) -> None:
        self.vocab_size = target_vocab_size

    def lookup(self, history: list[int], gamma: int) -> list[int]:
        """The tokens that followed the most recent earlier occurrence of the longest matching suffix n-gram."""
        n_tokens = len(history)
        for n in range(min(self.max_ngram_size, n_tokens - 1), self.min_ngram_size - 1, -1):
            suffix = history[-n:]
            starts = range(n_tokens - n - 1, -1, -1)  # most recent occurrence first, excluding the suffix itself
            for start in reversed(starts) if self.earliest else starts:
                if history[start:start + n] == suffix:
                    return history[start + n:start + n + gamma]
        return []

    def propose(self, history, cur, gamma, cfg, generator):
        tokens = torch.tensor(self.lookup(history, gamma), dtype=torch.long, device=cur.device)
        if cfg.greedy or tokens.numel() == 0:
            return tokens, None
        return tokens, F.one_hot(tokens, self.vocab_size).float()

    def commit(self, num_accepted: int) -> None:
        return None


# ---------------------------------------------------------------------------------------------------------------
# The two kinds of draft whose drafters live here (decode.draft_kinds.DraftKind)
# ---------------------------------------------------------------------------------------------------------------

def set_assisted_generation(draft: torch.nn.Module, gamma: int) -> None:
    """Make transformers' assisted generation draft exactly `gamma` tokens per step, as measured.

    A constant schedule with confidence threshold 0 reproduces the measured setting; the defaults (20 tokens,
    'constant', threshold 0.4) would stop drafting early on low-confidence tokens and draft far more than measured.
    """
    draft.generation_config.num_assistant_tokens = gamma
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0


class ModelKind:
    """A standalone causal LM as the draft (a folder or hub id; vLLM's draft_model)."""

    name, vllm_method, has_weights, assisted_refusal = "model", "draft_model", True, None

    def recognises(self, draft: str) -> bool:
        return True  # any folder or hub id that no other kind claims

    def holds(self, draft: object) -> bool:
        return isinstance(draft, (torch.nn.Module, ModelDrafter))

    def fit_problem(self, draft: str, target: str, trust_remote_code: bool = False) -> str | None:
        return None  # the tokenizers are compared instead (decode.vocab)

    def load(self, draft: str, target: torch.nn.Module, device: torch.device, dtype: torch.dtype | str,
             trust_remote_code: bool = False, earliest: bool = False) -> object:
        return load_causal_lm(draft, device, dtype, trust_remote_code)

    def drafter(self, draft: object, target: torch.nn.Module, compile: bool = False, capacity: int = 0,
                max_gamma: int = 8) -> Drafter:
        return draft if isinstance(draft, ModelDrafter) else ModelDrafter(draft, compile=compile, capacity=capacity)

    def reserve(self, draft: object, target: torch.nn.Module, capacity: int, max_gamma: int) -> None:
        session(draft, "draft").reserve(capacity)

    def assisted_generate(self, target: torch.nn.Module, draft: object, prompt: torch.Tensor, gamma: int,
                          **generate_kwargs) -> torch.Tensor:
        # transformers 5 reads the draft length from the assistant's generation_config (generate() kwargs are
        # ignored); the caller's settings are put back afterwards
        gc = draft.generation_config
        saved = {name: getattr(gc, name) for name in ASSISTED_SETTINGS}
        set_assisted_generation(draft, gamma)
        try:
            return target.generate(prompt, assistant_model=draft, **generate_kwargs)
        finally:
            for name, value in saved.items():
                setattr(gc, name, value)

    def save(self, draft: object, folder: str | Path, gamma: int) -> None:
        """A standard model folder (safetensors, config, generation config drafting `gamma` tokens)."""
        set_assisted_generation(draft, gamma)
        draft.save_pretrained(folder, safe_serialization=True)


class PromptLookupKind:
    """Prompt lookup: no model, n-grams of the context (--draft prompt-lookup; vLLM's ngram)."""

    name, vllm_method, has_weights, assisted_refusal = "prompt_lookup", "ngram", False, None

    def recognises(self, draft: str) -> bool:
        return draft == PROMPT_LOOKUP

    def holds(self, draft: object) -> bool:
        return isinstance(draft, PromptLookupDrafter)

    def fit_problem(self, draft: str, target: str, trust_remote_code: bool = False) -> str | None:
        return None

    def load(self, draft: str, target: torch.nn.Module, device: torch.device, dtype: torch.dtype | str,
             trust_remote_code: bool = False, earliest: bool = False) -> object:
        return PromptLookupDrafter(earliest=earliest)

    def drafter(self, draft: object, target: torch.nn.Module, compile: bool = False, capacity: int = 0,
                max_gamma: int = 8) -> Drafter:
        return draft

    def reserve(self, draft: object, target: torch.nn.Module, capacity: int, max_gamma: int) -> None:
        return None  # no model, no cache

    def assisted_generate(self, target: torch.nn.Module, draft: object, prompt: torch.Tensor, gamma: int,
                          **generate_kwargs) -> torch.Tensor:
        return target.generate(prompt, prompt_lookup_num_tokens=gamma, max_matching_ngram_size=draft.max_ngram_size,
                               **generate_kwargs)

    def save(self, draft: object, folder: str | Path, gamma: int) -> None:
        raise ValueError("prompt lookup has no weights: there is no folder to export")


MODEL_KIND, PROMPT_LOOKUP_KIND = ModelKind(), PromptLookupKind()
