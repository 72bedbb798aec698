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
Texts in `exclude` (the prompts acceptance is measured on) are dropped as repeats are: a short opener can lead the
target to write a held-out prompt word for word.

Prompts toward chosen categories: `openers` (pairs of category and the first words of a user message, e.g.
("coding", "Write a Python function that")) are put after the prefix, candidate k (counted over all rounds) given
opener k mod len(openers), so the categories take turns; the target writes the rest of the message, and the kept
prompt is the opener followed by it. Left alone, a small chat model writes mostly requests for advice and
explanations (docs/benchmarks/real_target.md); CATEGORY_OPENERS has openers for the eight categories of
recipes/prompts/chat_eval.jsonl, written from the category names (none is taken from a held-out prompt).

    made = synthesize_prompts(target, tokenizer, out, Synthesis(count=800, openers=category_openers(["math"])))
"""
from __future__ import annotations

import difflib
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

# First words of a user message per category: the eight categories of recipes/prompts/chat_eval.jsonl
# (distill.recipe.data_config.PROMPT_CATEGORIES, which the recipe checks names against). An opener does not end in
# white space: the target's next token carries the space, as in text it reads.
CATEGORY_OPENERS: dict[str, tuple[str, ...]] = {
    "writing": ("Write a short poem about", "Write a short story in which", "Write an email to",
                "Write a product description for", "Write a haiku about", "Write a speech for"),
    "qa": ("What is the difference between", "Why do", "How does", "Who was", "What causes",
           "What are the main"),
    "math": ("Solve for x:", "What is 15% of", "A train travels", "Calculate the area of",
             "If a store sells", "What is the sum of"),
    "coding": ("Write a Python function that", "Write a JavaScript function that", "How do I sort a list of",
               "Explain what this Python code does:", "Write a SQL query that", "Fix the bug in this code:"),
    "reasoning": ("If all", "Which is heavier,", "A farmer has", "What comes next in the sequence",
                  "Three friends", "Is the following argument valid?"),
    "advice": ("How can I", "What should I do if", "Can you give me tips on", "I want to",
               "What is the best way to", "How do I prepare for"),
    "summarization": ("Summarize the following text in two sentences:", "Summarize this paragraph:",
                      "Give a one-sentence summary of the following:", "Summarize the main points of this email:",
                      "Write a short summary of this news story:", "Condense the following into three bullet points:"),
    "extraction": ("Extract all the names from the following text:", "List every date mentioned in this text:",
                   "From the following paragraph, extract", "Find the email addresses in this text:",
                   "Extract the prices from this list:", "Pull the key facts out of this text:"),
}


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
    openers: tuple[tuple[str | None, str], ...] = ()  # (category, opener) pairs; () = the bare user turn
    exclude: frozenset[str] = frozenset()  # texts never kept (held-out prompts), compared as duplicates are


@dataclass(frozen=True)
class SynthesizedPrompt:
    """A prompt written by the target: its text, and the category of its opener (None without openers)."""

    text: str
    category: str | None = None


def prompt_texts(rows: list[Any]) -> frozenset[str]:
    """The user texts of prompt rows (decode.inputs.prompts.PromptRow: a plain prompt, or a conversation's last user
    turn): what Synthesis.exclude takes."""
    texts = []
    for row in rows:
        if row.is_conversation:
            users = [m.get("content") for m in row.messages if m.get("role") == "user"]
            texts += [users[-1]] if users and isinstance(users[-1], str) else []
        elif row.text:
            texts.append(row.text)
    return frozenset(texts)


def category_openers(categories: list[str] | tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The (category, opener) pairs of CATEGORY_OPENERS for `categories` ("all" among them: every one),
    interleaved so that consecutive candidates cycle through the categories. Raises SynthesisError naming an
    unknown category."""
    names = list(CATEGORY_OPENERS) if "all" in categories else list(dict.fromkeys(categories))
    unknown = [name for name in names if name not in CATEGORY_OPENERS]
    if unknown or not names:
        close = difflib.get_close_matches(unknown[0], CATEGORY_OPENERS, n=1) if unknown else []
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise SynthesisError(f"unknown prompt category {unknown[0] if unknown else '(none given)'!r}; known: "
                             f"{', '.join(CATEGORY_OPENERS)} (or all){hint}")
    width = max(len(CATEGORY_OPENERS[name]) for name in names)
    return tuple((name, CATEGORY_OPENERS[name][i % len(CATEGORY_OPENERS[name])])
                 for i in range(width) for name in names)


def user_turn_prefix(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids of the chat template rendered up to where a user message's text begins (whatever the template puts
    first, such as a default system prompt, included). Raises SynthesisError without a usable template."""
    prefix = tokenizer(_rendered_prefix(tokenizer), add_special_tokens=False)["input_ids"]
    if not prefix:
        raise SynthesisError("data.synthesize_prompts: the chat template puts nothing before a user message")
    return prefix


def _rendered_prefix(tokenizer: PreTrainedTokenizerBase) -> str:
    """The chat template's text up to where a user message's text begins."""
    if not getattr(tokenizer, "chat_template", None):
        raise SynthesisError(f"data.synthesize_prompts: tokenizer {tokenizer.name_or_path!r} has no chat template "
                             "(Magpie needs a chat model's template to start a user turn)")
    text = tokenizer.apply_chat_template([{"role": "user", "content": _MARKER}], tokenize=False,
                                         add_generation_prompt=False)
    if _MARKER not in text:
        raise SynthesisError("data.synthesize_prompts: the chat template does not render the user's text")
    return text[: text.index(_MARKER)]


def _opened_prefixes(tokenizer: PreTrainedTokenizerBase, openers: tuple[tuple[str | None, str], ...]
                     ) -> list[list[int]]:
    """Token ids of the user-turn prefix followed by each opener, tokenised together (as the template renders the
    whole message)."""
    rendered = _rendered_prefix(tokenizer)
    return [tokenizer(rendered + opener, add_special_tokens=False)["input_ids"] for _, opener in openers]


def _key(text: str) -> str:
    return " ".join(text.split()).casefold()


def synthesize_prompts(target: nn.Module, tokenizer: PreTrainedTokenizerBase, out_dir: str | os.PathLike,
                       synthesis: Synthesis, **kwargs: Any) -> list[str]:
    """The texts of synthesize_prompt_rows (same arguments)."""
    return [made.text for made in synthesize_prompt_rows(target, tokenizer, out_dir, synthesis, **kwargs)]


def synthesize_prompt_rows(target: nn.Module, tokenizer: PreTrainedTokenizerBase, out_dir: str | os.PathLike,
                           synthesis: Synthesis, *, target_id: str = "", progress: bool = True,
                           engine: ResponseEngine | str = "specdistill",
                           vllm_python: Path | None = None, vllm_dtype: str = "float32") -> list[SynthesizedPrompt]:
    """`synthesis.count` distinct user messages written by the target (fewer, with a warning, when MAX_ROUNDS
    rounds do not find that many), each with its opener's category. Raises SynthesisError (no template),
    CacheMismatchError (out_dir holds prompts of another target or other settings)."""
    openers = synthesis.openers or ((None, ""),)
    prefixes = _opened_prefixes(tokenizer, synthesis.openers) if synthesis.openers else [user_turn_prefix(tokenizer)]
    kept: list[SynthesizedPrompt] = []
    seen: set[str] = {_key(text) for text in synthesis.exclude}
    asked, first_seed = math.ceil(synthesis.count * OVERSAMPLE), synthesis.seed
    for round_index in range(MAX_ROUNDS):
        turn = [(first_seed - synthesis.seed + i) % len(prefixes) for i in range(asked)]  # candidate k: opener k
        rows = generate_target_data(
            target, tokenizer, [prefixes[k] for k in turn], Path(out_dir) / f"round-{round_index}",
            max_new_tokens=synthesis.max_new_tokens, temperature=synthesis.temperature, seed=first_seed,
            batch_size=synthesis.batch_size, target_id=target_id, progress=progress, engine=engine,
            vllm_python=vllm_python, vllm_dtype=vllm_dtype, shard_size=VLLM_SHARD_SIZE if engine == "vllm" else None,
            desc=f"synthesized prompts (round {round_index + 1})")
        for row, k in zip(rows, turn):
            category, opener = openers[k]
            text = _kept_text(row, opener)
            if text is not None and _key(text) not in seen:
                seen.add(_key(text))
                kept.append(SynthesizedPrompt(text, category))
        if len(kept) >= synthesis.count:
            return kept[: synthesis.count]
        first_seed += asked
        asked = 2 * (synthesis.count - len(kept))
    logger.warning("data.synthesize_prompts: %d distinct finished prompts after %d rounds, %d asked for",
                   len(kept), MAX_ROUNDS, synthesis.count)
    return kept


def _kept_text(row: dict[str, Any], opener: str = "") -> str | None:
    """The candidate's text (its opener, then what the target wrote) when it ended its turn and wrote something."""
    written = row["response_text"].strip()
    return (opener + row["response_text"]).strip() if row["stopped_at_eos"] and written else None
