"""Kinds of draft, behind one interface: a standalone draft model, prompt lookup, an EAGLE-3 head, a DFlash draft.

Every place that treats kinds differently asks the kind (never `isinstance` on a draft class, a folder's
architectures or the literal "prompt-lookup"): evaluation builds its drafter, warms its static caches and runs
transformers' assisted generation through it, `specdistill-eval` loads it and names it in the results JSON,
vLLM gets its speculative method, the export writes its served folder, the deployment check and the model card look
it up by name. Each kind is implemented next to its drafter (decode/drafters.py, decode/head_drafter.py,
decode/dflash_drafter.py); adding a kind is one class there and one line in KINDS.

    kind = kind_of_source(args.draft)        # from a --draft value: a folder, a hub id or "prompt-lookup"
    draft = kind.load(args.draft, target, device, dtype, trust_remote_code=False)
    kind_of(draft).drafter(draft, target)    # from a draft in memory
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from decode.dflash_drafter import DFLASH_KIND
from decode.drafters import MODEL_KIND, PROMPT_LOOKUP_KIND, Drafter
from decode.head_drafter import EAGLE3_KIND


class DraftKind(Protocol):
    name: str                  # the results JSON's draft_kind and the deployment report's kind
    vllm_method: str           # vLLM's speculative_config method for it
    has_weights: bool          # a model folder or hub id (weights, config, tokenizer): checked before loading
    assisted_refusal: str | None  # why transformers' assisted generation cannot run it; None when it can

    def recognises(self, draft: str) -> bool:
        """Whether a --draft value (a folder, a hub id, a name) is a draft of this kind."""

    def holds(self, draft: object) -> bool:
        """Whether a draft in memory (a model, a drafter) is of this kind."""

    def fit_problem(self, draft: str, target: str, trust_remote_code: bool = False) -> str | None:
        """Why ``draft`` cannot run next to ``target``, found from configs before any weight loads; None if it can."""

    def load(self, draft: str, target: torch.nn.Module, device: torch.device, dtype: torch.dtype | str,
             trust_remote_code: bool = False, earliest: bool = False) -> object:
        """The draft named by ``draft`` in memory, next to the loaded ``target`` (``earliest``: prompt lookup's
        earliest-occurrence rule, as vLLM's ngram)."""

    def drafter(self, draft: object, target: torch.nn.Module, compile: bool = False, capacity: int = 0,
                max_gamma: int = 8) -> Drafter:
        """The drafter speculative decoding runs for ``draft`` (decode.drafters.Drafter)."""

    def reserve(self, draft: object, target: torch.nn.Module, capacity: int, max_gamma: int) -> None:
        """Size (and compile) the static caches of the compiled path for ``capacity`` positions."""

    def assisted_generate(self, target: torch.nn.Module, draft: object, prompt: torch.Tensor, gamma: int,
                          **generate_kwargs) -> torch.Tensor:
        """transformers' assisted generation of ``target`` with this draft drafting ``gamma`` tokens per step."""

    def save(self, draft: object, folder: str | Path, gamma: int) -> None:
        """The served folder of ``draft`` (weights, config, a generation config drafting ``gamma`` tokens)."""


# Recognised in this order: the standalone model last (it takes any other folder or hub id, and any other module).
KINDS: tuple[DraftKind, ...] = (PROMPT_LOOKUP_KIND, EAGLE3_KIND, DFLASH_KIND, MODEL_KIND)


def kind_of(draft: object) -> DraftKind:
    """The kind of a draft in memory. TypeError when no kind holds it."""
    for kind in KINDS:
        if kind.holds(draft):
            return kind
    raise TypeError(f"draft must be a causal LM, an Eagle3Head, a DFlashDraft or a PromptLookupDrafter, got "
                    f"{type(draft).__name__}")


def kind_of_source(draft: str | Path) -> DraftKind:
    """The kind a --draft value names: "prompt-lookup", an EAGLE-3 head or a DFlash folder (its config.json's
    architectures), else a model."""
    return next(kind for kind in KINDS if kind.recognises(str(draft)))
