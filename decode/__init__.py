"""specdistill's speculative decoder: lossless speculative decoding of transformers causal LMs, and its metrics. The
drafters live with their kinds (kinds/<kind>/drafter.py: ModelDrafter, PromptLookupDrafter, HeadDrafter,
DFlashDrafter); speculative_generate takes a draft of any kind, or a drafter."""
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
