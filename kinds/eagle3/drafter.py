"""The EAGLE-3 head as a drafter: it reads the target's own hidden states, which the verify pass returns.

State, after the target has processed x_0..x_{M-1} (features h_0..h_{M-1}) and x_M = `cur` is the newest token:
the head's KV cache holds positions 0..P-1, all computed from TARGET features; `features` holds h_P..h_{M-1}.

    propose: positions P..M-1 = (x_{p+1}, fc(h_p)) in one pass -> the last output gives d_1      (P := M)
             position M + j = (d_{j+1}, prenorm output of position M + j - 1) -> d_{j+2}         (own features)
    commit:  the drafted positions M.. are dropped from the head's cache (recomputed next time from the target's
             features of the accepted tokens, as vLLM does); the loop then hands over h of cur, d_1..d_n.

Position p attends to positions <= p, and its rope position is p (kinds/eagle3/model.py has the head's maths).
q (sampling) is the head's distribution over its draft vocabulary scattered into the target's: zero outside it.
"""
from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F

from decode.loop.sampling import SamplingConfig, draw, probs_from_logits
from decode.loop.static import bucket, compile_options, register
from kinds.eagle3.model import Eagle3Head


class HeadCache:
    """The head's keys and values [N, 1, nkv, capacity, d] (one cache per decoder layer), one slot per head position
    (slot p = position p), and its step. ``length`` positions are valid; rollback moves it back (later slots are
    stale: a query at position p attends to slots <= p only, and the next step overwrites them).

    ``compile``: steps of ``lengths`` tokens run torch.compiled (decode.loop.static's backend and options) on fixed
    buffers; a step of fewer tokens is padded up to the next compiled length (the padding writes stale slots past
    the valid ones, its outputs are dropped); a longer one (a prefill) runs eagerly on the same buffers. A step that
    fails to compile falls back to eager, with a RuntimeWarning naming why."""

    def __init__(self, head: Eagle3Head, capacity: int, compile: bool = False,
                 lengths: tuple[int, ...] = ()) -> None:
        self.head_ref = weakref.ref(head)  # weak: the registry must not keep the head alive
        self.length = 0
        self.k = self.v = torch.empty(0)
        self.compile, self.lengths = compile, tuple(sorted(set(lengths)))
        self.steps: dict[int, Callable] = {}
        self.compile_seconds = 0.0
        self.reserve(capacity)

    def reserve(self, capacity: int) -> None:
        """Hold at least ``capacity`` positions plus a padded step's overhang (valid ones are kept; new buffers
        recompile the steps)."""
        capacity += max(self.lengths, default=0)
        if self.k.numel() and capacity <= self.capacity:
            return
        head, attn = self.head, self.head.midlayer.self_attn
        k = head.fc.weight.new_zeros(head.num_layers, 1, attn.num_kv_heads, bucket(capacity), attn.head_dim)
        v = torch.zeros_like(k)
        if self.length:
            valid = slice(0, self.length)
            k[..., valid, :], v[..., valid, :] = self.k[..., valid, :], self.v[..., valid, :]
        self.k, self.v, self.steps = k, v, {}

    @property
    def head(self) -> Eagle3Head:
        return self.head_ref()

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The head at ``positions`` [1, T] (= their slots) for tokens [1, T] read with hidden [1, T, H]: writes
        their keys and values into each layer's cache, attends over the whole buffer (slots <= each position); (draft
        logits [T, V_draft], prenorm [T, H])."""
        slots = torch.arange(self.capacity, device=tokens.device)
        mask = (slots.view(1, -1) <= positions.view(-1, 1)).view(1, 1, tokens.shape[1], -1)  # [1, 1, T, C]

        def attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.k[layer].index_copy_(2, positions[0], k)
            self.v[layer].index_copy_(2, positions[0], v)
            return self.head.attend(q, self.k[layer], self.v[layer], mask, layer)

        normed, prenorm = self.head.run(tokens, hidden, positions, attention)
        return self.head.logits(normed)[0], prenorm[0]

    def step(self, tokens: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions length..length+T-1 of tokens [1, T] read with hidden [1, T, H]: (draft logits [T, V_draft],
        prenorm [T, H]); their keys and values join the cache."""
        t, start = tokens.shape[1], self.length
        self.reserve(start + t)
        padded = next((n for n in self.lengths if n >= t), None) if self.compile else None
        if padded is None:
            positions = torch.arange(start, start + t, device=tokens.device).view(1, t)
            outputs = self.forward(tokens, hidden, positions)
        else:  # pad by repeating the last token: its slots lie past the valid ones
            tokens = torch.cat([tokens, tokens[:, -1:].expand(1, padded - t)], dim=1)
            hidden = torch.cat([hidden, hidden[:, -1:].expand(1, padded - t, -1)], dim=1)
            positions = torch.arange(start, start + padded, device=tokens.device).view(1, padded)
            logits, prenorm = self.compiled(padded)(tokens, hidden, positions)
            outputs = logits[:t], prenorm[:t]
        self.length += t
        return outputs

    def compiled(self, length: int) -> Callable:
        """The compiled step for ``length`` tokens (compiled on first use, its time added to compile_seconds)."""
        if length in self.steps:
            return self.steps[length]
        device = self.k.device
        # the compiling call writes the last slots, past any valid position (reserve keeps that overhang free)
        inputs = (torch.zeros(1, length, dtype=torch.long, device=device),
                  self.k.new_zeros(1, length, self.head.config.hidden_size),
                  torch.arange(self.capacity - length, self.capacity, device=device).view(1, length))
        for buffer in (*inputs, self.k, self.v):
            torch._dynamo.mark_static_address(buffer)
        function = torch.compile(self.forward, **compile_options(device))

        def run(*args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            for buffer, value in zip(inputs, args):
                buffer.copy_(value)
            logits, prenorm = function(*inputs)
            return (logits.clone(), prenorm.clone()) if device.type == "cuda" else (logits, prenorm)

        started = time.perf_counter()
        try:
            run(*inputs)
            self.steps[length] = run
        except Exception as err:  # noqa: BLE001 - any compiler failure means: draft eagerly
            reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
            warnings.warn(f"torch.compile failed for the EAGLE-3 head ({type(err).__name__}: {reason}); drafting "
                          "with it eagerly (the target stays compiled)", RuntimeWarning, stacklevel=2)
            self.steps[length] = self.forward
        self.compile_seconds += time.perf_counter() - started
        return self.steps[length]

    def precompile(self) -> None:
        """Compile every step now, so that no compilation happens mid-generation."""
        for length in self.lengths:
            self.compiled(length)

    def rollback(self, num_positions: int) -> None:
        if num_positions < 0 or num_positions > self.length:
            raise ValueError(f"cannot roll back {num_positions} positions from a head cache of {self.length}")
        self.length -= num_positions


def bound_head(head: Eagle3Head, target: torch.nn.Module) -> Eagle3Head:
    """``head``, bound to the target's input embedding when it has none yet."""
    if not head.has_embeddings:
        head.bind_embeddings(target.get_input_embeddings())
    return head


def head_cache(head: Eagle3Head, capacity: int, compile: bool, max_gamma: int,
               lengths: tuple[int, ...] | None = None) -> HeadCache:
    """An empty head cache for one generation: eager, a new one; compiled, the registry's (decode.loop.static) for this
    head, whose compiled steps (`lengths`; default 1 and max_gamma + 1 tokens) are reused across generations."""
    lengths = lengths or (1, max_gamma + 1)
    if not compile:
        return HeadCache(head, capacity)
    cache = register(head, "head", lambda: HeadCache(head, capacity, True, lengths))
    if not set(lengths) <= set(cache.lengths):
        cache.lengths = tuple(sorted({*cache.lengths, *lengths}))
    cache.reserve(capacity)
    cache.precompile()
    cache.length = 0
    return cache


class HeadDrafter:
    """Drafts with an EAGLE-3 head (kinds.eagle3.model.Eagle3Head bound to the target's input embedding).
    ``aux_layers``: the target layers whose hidden states the loop hands over (``target_features``)."""

    def __init__(self, head: Eagle3Head, compile: bool = False, capacity: int = 0, max_gamma: int = 8) -> None:
        self.head = head
        self.aux_layers = tuple(head.aux_layers)
        self.compile, self.capacity, self.max_gamma = compile, capacity, max_gamma
        self.cache: HeadCache | None = None
        self.features: list[torch.Tensor] = []  # target features [T, k * H] of positions not yet in the cache
        self.next_tokens: list[torch.Tensor] = []  # [T] the committed token after each of those positions
        self.drafted = 0                         # head positions of the last proposal beyond the target's
        self.vocab_size = 0

    def start(self, prefix: torch.Tensor, target_vocab_size: int) -> None:
        head_vocab = self.head.config.vocab_size
        if head_vocab > target_vocab_size:
            raise ValueError(f"the head's vocab_size {head_vocab} exceeds the target's {target_vocab_size} rows")
        self.vocab_size = target_vocab_size
        self.cache = self.new_cache(max(self.capacity, prefix.shape[1] + 1))
        self.features, self.next_tokens, self.drafted = [], [], 0

    def new_cache(self, capacity: int) -> HeadCache:
        """The head's empty cache for one generation of up to ``capacity`` committed positions."""
        return head_cache(self.head, capacity, self.compile, self.max_gamma)

    def target_features(self, aux: torch.Tensor, tokens: torch.Tensor) -> None:
        """The target's aux hidden states [T, k * H] of the next T committed tokens (those it processed last), and
        ``tokens`` [T], the committed token after each (position p reads x_{p+1} with h_p), on the device."""
        self.features.append(aux)
        self.next_tokens.append(tokens)

    def target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [1, V_draft] -> target-vocabulary logits [1, V] (-inf outside the draft vocab)."""
        logits = self.head.to_target_vocab(draft_logits)
        if logits.shape[-1] < self.vocab_size:  # a target lm_head padded past the tokenizer: never proposed
            logits = F.pad(logits, (0, self.vocab_size - logits.shape[-1]), value=float("-inf"))
        return logits

    def pending_positions(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The target-feature positions P..M-1 the cache has not seen: their tokens x_{P+1}..x_M [1, T] (x_M = cur)
        and fused features fc(h_P)..fc(h_{M-1}) [T, H], taken (features cleared); None without any. All on the
        device: nothing is read back to the host."""
        if not self.features:  # no target feature yet (a one-token prompt)
            return None
        pending, tokens = torch.cat(self.features), torch.cat(self.next_tokens)  # [T, k * H], [T]
        assert pending.shape[0] == tokens.shape[0], "the target's features and their tokens disagree"
        self.features, self.next_tokens = [], []
        return tokens.view(1, -1), self.head.fuse(pending.to(self.head.fc.weight.dtype))

    def propose(self, history, cur, gamma, cfg, generator):
        assert self.cache is not None, "start() first"
        positions = self.pending_positions() if gamma else None
        if positions is None:  # nothing to draft, or no target feature yet
            self.drafted = 0
            return cur.new_empty(0), None
        tokens, hidden = positions
        logits, prenorm = self.cache.step(tokens, hidden.unsqueeze(0))
        drafts, rows = [], []
        for j in range(gamma):
            token, q = self.choose(logits[-1:], cfg, generator)
            drafts.append(token)
            rows.append(q)
            if j + 1 < gamma:  # the next position reads the drafted token and this position's own output
                logits, prenorm = self.cache.step(token.view(1, 1), prenorm[-1:].unsqueeze(0))
        self.drafted = gamma - 1
        proposed = torch.cat(drafts)
        return proposed, None if cfg.greedy else torch.cat(rows)

    def choose(self, draft_logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A draft token [1] (target id) from logits [1, V_draft], and q [1, V] when sampling."""
        logits = self.target_logits(draft_logits)  # [1, V]
        if cfg.greedy:
            return logits.argmax(dim=-1), None
        q = probs_from_logits(logits, cfg)  # zero outside the draft vocabulary
        return draw(q, cfg, generator), q

    def commit(self, num_accepted: int) -> None:
        """Drop the drafted positions: the head's cache keeps target-feature positions only."""
        assert self.cache is not None
        self.cache.rollback(self.drafted)
        self.drafted = 0
