"""specdistill's speculative decoder: lossless speculative decoding of transformers causal LMs, and its metrics. The
drafters live with their kinds (kinds/<kind>/drafter.py); speculative_generate takes a drafter, or a draft with its
kind (decode.loop.drafters.DraftingKind); specdistill.drafts.speculative_generate finds the kind of any draft.

The names below are loaded on first use (PEP 562), so a light submodule (decode.inputs.command_line, the commands'
parsers) imports without torch: `specdistill train --help` answers at once."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from decode.loop.sampling import SamplingConfig
    from decode.loop.speculative import GenerateOutput, autoregressive_generate, speculative_generate
    from decode.loop.stats import SpecStats

__all__ = ["GenerateOutput", "SamplingConfig", "SpecStats", "autoregressive_generate", "speculative_generate"]


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module 'decode' has no attribute {name!r}")
    from decode.loop import sampling, speculative, stats  # torch, on the first use of a name above

    return getattr(sampling if name == "SamplingConfig" else stats if name == "SpecStats" else speculative, name)
