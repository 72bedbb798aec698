"""specdistill's speculative decoder: lossless speculative decoding of transformers causal LMs, and its metrics."""
from decode.drafters import ModelDrafter, PromptLookupDrafter
from decode.head_drafter import HeadDrafter
from decode.sampling import SamplingConfig
from decode.speculative import GenerateOutput, autoregressive_generate, speculative_generate
from decode.stats import SpecStats

__all__ = [
    "GenerateOutput",
    "HeadDrafter",
    "ModelDrafter",
    "PromptLookupDrafter",
    "SamplingConfig",
    "SpecStats",
    "autoregressive_generate",
    "speculative_generate",
]
