"""Prompts written by the target itself (Magpie: Xu et al., 2024, "Alignment Data Synthesis from Scratch by
Prompting Aligned LLMs with Nothing"), for data.synthesize_prompts and `specdistill-data prompts`.

    made = synthesize_prompts(target, tokenizer, "data/responses/prompts", Synthesis(count=2000, seed=0))

An aligned chat model given its chat template up to the start of a user message (the template's default system
prompt included) writes a user message, ending it with the template's end of turn. Candidate i is sampled with
seed + i, at `temperature`, at most `max_new_tokens` tokens; a candidate is kept when it ended its turn (eos within
the limit), is not empty, and was not seen before (compared without case and surrounding white space). Candidates
are generated in rounds, each one resumable target-data folder (distill.data.target_data: shards written
atomically, resumed after a kill, reused when finished) under out_dir/round-<r>: the first round asks for
count * OVERSAMPLE candidates, each later one for twice the prompts still missing, with seeds after the last round's.
Everything depends only on the target, the tokenizer and the settings, so a rerun reads the same prompts back.
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn
from transformers import PreTrainedTokenizerBase

from distill.data.target_data import ResponseEngine, generate_target_data
from distill.data.target_vllm import VLLM_SHARD_SIZE

logger = logging.getLogger(__name__)

OVERSAMPLE = 1.25  # first round: candidates per prompt asked for (some end unfinished or repeat another)
MAX_ROUNDS = 4
_MARKER = "\u2063specdistill-user-message\u2063"  # a text no template writes itself


class SynthesisError(ValueError):
    """Prompts cannot be synthesized with this tokenizer (no chat template, or one that hides the user's text)."""


@dataclass(frozen=True)
class Synthesis:
    """How prompts are synthesized (module docstring)."""

    count: int
    seed: int = 0
    temperature: float = 1.0
    max_new_tokens: int = 128
    batch_size: int = 16


def user_turn_prefix(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids of the chat template rendered up to where a user message's text begins (whatever the template puts
    first, such as a default system prompt, included). Raises SynthesisError without a usable template."""
    if not getattr(tokenizer, "chat_template", None):
        raise SynthesisError(f"data.synthesize_prompts: tokenizer {tokenizer.name_or_path!r} has no chat template "
                             "(Magpie needs a chat model's template to start a user turn)")
    text = tokenizer.apply_chat_template([{"role": "user", "content": _MARKER}], tokenize=False,
                                         add_generation_prompt=False)
    if _MARKER not in text:
        raise SynthesisError("data.synthesize_prompts: the chat template does not render the user's text")
    prefix = tokenizer(text[: text.index(_MARKER)], add_special_tokens=False)["input_ids"]
    if not prefix:
        raise SynthesisError("data.synthesize_prompts: the chat template puts nothing before a user message")
    return prefix


def _key(text: str) -> str:
    return " ".join(text.split()).casefold()


def synthesize_prompts(target: nn.Module, tokenizer: PreTrainedTokenizerBase, out_dir: str | os.PathLike,
                       synthesis: Synthesis, *, target_id: str = "", progress: bool = True,
                       engine: ResponseEngine | str = "specdistill",
                       vllm_python: Path | None = None) -> list[str]:
    """`synthesis.count` distinct user messages written by the target (fewer, with a warning, when MAX_ROUNDS
    rounds do not find that many). Raises SynthesisError (no template), CacheMismatchError (out_dir holds prompts
    of another target or other settings)."""
    prefix = user_turn_prefix(tokenizer)
    kept: list[str] = []
    seen: set[str] = set()
    asked, first_seed = math.ceil(synthesis.count * OVERSAMPLE), synthesis.seed
    for round_index in range(MAX_ROUNDS):
        rows = generate_target_data(
            target, tokenizer, [prefix] * asked, Path(out_dir) / f"round-{round_index}",
            max_new_tokens=synthesis.max_new_tokens, temperature=synthesis.temperature, seed=first_seed,
            batch_size=synthesis.batch_size, target_id=target_id, progress=progress, engine=engine,
            vllm_python=vllm_python, shard_size=VLLM_SHARD_SIZE if engine == "vllm" else None,
            desc=f"synthesized prompts (round {round_index + 1})")
        for row in rows:
            text = _kept_text(row)
            if text is not None and _key(text) not in seen:
                seen.add(_key(text))
                kept.append(text)
        if len(kept) >= synthesis.count:
            return kept[: synthesis.count]
        first_seed += asked
        asked = 2 * (synthesis.count - len(kept))
    logger.warning("data.synthesize_prompts: %d distinct finished prompts after %d rounds, %d asked for",
                   len(kept), MAX_ROUNDS, synthesis.count)
    return kept


def _kept_text(row: dict[str, Any]) -> str | None:
    """The candidate's text when it ended its turn and is not empty."""
    text = row["response_text"].strip()
    return text if row["stopped_at_eos"] and text else None
