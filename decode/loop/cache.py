"""A causal LM with its own KV cache: forward new tokens, roll back rejected ones. Nothing is ever re-prefilled."""
from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache

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


class CachedLM:
    """Wraps a ``transformers`` causal LM and the ``DynamicCache`` of one sequence (batch size 1).

    ``length`` is the number of tokens whose keys/values are in the cache. With ``aux_layers`` (a hidden-state
    drafter's layer ids), every forward also leaves ``aux`` [T, len(aux_layers) * H]: those layers' hidden states
    of the T tokens it processed, from the same pass.
    """

    def __init__(self, model: torch.nn.Module, aux_layers: tuple[int, ...] = ()) -> None:
        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.cache_keyword = cache_keyword(model)
        self.length = 0
        self.aux_layers = tuple(aux_layers)
        self.aux: torch.Tensor | None = None

    @property
    def vocab_size(self) -> int:
        return lm_head_rows(self.model)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, last_only: bool = False, keep: int = 0) -> torch.Tensor:
        """Append ``tokens`` [1, T] to the cache; returns logits [T, V] (or [1, V] with ``last_only``; [keep, V], the
        last ``keep`` positions' only, with ``keep`` > 0: the lm_head reads out no other row)."""
        out = self.model(
            input_ids=tokens,
            **{self.cache_keyword: self.cache},
            use_cache=True,
            logits_to_keep=1 if last_only else keep,
            output_hidden_states=bool(self.aux_layers),
        )
        if self.aux_layers:
            self.aux = aux_hidden(out.hidden_states, self.aux_layers)  # [T, k * H]
        self.length += tokens.shape[1]
        return out.logits[0]

    def rollback(self, num_tokens: int) -> None:
        """Forget the last ``num_tokens`` cached tokens."""
        if num_tokens < 0 or num_tokens > self.length:
            raise ValueError(f"cannot roll back {num_tokens} tokens from a cache of {self.length}")
        if num_tokens:
            self.cache.crop(-num_tokens)
            self.length -= num_tokens
