"""What one evaluation runs: `EvalSettings` (gammas, sampling, new tokens, seed, repeats, the compiled path), read by
decode.measure.evaluate, the vLLM engine (decode.serving.vllm_engine) and recipes' eval section."""
from __future__ import annotations

from dataclasses import dataclass, field

from decode.loop.sampling import SamplingConfig
from decode.loop.speculative import check_gamma


@dataclass
class EvalSettings:
    gammas: list[int | str] = field(default_factory=lambda: [1, 2, 4])  # ints >= 1 and/or "auto"
    temperature: float = 0.0
    max_new_tokens: int = 64
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    repeats: int = 1
    compare_hf: bool = False
    warmup: bool = True
    eos_token_id: int | list[int] | None = None
    compile: bool = False
    draft_past_end: bool = False  # draft gamma tokens up to the very end, as vLLM does (decode.serving.parity)

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_k, self.top_p)

    def __post_init__(self) -> None:
        if not self.gammas:
            raise ValueError("gammas is empty: give integers >= 1 and/or 'auto'")
        for gamma in self.gammas:
            check_gamma(gamma)
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
