"""Conversations answered by the target, turn by turn (`specdistill-data responses`): the field's way of building
draft data, as speculators' regenerate_responses and SpecForge's regenerate_train_data do.

    rows = answer_conversations(target, tokenizer, prompt_rows, "data/chat/.specdistill", settings)
    write_jsonl(rows, "data/chat/train.jsonl")       # a recipe reads data.dataset: data/chat

A row's user turns (and system turns) are kept, its own assistant turns dropped; turn t of every row that has one
is answered in one pass of distill.data.target_data.generate_target_data (batched, seeded per row, stored in
resumable shards under work_dir/turn-<t>), the conversation rendered with the chat template up to that user turn,
earlier turns answered by the target itself. A kill resumes inside the turn it was in; finished turns are read back.
Without a chat template (chat_template off, or a base model) each prompt is plain text and the row becomes
{"text": prompt + response}.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn
from transformers import PreTrainedTokenizerBase

from decode.inputs.prompts import PromptRow, render_prompt, uses_template
from decode.inputs.writes import write_atomic
from distill.data.target_data import ResponseEngine, generate_target_data
from distill.data.target_vllm import VLLM_SHARD_SIZE


@dataclass(frozen=True)
class Answering:
    """How the target answers: decoding settings of generate_target_data, and the chat-template mode of the
    prompts (decode.inputs.prompts: auto, on, off)."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    batch_size: int = 16
    chat_template: str = "auto"
    shard_size: int | None = None  # prompts per stored shard (None: generate_target_data's default)


def user_turns(row: PromptRow) -> list[dict]:
    """The row's messages without its assistant turns (a plain prompt: one user turn)."""
    if not row.is_conversation:
        return [{"role": "user", "content": row.text}]
    return [dict(m) for m in row.messages if m["role"] != "assistant"]


def answer_conversations(target: nn.Module, tokenizer: PreTrainedTokenizerBase, rows: list[PromptRow],
                         work_dir: str | os.PathLike, answering: Answering, *, target_id: str = "",
                         progress: bool = True, engine: ResponseEngine | str = "specdistill",
                         vllm_python: Path | None = None, vllm_dtype: str = "float32") -> list[dict[str, Any]]:
    """One output row per input row: {"messages": [...the target's answers...]} (+ "category"), or {"text"} for
    rows rendered without the template (module docstring). Raises CacheMismatchError when work_dir holds
    answers of other inputs."""
    templated = uses_template(tokenizer, PromptRow(messages=()), answering.chat_template)  # as every conversation
    pending = [user_turns(row) for row in rows]
    answered: list[list[dict]] = [[] for _ in rows]
    texts: dict[int, str] = {}  # untemplated rows: the last prompt's text + its response
    turn = 0
    while any(pending):
        asking = [i for i, turns in enumerate(pending) if turns]
        prompts = []
        for i in asking:
            while pending[i] and pending[i][0]["role"] != "user":  # system turns travel with the next user turn
                answered[i].append(pending[i].pop(0))
            if pending[i]:
                answered[i].append(pending[i].pop(0))
            prompts.append(_prompt_text(tokenizer, answered[i], templated))
        encoded = [tokenizer(text, add_special_tokens=not templated)["input_ids"] for text in prompts]
        out = generate_target_data(
            target, tokenizer, encoded, Path(work_dir) / f"turn-{turn}", max_new_tokens=answering.max_new_tokens,
            temperature=answering.temperature, top_k=answering.top_k, top_p=answering.top_p,
            seed=answering.seed + turn * len(rows), batch_size=answering.batch_size, target_id=target_id,
            progress=progress, engine=engine, vllm_python=vllm_python, vllm_dtype=vllm_dtype,
            shard_size=VLLM_SHARD_SIZE if engine == "vllm" else answering.shard_size,
            desc=f"answers to turn {turn + 1}")
        for i, prompt, response in zip(asking, prompts, out["response_text"]):
            answered[i].append({"role": "assistant", "content": response.strip()})
            if not templated:
                texts[i] = prompt + response
        turn += 1
    return [_output_row(answered[i], texts.get(i), row.category) for i, row in enumerate(rows)]


def _prompt_text(tokenizer: PreTrainedTokenizerBase, messages: list[dict], templated: bool) -> str:
    """The conversation so far as the target is given it (decode.inputs.prompts.render_prompt)."""
    return render_prompt(tokenizer, PromptRow(messages=tuple(messages)), "on" if templated else "off")[0]


def _output_row(messages: list[dict], text: str | None, category: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {"text": text} if text is not None else {"messages": messages}
    return {**row, "category": category} if category is not None else row


def write_jsonl(rows: list[dict[str, Any]], path: str | os.PathLike) -> Path:
    """The rows as a .jsonl file, written atomically (a kill never leaves half a file)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(Path(path), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return Path(path)
