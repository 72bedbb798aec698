"""Prompt lookup's drafter: n-grams of the context, no model (the free baseline every trained draft must beat)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


class PromptLookupDrafter:
    """Model-free drafting by n-gram lookup in the context (prompt lookup decoding).

    The longest suffix n-gram (``max_ngram_size`` down to ``min_ngram_size``) of the sequence is searched for
    earlier in the sequence; the tokens that followed its most recent occurrence are proposed. The proposal is
    deterministic, so q is the one-hot of each proposed token. The free baseline every trained draft must beat.
    ``earliest``: take the earliest occurrence instead (what vLLM's ``ngram`` method does; used for parity).
    """

    aux_layers: tuple[int, ...] = ()
    host_history = True  # the n-gram search runs on the committed ids, on the host (decode.loop.drafters)

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
