"""The kinds of draft, one folder each, named in one registry: prompt lookup, a P-EAGLE parallel head, an EAGLE-3
head, a DFlash block drafter, a PARD parallel draft, a standalone draft model.

Each kind's folder (kinds/<name>/) holds its model, its drafter for our decoder, its recipe keys and defaults, how it
is built and trained, its export, its deployment checks, its serving commands and its model-card text; its
`__init__.py` holds its `Kind` (kinds/base.py says what a kind answers). The floors below (decode/, distill/) never
look a kind up: the top floor (specdistill/: the commands, the run pipeline, the recipe schema) chooses it here, once,
and hands it down as a value. Adding a kind is a folder and one line in KIND_FOLDERS
(docs/developer/add-a-draft-kind.md).

    kind = kind_of_source(args.draft)       # from a --draft value: a folder, a hub id or "prompt-lookup"
    draft = kind.load(args.draft, target, device, dtype)
    kind_of(draft).drafter(draft, target)   # from a draft in memory
    kind_named(name)                        # from a name: the eval JSON, a deployment report
"""
from __future__ import annotations

from importlib import import_module

from kinds.base import Kind

# The registry: each kind's folder under kinds/, one line each, in the order a --draft value or a draft in memory is
# recognised: a P-EAGLE head before the EAGLE-3 heads it extends, the standalone model last (it takes any other
# folder or hub id, and any other module).
KIND_FOLDERS = (
    "prompt_lookup",
    "p_eagle",
    "eagle3",
    "dflash",
    "pard",
    "standalone",
)
KINDS: tuple[Kind, ...] = tuple(import_module(f"kinds.{folder}").KIND for folder in KIND_FOLDERS)


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
    raise TypeError(f"no kind of draft ({', '.join(kind.name for kind in KINDS)}) holds a {type(draft).__name__}")


def kind_of_source(draft: object) -> Kind:
    """The kind a --draft value names: "prompt-lookup", an EAGLE-3 head or a DFlash folder (its config.json's
    architectures), a PARD folder (its pard_token), else a model."""
    return next(kind for kind in KINDS if kind.recognises(str(draft)))


STANDALONE = kind_named("standalone")  # what a recipe that names no kind trains (specdistill.recipes)
