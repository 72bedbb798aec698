"""A causal LM with its own KV cache: forward new tokens, roll back rejected ones. Nothing is ever re-prefilled.

The eager cache is indexed by position (as gpt-fast's and vLLM's are): each attention layer's keys and values live in
one buffer allocated for the whole generation, a forward writes its T new entries at [length, length + T) and
attends to the view [0, length + T), and a rollback moves ``length`` back: nothing is copied or freed, and the
rejected entries are overwritten by the next forward. (transformers' DynamicCache instead concatenates the whole
cache at every forward, a copy of every key and value per token, and crops by slicing.)
"""
from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from decode.inputs.vocab import lm_head_rows


def aux_hidden(hidden_states: tuple[torch.Tensor, ...], layers: tuple[int, ...]) -> torch.Tensor:
    """The residual streams entering decoder layers ``layers`` (``hidden_states[i]`` of a transformers forward with
    output_hidden_states), concatenated: [1, T, H] each -> [T, len(layers) * H]."""
    return torch.cat([hidden_states[i][0] for i in layers], dim=-1)


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword ``model.forward`` takes its KV cache by: ``cache`` from transformers 5.24 on, ``past_key_values``
    before (5.24 still accepts the old name, with a FutureWarning; 5.40 removes it). Asked of the model itself, so a
    remote-code model on either convention works; a peft or compiled wrapper is looked through."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base = getattr(base, "_orig_mod", base)  # torch.compile's OptimizedModule
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def returned_cache(out) -> object:
    """The KV cache a forward returned (``out.cache`` from transformers 5.24 on, ``out.past_key_values`` before)."""
    return out["cache"] if "cache" in out else out["past_key_values"]


class PositionLayer(DynamicLayer):
    """One attention layer's keys and values in buffers [B, H, capacity, D] indexed by position; the first ``length``
    entries are valid. ``keys`` / ``values`` are always the valid views [B, H, length, D] (what transformers reads)."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity, self.length = max(int(capacity), 1), 0
        self.key_buffer = self.value_buffer = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.key_buffer = key_states.new_zeros(*key_states.shape[:2], self.capacity, key_states.shape[-1])
        self.value_buffer = value_states.new_zeros(*value_states.shape[:2], self.capacity, value_states.shape[-1])
        self.is_initialized = True
        self.set_length(0)

    def set_length(self, length: int) -> None:
        self.length = length
        self.keys, self.values = self.key_buffer[:, :, :length], self.value_buffer[:, :, :length]

    def grow(self, needed: int) -> None:
        """Buffers of at least ``needed`` positions (doubling; the valid entries are kept)."""
        while self.capacity < needed:
            self.capacity *= 2
        keys, values = self.key_buffer, self.value_buffer
        self.key_buffer = keys.new_zeros(*keys.shape[:2], self.capacity, keys.shape[-1])
        self.value_buffer = values.new_zeros(*values.shape[:2], self.capacity, values.shape[-1])
        self.key_buffer[:, :, : self.length] = keys[:, :, : self.length]
        self.value_buffer[:, :, : self.length] = values[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the T new entries at positions [length, length + T); the valid views [B, H, length + T, D]."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.capacity:
            self.grow(end)
        self.key_buffer[:, :, start:end] = key_states
        self.value_buffer[:, :, start:end] = value_states
        self.set_length(end)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last ``-tokens_to_remove`` entries (transformers' negative convention): the length moves back."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes minus the number of tokens to remove, got {tokens_to_remove}")
        if tokens_to_remove and self.is_initialized:
            self.set_length(self.length + tokens_to_remove)

    def reset(self) -> None:
        if self.is_initialized:
            self.set_length(0)


def position_cache(config: object, capacity: int) -> DynamicCache:
    """A DynamicCache whose full-attention layers are PositionLayers of ``capacity`` positions (they grow when a
    generation outruns it); other layer types (sliding-window, linear attention) keep transformers' own."""
    cache = DynamicCache(config=config)
    cache.layers = [PositionLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def takes_own_mask(model: torch.nn.Module, cache: DynamicCache) -> bool:
    """Whether a forward of ``model`` on ``cache`` can be handed a 4-D boolean causal mask as is: every layer is a
    full-attention PositionLayer, attention runs through SDPA or eager (flash-attention kernels take no such mask)
    and ``forward`` takes ``attention_mask``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base = getattr(base, "_orig_mod", base)
    implementation = getattr(getattr(base, "config", None), "_attn_implementation", None)
    return (all(isinstance(layer, PositionLayer) for layer in cache.layers) and implementation in ("sdpa", "eager")
            and "attention_mask" in inspect.signature(base.forward).parameters)


class CachedLM:
    """Wraps a ``transformers`` causal LM and the KV cache of one sequence (batch size 1), indexed by position
    (``position_cache``; ``capacity`` positions allocated at the first forward, doubled if outrun).

    ``length`` is the number of tokens whose keys/values are in the cache. With ``aux_layers`` (a hidden-state
    drafter's layer ids), every forward also leaves ``aux`` [T, len(aux_layers) * H]: those layers' hidden states
    of the T tokens it processed, from the same pass.

    A forward of several tokens over full-attention layers (a verify pass, a drafter's catch-up) is handed its causal
    mask (``causal_mask``: one comparison of positions) instead of having transformers build one from the cache:
    that mask machinery costs a few tenths of a small model's 1-token step.
    """

    def __init__(self, model: torch.nn.Module, aux_layers: tuple[int, ...] = (), capacity: int = 256) -> None:
        self.model = model
        self.cache = position_cache(model.config, capacity)
        self.cache_keyword = cache_keyword(model)
        self.length = 0
        self.aux_layers = tuple(aux_layers)
        self.aux: torch.Tensor | None = None
        self.own_mask = takes_own_mask(model, self.cache)
        self.positions: torch.Tensor | None = None  # [capacity] 0, 1, 2, ... on the model's device (causal_mask)

    def causal_mask(self, num_tokens: int, device: torch.device) -> torch.Tensor:
        """The mask of ``num_tokens`` queries at positions length.. over keys 0..length + num_tokens - 1:
        [1, 1, T, length + T], True where key position <= query position."""
        end = self.length + num_tokens
        if self.positions is None or self.positions.numel() < end or self.positions.device != device:
            self.positions = torch.arange(max(2 * end, 256), device=device)
        keys, queries = self.positions[:end], self.positions[self.length: end]
        return (keys.view(1, -1) <= queries.view(-1, 1))[None, None]

    @property
    def vocab_size(self) -> int:
        return lm_head_rows(self.model)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, last_only: bool = False, keep: int = 0) -> torch.Tensor:
        """Append ``tokens`` [1, T] to the cache; returns logits [T, V] (or [1, V] with ``last_only``; [keep, V], the
        last ``keep`` positions' only, with ``keep`` > 0: the lm_head reads out no other row)."""
        mask = self.causal_mask(tokens.shape[1], tokens.device) if self.own_mask and tokens.shape[1] > 1 else None
        out = self.model(
            input_ids=tokens,
            **{self.cache_keyword: self.cache},
            **({"attention_mask": mask} if mask is not None else {}),
            use_cache=True,
            logits_to_keep=1 if last_only else keep,
            output_hidden_states=bool(self.aux_layers),
        )
        if self.aux_layers:
            self.aux = aux_hidden(out.hidden_states, self.aux_layers)  # [T, k * H]
        self.length += tokens.shape[1]
        return out.logits[0]

    def rollback(self, num_tokens: int) -> None:
        """Forget the last ``num_tokens`` cached tokens (a length moved back; nothing is copied)."""
        if num_tokens < 0 or num_tokens > self.length:
            raise ValueError(f"cannot roll back {num_tokens} tokens from a cache of {self.length}")
        if num_tokens:
            self.cache.crop(-num_tokens)
            self.length -= num_tokens
