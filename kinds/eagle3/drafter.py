"""The EAGLE-3 head as a drafter: it reads the target's own hidden states, which the verify pass returns.

State, after the target has processed x_0..x_{M-1} (features h_0..h_{M-1}) and x_M = `cur` is the newest token:
the head's KV cache holds positions 0..P-1, all computed from TARGET features; `features` holds h_P..h_{M-1}.

    propose: positions P..M-1 = (x_{p+1}, fc(h_p)) in one pass -> the last output gives d_1      (P := M)
             position M + j = (d_{j+1}, prenorm output of position M + j - 1) -> d_{j+2}         (own features)
    commit:  the drafted positions M.. are dropped from the head's cache (recomputed next time from the target's
             features of the accepted tokens, as vLLM does); the loop then hands over h of cur, d_1..d_n.

Compiled on a GPU, a greedy round at the drafter's max_gamma is ONE compiled call (HeadCache.chain: the pass over
P..M-1, padded to gamma + 1 positions, and the gamma - 1 positions after it; one CUDA graph with reduce-overhead).

Position p attends to positions <= p, and its rope position is p (kinds/eagle3/model.py has the head's maths).
q (sampling) is the head's distribution over its draft vocabulary scattered into the target's: zero outside it.
"""
from __future__ import annotations

import functools
import time
import warnings
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_map

from decode.loop.sampling import SamplingConfig, draw, probs_from_logits
from decode.loop.static import bucket, compile_options, register
from kinds.eagle3.model import Eagle3Head


class HeadCache:
    """The head's keys and values [N, 1, nkv, capacity, d] (one cache per decoder layer), one slot per head position
    (slot p = position p), and its step. ``length`` positions are valid; rollback moves it back (later slots are
    stale: a query at position p attends to slots <= p only, and the next step overwrites them).

    ``compile``: steps of ``lengths`` tokens run torch.compiled (decode.loop.static's backend and options) on fixed
    buffers; a step of fewer tokens is padded up to the next compiled length (the padding writes stale slots past
    the valid ones, its outputs are dropped); a longer one (a prefill) runs eagerly on the same buffers. A greedy
    round of ``chain_steps`` drafts runs as ONE compiled call (``chain``: the first pass and every later step, as
    SGLang captures its multi-step draft in one CUDA graph). A step that fails to compile falls back to eager, with a
    RuntimeWarning naming why."""

    def __init__(self, head: Eagle3Head, capacity: int, compile: bool = False,
                 lengths: tuple[int, ...] = ()) -> None:
        self.head_ref = weakref.ref(head)  # weak: the registry must not keep the head alive
        self.length = 0
        self.k = self.v = torch.empty(0)
        self.compile, self.lengths = compile, tuple(sorted(set(lengths)))
        self.chain_steps: set[int] = set()  # gammas whose greedy round is one compiled call (precompile_chain)
        self.asked = 0  # the most positions reserve was asked for (the overhang comes on top)
        self.steps: dict[int | tuple[str, int], Callable | None] = {}
        self.compile_seconds = 0.0
        self.reserve(capacity)

    def reserve(self, capacity: int) -> None:
        """Hold at least ``capacity`` positions plus a padded step's overhang (valid ones are kept; new buffers
        recompile the steps)."""
        self.asked = max(self.asked, capacity)
        capacity += max([*self.lengths, *(steps + 1 for steps in self.chain_steps)], default=0)
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

    def layers(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's layers at ``positions`` [1, T] (= their slots) for tokens [1, T] read with hidden [1, T, H]:
        writes their keys and values into each layer's cache, attends over the whole buffer (slots <= each
        position); (normed [T, H], prenorm [T, H])."""
        slots = torch.arange(self.capacity, device=tokens.device)
        mask = (slots.view(1, -1) <= positions.view(-1, 1)).view(1, 1, tokens.shape[1], -1)  # [1, 1, T, C]

        def attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.k[layer].index_copy_(2, positions[0], k)
            self.v[layer].index_copy_(2, positions[0], v)
            return self.head.attend(q, self.k[layer], self.v[layer], mask, layer)

        normed, prenorm = self.head.run(tokens, hidden, positions, attention)
        return normed[0], prenorm[0]

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``layers``, then the lm_head: (draft logits [T, V_draft], prenorm [T, H])."""
        normed, prenorm = self.layers(tokens, hidden, positions)
        return self.head.logits(normed), prenorm

    def greedy_chain(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, last: torch.Tensor,
                     steps: int) -> torch.Tensor:
        """A greedy round of ``steps`` drafts: the pass over tokens [1, L] at ``positions`` [1, L] whose row
        ``last`` [1] is the newest valid one gives d_1; then position p + 1 reads (d_j, position p's prenorm) and
        gives d_{j+1}. Returns d_1..d_steps [steps] (target ids: the argmax of HeadDrafter.target_logits)."""
        normed, prenorm = self.layers(tokens, hidden, positions)
        normed, prenorm = normed.index_select(0, last), prenorm.index_select(0, last)  # [1, H] each
        position = positions.index_select(1, last)  # [1, 1]
        picked = [self.head.to_target_vocab(self.head.logits(normed)).argmax(-1)]  # [1]
        for _ in range(steps - 1):
            position = position + 1
            normed, prenorm = self.layers(picked[-1].view(1, 1), prenorm.unsqueeze(0), position)
            picked.append(self.head.to_target_vocab(self.head.logits(normed)).argmax(-1))
        return torch.cat(picked)

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

    def chain(self, tokens: torch.Tensor, hidden: torch.Tensor, steps: int) -> torch.Tensor | None:
        """A greedy round as one compiled call (``greedy_chain``): positions length..length+T-1 of tokens [1, T]
        read with hidden [1, T, H], padded to steps + 1 tokens, then steps - 1 drafted positions; returns the
        ``steps`` drafts [steps] (their keys and values join the cache: length += T + steps - 1). None, with nothing
        done, where no chain of ``steps`` was asked for (precompile_chain), T > steps + 1, or its compilation
        failed."""
        t, start, length = tokens.shape[1], self.length, steps + 1
        if steps not in self.chain_steps or t > length:
            return None
        self.reserve(start + t + steps)
        run = self.compiled_chain(steps)
        if run is None:
            return None
        pad = length - t  # the last token repeated: its slots lie past the valid ones, the drafts overwrite them
        tokens = torch.cat([tokens, tokens[:, -1:].expand(1, pad)], dim=1)
        hidden = torch.cat([hidden, hidden[:, -1:].expand(1, pad, -1)], dim=1)
        rows = torch.arange(length, device=tokens.device)
        drafts = run(tokens, hidden, (rows + start).view(1, length), rows[t - 1:t])  # row t - 1: the newest valid one
        self.length += t + steps - 1
        return drafts

    def compiled(self, length: int) -> Callable:
        """The compiled step for ``length`` tokens (compiled on first use, its time added to compile_seconds)."""
        if length not in self.steps:
            self.steps[length] = self.compile_call(self.forward, self.step_inputs(length)) or self.forward
        return self.steps[length]

    def compiled_chain(self, steps: int) -> Callable | None:
        """The compiled greedy round of ``steps`` drafts (compiled on first use); None when it fails to compile."""
        key = ("chain", steps)
        if key not in self.steps:
            inputs = (*self.step_inputs(steps + 1), torch.zeros(1, dtype=torch.long, device=self.k.device))
            self.steps[key] = self.compile_call(functools.partial(self.greedy_chain, steps=steps), inputs)
        return self.steps[key]

    def step_inputs(self, length: int) -> tuple[torch.Tensor, ...]:
        """Input buffers of a compiled call over ``length`` tokens: tokens, hidden and positions, the positions the
        last slots (the compiling call writes there, past any valid position: reserve keeps that overhang free)."""
        device = self.k.device
        return (torch.zeros(1, length, dtype=torch.long, device=device),
                self.k.new_zeros(1, length, self.head.config.hidden_size),
                torch.arange(self.capacity - length, self.capacity, device=device).view(1, length))

    def compile_call(self, function: Callable, inputs: tuple[torch.Tensor, ...]) -> Callable | None:
        """``function`` compiled on the fixed buffers ``inputs`` (each call copies its arguments into them) and run
        once (its time added to compile_seconds); None, with a RuntimeWarning naming why, when compiling fails."""
        device = self.k.device
        for buffer in (*inputs, self.k, self.v):
            torch._dynamo.mark_static_address(buffer)
        compiled = torch.compile(function, **compile_options(device))

        def run(*args: torch.Tensor):
            for buffer, value in zip(inputs, args):
                buffer.copy_(value)
            outputs = compiled(*inputs)
            # CUDA graphs reuse their output buffers: copy the outputs out
            return tree_map(torch.clone, outputs) if device.type == "cuda" else outputs

        started = time.perf_counter()
        try:
            run(*inputs)
            return run
        except Exception as err:  # noqa: BLE001 - any compiler failure means: draft eagerly
            reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
            warnings.warn(f"torch.compile failed for the EAGLE-3 head ({type(err).__name__}: {reason}); drafting "
                          "with it eagerly (the target stays compiled)", RuntimeWarning, stacklevel=2)
            return None
        finally:
            self.compile_seconds += time.perf_counter() - started

    def precompile(self) -> None:
        """Compile every step and chain now, so that no compilation happens mid-generation."""
        for length in self.lengths:
            self.compiled(length)
        for steps in sorted(self.chain_steps):
            self.compiled_chain(steps)

    def precompile_chain(self, steps: int) -> None:
        """Run greedy rounds of ``steps`` drafts as one compiled call from now on (compiled here)."""
        if steps > 1 and steps not in self.chain_steps:
            self.chain_steps.add(steps)
            self.reserve(self.asked)  # room for the chain's padded first pass past the valid slots
            self.compiled_chain(steps)

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
    ``aux_layers``: the target layers whose hidden states the loop hands over (``target_features``).

    ``chained``: compiled greedy rounds at max_gamma run as one call (HeadCache.chain); None = on a GPU, where each
    head step is a graph launch the chain saves. On a CPU the compiled head step is cheap and the chain is not: on
    SmolLM2's head it took the draft cost from 0.077 to 0.070 plain steps at gamma 4 for 85 s more compilation."""

    chained: bool | None = None

    def __init__(self, head: Eagle3Head, compile: bool = False, capacity: int = 0, max_gamma: int = 8) -> None:
        self.head = head
        self.aux_layers = tuple(head.aux_layers)
        self.compile, self.capacity, self.max_gamma = compile, capacity, max_gamma
        self.cache: HeadCache | None = None
        self.features: list[torch.Tensor] = []  # target features [T, k * H] of positions not yet in the cache
        self.next_tokens: list[torch.Tensor] = []  # [T] the committed token after each of those positions
        self.drafted = 0                         # head positions of the last proposal beyond the target's
        self.chain_rounds = False                # greedy rounds at max_gamma as one compiled call (new_cache)
        self.vocab_size = 0

    def start(self, prefix: torch.Tensor, target_vocab_size: int) -> None:
        head_vocab = self.head.config.vocab_size
        if head_vocab > target_vocab_size:
            raise ValueError(f"the head's vocab_size {head_vocab} exceeds the target's {target_vocab_size} rows")
        self.vocab_size = target_vocab_size
        self.cache = self.new_cache(max(self.capacity, prefix.shape[1] + 1))
        self.features, self.next_tokens, self.drafted = [], [], 0

    def new_cache(self, capacity: int) -> HeadCache:
        """The head's empty cache for one generation of up to ``capacity`` committed positions; compiled and
        ``chained``, with greedy rounds of max_gamma drafts as one call."""
        cache = head_cache(self.head, capacity, self.compile, self.max_gamma)
        chained = self.chained if self.chained is not None else self.head.fc.weight.device.type == "cuda"
        self.chain_rounds = self.compile and chained and self.max_gamma > 1
        if self.chain_rounds:
            cache.precompile_chain(self.max_gamma)
        return cache

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
        self.drafted = gamma - 1
        if cfg.greedy and self.chain_rounds and gamma == self.max_gamma:  # the whole round in one compiled call
            chained = self.cache.chain(tokens, hidden.unsqueeze(0), gamma)
            if chained is not None:
                return chained, None
        logits, prenorm = self.cache.step(tokens, hidden.unsqueeze(0))
        drafts, rows = [], []
        for j in range(gamma):
            token, q = self.choose(logits[-1:], cfg, generator)
            drafts.append(token)
            rows.append(q)
            if j + 1 < gamma:  # the next position reads the drafted token and this position's own output
                logits, prenorm = self.cache.step(token.view(1, 1), prenorm[-1:].unsqueeze(0))
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
