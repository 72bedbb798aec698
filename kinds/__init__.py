"""The kinds of draft, one folder each, named in one registry: a standalone draft model, prompt lookup, an EAGLE-3
head, a P-EAGLE parallel head, a DFlash block drafter, a PARD parallel draft.

Each kind's folder (kinds/<name>/) holds its model, its drafter for our decoder, its recipe keys and defaults, how it
is built and trained, its export, its deployment checks, its serving commands and its model-card text; its
`__init__.py` holds its `Kind` (kinds/base.py says what a kind answers). Every module outside kinds/ asks the kind
and never decides it itself: no `isinstance` on a draft class, no comparison with a kind's name, no table keyed by
kind names, no kind-specific recogniser (tests/test_one_home.py fails on each). Adding a kind is a folder and one
line in KINDS (docs/developer/add-a-draft-kind.md).

    kind = kind_of_source(args.draft)       # from a --draft value: a folder, a hub id or "prompt-lookup"
    draft = kind.load(args.draft, target, device, dtype)
    kind_of(draft).drafter(draft, target)   # from a draft in memory
    kind_named(recipe.model.draft_kind)     # from a name: recipes, the eval JSON, a deployment report
"""
from __future__ import annotations

from kinds.base import Kind
from kinds.dflash import KIND as DFLASH
from kinds.eagle3 import KIND as EAGLE3
from kinds.p_eagle import KIND as P_EAGLE
from kinds.pard import KIND as PARD
from kinds.prompt_lookup import KIND as PROMPT_LOOKUP
from kinds.standalone import KIND as STANDALONE

# The registry. Recognised in this order: a P-EAGLE head before the EAGLE-3 heads it extends, the standalone model last
# (it takes any other folder or hub id, and any other module).
KINDS: tuple[Kind, ...] = (PROMPT_LOOKUP, P_EAGLE, EAGLE3, DFLASH, PARD, STANDALONE)

DraftKind = Kind  # the interface's name where decoding code annotates with it


def trainable() -> tuple[str, ...]:
    """The names model.draft_kind accepts: the kinds that train."""
    return tuple(kind.name for kind in KINDS if kind.trains)


def kind_named(name: str) -> Kind:
    """The kind called ``name`` (or one of its former names). ValueError naming the kinds for any other name."""
    for kind in KINDS:
        if name == kind.name or name in kind.aliases:
            return kind
    raise ValueError(f"unknown draft kind {name!r}; the kinds are {', '.join(kind.name for kind in KINDS)}")


def kind_of(draft: object) -> Kind:
    """The kind of a draft in memory. TypeError when no kind holds it."""
    for kind in KINDS:
        if kind.holds(draft):
            return kind
    raise TypeError(f"draft must be a causal LM, an Eagle3Head, a DFlashDraft or a PromptLookupDrafter, got "
                    f"{type(draft).__name__}")


def kind_of_source(draft: object) -> Kind:
    """The kind a --draft value names: "prompt-lookup", an EAGLE-3 head or a DFlash folder (its config.json's
    architectures), a PARD folder (its pard_token), else a model."""
    return next(kind for kind in KINDS if kind.recognises(str(draft)))


def served_draft(model: object) -> object:
    """The draft that is measured and exported: the one inside a kind's training wrapper (an EAGLE-3 head's
    UnrolledHead, what Trainer holds), any other model as it is."""
    for kind in KINDS:
        inner = kind.unwrap(model) if model is not None else None
        if inner is not None:
            return inner
    return model


def carry_draft_vocab(source: object, copy: object) -> object:
    """``copy`` (a whole copy of the draft ``source``: merged, gathered or read back from a checkpoint) with
    ``source``'s draft vocabulary, if it has one; returns ``copy``."""
    ids = getattr(source, "draft_vocab_ids", None)
    if ids is not None and copy is not None and copy is not source:
        copy.draft_vocab_ids = ids
    return copy
