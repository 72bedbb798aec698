"""What `specdistill-eval` does to the loaded models before it measures: a draft vocabulary kept or dropped
(--draft-vocab, --engine both) and, eager on CPU, the linear layers on oneDNN-packed weights (--cpu-linear)."""
from __future__ import annotations

import argparse

import torch

from decode.loop.auto_gamma import AUTO_GAMMAS, fixed_gammas
from decode.loop.packed_linear import pack_linears, tune_plain_rows


def use_draft_vocab(args: argparse.Namespace, draft: object) -> int | None:
    """The draft vocabulary's size our decoder reads out (kinds/draft_vocab.py), or None for every row: a loaded
    vocabulary is dropped with --draft-vocab full and under --engine both."""
    ids = getattr(draft, "draft_vocab_ids", None)
    if ids is not None and (args.draft_vocab == "full" or args.engine == "both"):
        draft.draft_vocab_ids = ids = None
    return None if ids is None else int(ids.numel())


def pack_for_eager_cpu(args: argparse.Namespace, target: torch.nn.Module, draft: object) -> str:
    """With --cpu-linear packed or auto and no --compile: the target's and the draft's (when it is a module) linear
    layers on oneDNN-packed weights, in place (decode.loop.packed_linear; nothing on GPU); with auto, each model then
    keeps F.linear at the token counts up to gamma + 1 where that measured faster. What the run uses: "plain" when no
    layer was packed, "packed", or with auto e.g. "auto: target plain at 1-3 tokens, draft packed"."""
    if args.cpu_linear == "plain" or args.compile:
        return "plain"
    models = {}  # the models with layers packed now, by role
    for name, model in (("target", target), ("draft", draft)):
        if isinstance(model, torch.nn.Module) and pack_linears(model):
            models[name] = model
    if not models or args.cpu_linear == "packed":
        return "packed" if models else "plain"
    gammas = fixed_gammas(args.gamma) + (list(AUTO_GAMMAS) if "auto" in args.gamma else [])
    rows = range(1, max(gammas) + 2)
    return "auto: " + ", ".join(f"{name} {describe_rows(tune_plain_rows(model, rows))}"
                                for name, model in models.items())


def describe_rows(plain: frozenset[int]) -> str:
    """The report's words for the token counts a model kept on F.linear: packed (none), plain at 1-3 tokens (a run of
    three or more), plain at 1, 3 tokens."""
    if not plain:
        return "packed"
    counts = sorted(plain)
    span = counts == list(range(counts[0], counts[-1] + 1)) and len(counts) > 2
    if span:
        return f"plain at {counts[0]}-{counts[-1]} tokens"
    return f"plain at {', '.join(map(str, counts))} token{'' if counts == [1] else 's'}"
