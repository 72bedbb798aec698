"""Prompt lookup: no model; the tokens that followed the longest earlier match of the context's last n-gram
(--draft prompt-lookup; vLLM's ngram). Nothing to train, export or check: the free baseline every draft must beat.

    drafter.py   PromptLookupDrafter (our decoder)
"""
from __future__ import annotations

from kinds.base import Kind

PROMPT_LOOKUP = "prompt-lookup"  # the --draft value that names prompt lookup


class PromptLookupKind(Kind):
    name, title = "prompt_lookup", "prompt lookup"
    summary = "n-grams of the context, no model (vLLM's ngram)"
    vllm_method, has_weights, trains = "ngram", False, False
    model_free_drafts = True  # a host-side n-gram search: c = 0 at every batch

    def recognises(self, draft: str) -> bool:
        return draft == PROMPT_LOOKUP

    def holds(self, draft: object) -> bool:
        from kinds.prompt_lookup.drafter import PromptLookupDrafter

        return isinstance(draft, PromptLookupDrafter)

    def load(self, draft, target, device, dtype, trust_remote_code=False, earliest=False):
        from kinds.prompt_lookup.drafter import PromptLookupDrafter

        return PromptLookupDrafter(earliest=earliest)

    def drafter(self, draft, target, compile=False, capacity=0, max_gamma=8):
        return draft

    def vllm_options(self) -> dict:
        """vLLM's ngram sizes: those of our drafter, so both engines look up the same n-grams."""
        from kinds.prompt_lookup.drafter import PromptLookupDrafter

        lookup = PromptLookupDrafter()
        return {"prompt_lookup_min": lookup.min_ngram_size, "prompt_lookup_max": lookup.max_ngram_size}

    def assisted_generate(self, target, draft, prompt, gamma, **generate_kwargs):
        return target.generate(prompt, prompt_lookup_num_tokens=gamma, max_matching_ngram_size=draft.max_ngram_size,
                               **generate_kwargs)


KIND = PromptLookupKind()
