"""specdistill's speculative decoder: lossless speculative decoding of transformers causal LMs, and its metrics. The
drafters live with their kinds (kinds/<kind>/drafter.py); speculative_generate takes a drafter, or a draft with its
kind (decode.loop.drafters.DraftingKind); specdistill.drafts.speculative_generate finds the kind of any draft."""
from decode.loop.sampling import SamplingConfig
from decode.loop.speculative import GenerateOutput, autoregressive_generate, speculative_generate
from decode.loop.stats import SpecStats

__all__ = [
    "GenerateOutput",
    "SamplingConfig",
    "SpecStats",
    "autoregressive_generate",
    "speculative_generate",
]
