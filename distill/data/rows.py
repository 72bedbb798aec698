"""The pieces of training rows and acceptance prompts, through `datasets` (tokenisation is cached by `Dataset.map`);
distill.data.dataset.build_data puts them together for a run.

- text: each document is tokenised (the tokenizer's own special tokens, then eos), documents are concatenated and
  cut into blocks of `max_length` tokens; every token is a training target.
- chat: each row's `messages` go through `tokenizer.apply_chat_template`; only assistant tokens (including the
  end-of-turn tokens the template puts after them) are training targets, the rest get label -100.
- .txt files: read as text (distill/data/text_files.py, data.text_sample_by): by default each file is one document,
  line breaks kept, eos only at its end.
- eval prompts: a file of prompts, or `num_eval_prompts` rows held out of the dataset before training (for .txt
  files read as whole documents: `num_eval_prompts` packed blocks, their first eval_prompt_tokens tokens).

Every problem raises DataError naming the file, the column or the setting at fault.
"""
from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import datasets
import torch
from transformers import PreTrainedTokenizerBase

from decode.inputs.checks import FileProblem, check_text_file
from decode.inputs.data_files import (
    DATA_FILE_BUILDERS,
    cache_write_problem,
    first_bad_json_line,
    first_empty_file,
    own_error_lines,
)
from decode.inputs.loading import LoadError
from decode.inputs.prompts import (
    PromptRow,
    check_chat_template,
    prompt_messages,
    prompt_token_ids,
    read_prompt_rows,
    uses_template,
)
from distill.data.text_files import PIECE_COLUMNS, TextFileError, load_text_files, tokenize_pieces
from distill.recipe.sections import DataConfig
from distill.utils import IGNORE_INDEX

# the local files data.dataset takes (decode.inputs.data_files.DATA_FILE_BUILDERS names the builder of each)
TRAINING_SUFFIXES = (".txt", ".json", ".jsonl", ".parquet")


class DataError(ValueError):
    """The dataset or the prompts cannot be used; the message names the file, column or key at fault."""


@dataclass
class DistillData:
    """What training needs from the data: tokenised rows (input_ids, labels) and acceptance prompts."""

    train: datasets.Dataset
    eval_prompts: list[torch.Tensor]  # 1-D token ids, one per prompt
    # prompts: prompt-only rows the target answers (distill.data.prompt_rows)
    format: Literal["text", "chat", "prompts"]
    eval_categories: list[str | None]  # one per eval prompt (None: no category)


# ---------------------------------------------------------------------------------------------------------------
# Raw rows
# ---------------------------------------------------------------------------------------------------------------

def local_data_files(spec: str) -> tuple[str, list[str]] | None:
    """(datasets builder, files) when `spec` names local data; None when it is a hub id.

    A file, a folder (its .txt/.json/.jsonl/.parquet files) or a glob. Raises DataError naming the path when it
    looks like a path (has a data-file extension, a glob or a path prefix) but nothing is there.
    """
    path = Path(spec).expanduser()
    if path.is_dir():
        files = sorted(str(p) for p in path.iterdir() if p.suffix in TRAINING_SUFFIXES)
    elif path.is_file():
        files = [str(path)]
    elif any(c in spec for c in "*?["):
        files = sorted(glob.glob(str(path), recursive=True))
        if not files:
            raise DataError(f"data.dataset: no file matches {spec!r}")
    elif path.suffix in TRAINING_SUFFIXES or spec.startswith((".", "/", "~")):
        raise DataError(f"data.dataset: file not found: {spec}")
    else:
        return None
    if not files:
        raise DataError(f"data.dataset: folder {spec} holds no {'/'.join(TRAINING_SUFFIXES)} files")
    builders = {DATA_FILE_BUILDERS[Path(f).suffix] if Path(f).suffix in TRAINING_SUFFIXES else None for f in files}
    if None in builders or len(builders) != 1:
        raise DataError(f"data.dataset: {spec} must hold files of one kind among {', '.join(TRAINING_SUFFIXES)}; "
                        f"got {sorted({Path(f).suffix for f in files})}")
    return builders.pop(), files


def load_rows(cfg: DataConfig) -> datasets.Dataset:
    """The raw rows of `data.dataset` / `data.split`, at most `data.max_samples` of them."""
    local = local_data_files(cfg.dataset)
    empty = first_empty_file(local[1]) if local is not None else None
    if empty is not None:
        raise DataError(f"data.dataset: {empty} is empty")
    try:
        for file in local[1] if local is not None and local[0] != "parquet" else []:
            check_text_file(file, "data.dataset")  # a binary or UTF-16 file, named before datasets reads it
    except FileProblem as err:
        raise DataError(str(err)) from None
    try:
        if local is not None and local[0] == "text":  # plain text read as text (distill/data/text_files.py)
            rows = load_text_files(local[1], cfg.text_sample_by)
        elif local is not None:
            builder, files = local
            with own_error_lines():  # a malformed file: named below in one line, file and line
                rows = datasets.load_dataset(builder, data_files=files, split=cfg.split)
        else:
            rows = datasets.load_dataset(cfg.dataset, cfg.dataset_config, split=cfg.split)
    except (datasets.exceptions.DatasetsError, FileNotFoundError, ConnectionError, ValueError,
            StopIteration) as err:
        cause = err.__cause__ if isinstance(err.__cause__, TextFileError) else err  # wrapped by from_generator
        bad_line = first_bad_json_line(local[1]) if local is not None else None  # name the file and line
        reason = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        raise DataError(f"data.dataset: {bad_line}" if bad_line else
                        f"data.dataset: cannot load {cfg.dataset!r} (split {cfg.split!r}): {reason}") from None
    except OSError as err:  # datasets writes every file it reads into its cache first
        line = cache_write_problem(err)
        if line is None:
            raise
        raise DataError(f"data.dataset: {line}") from None
    if cfg.max_samples is not None:
        rows = rows.select(range(min(cfg.max_samples, len(rows))))
    return rows


def resolve_format(cfg: DataConfig, columns: list[str]) -> Literal["text", "chat"]:
    """'chat' or 'text' for these columns; raises DataError naming the missing field and the columns there are."""
    if cfg.format == "chat" or (cfg.format == "auto" and cfg.messages_field in columns):
        fmt, key, name = "chat", "data.messages_field", cfg.messages_field
    else:
        fmt, key, name = "text", "data.text_field", cfg.text_field
    if name not in columns:
        prompts = "; it holds prompts: data.format=prompts data.dataset_weight=0 data.target_weight=1 " \
            "data.target_data_dir=DIR has the target answer them" if "prompt" in columns else ""
        raise DataError(f"{key}: column {name!r} is not in dataset {cfg.dataset}; available columns: "
                        f"{', '.join(columns)}{prompts}")
    return fmt


# ---------------------------------------------------------------------------------------------------------------
# Text: tokenise, then pack into max_length blocks
# ---------------------------------------------------------------------------------------------------------------

def tokenize_documents(batch: dict[str, list], tokenizer: PreTrainedTokenizerBase, field: str) -> dict[str, list]:
    """Token ids of each non-empty document, ending in eos."""
    eos = tokenizer.eos_token_id
    texts = [t for t in batch[field] if isinstance(t, str) and t.strip()]
    ids = tokenizer(texts, add_special_tokens=True)["input_ids"] if texts else []
    return {"input_ids": [doc if doc and doc[-1] == eos else doc + [eos] for doc in ids]}


def pack_blocks(batch: dict[str, list], block_size: int) -> dict[str, list]:
    """Concatenate the documents of the batch and cut them into blocks of block_size; the remainder is dropped."""
    stream = [token for doc in batch["input_ids"] for token in doc]
    blocks = [stream[i:i + block_size] for i in range(0, len(stream) - block_size + 1, block_size)]
    return {"input_ids": blocks, "labels": [list(b) for b in blocks]}


def is_text_pieces(rows: datasets.Dataset) -> bool:
    """Whether `rows` are pieces of .txt documents (distill/data/text_files.py) rather than whole documents."""
    return set(PIECE_COLUMNS) <= set(rows.column_names)


def text_rows(rows: datasets.Dataset, cfg: DataConfig, tokenizer: PreTrainedTokenizerBase) -> datasets.Dataset:
    """Packed blocks {input_ids, labels} of exactly max_length tokens."""
    if is_text_pieces(rows):
        tokenize, fn_kwargs = tokenize_pieces, {"tokenizer": tokenizer}
    else:
        tokenize, fn_kwargs = tokenize_documents, {"tokenizer": tokenizer, "field": cfg.text_field}
    documents = rows.map(tokenize, batched=True, remove_columns=rows.column_names, num_proc=cfg.num_proc,
                         fn_kwargs=fn_kwargs, desc="tokenize")
    return documents.map(pack_blocks, batched=True, num_proc=cfg.num_proc, fn_kwargs={"block_size": cfg.max_length},
                         desc=f"pack into {cfg.max_length}-token blocks")


# ---------------------------------------------------------------------------------------------------------------
# Chat: template, then labels on assistant tokens only
# ---------------------------------------------------------------------------------------------------------------

def _render(tokenizer: PreTrainedTokenizerBase, messages: list[dict], generation_prompt: bool) -> str:
    if not messages:
        return ""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_spans(messages: list[dict], tokenizer: PreTrainedTokenizerBase) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans [start, end) of its assistant turns.

    A turn starts after the generation prompt that precedes it and ends where the conversation up to and including
    it ends (so the template's end-of-turn tokens are targets too). Raises DataError if the template renders a
    conversation differently from its prefixes (then spans cannot be found by rendering prefixes).
    """
    text = _render(tokenizer, messages, generation_prompt=False)
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before = _render(tokenizer, messages[:i], generation_prompt=True)
        through = _render(tokenizer, messages[: i + 1], generation_prompt=False)
        if not (text.startswith(before) and text.startswith(through)):
            raise DataError("the chat template renders a conversation differently from its prefixes, so assistant "
                            "tokens cannot be located; use a prefix-stable template (data.format=text avoids it)")
        spans.append((len(before), len(through)))
    return text, spans


def chat_example(messages: list[dict], tokenizer: PreTrainedTokenizerBase, max_length: int) -> dict[str, list]:
    """{input_ids, labels} of one conversation, truncated to max_length; labels -100 outside assistant turns."""
    text, spans = assistant_spans(messages, tokenizer)
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, truncation=True,
                         max_length=max_length)
    ids = encoding["input_ids"]
    in_assistant = [any(start <= a < end for start, end in spans) for a, _ in encoding["offset_mapping"]]
    return {"input_ids": ids, "labels": [t if keep else IGNORE_INDEX for t, keep in zip(ids, in_assistant)]}


def _chat_batch(batch: dict[str, list], tokenizer: PreTrainedTokenizerBase, field: str,
                max_length: int) -> dict[str, list]:
    examples = [chat_example(m or [], tokenizer, max_length) for m in batch[field]]
    return {"input_ids": [e["input_ids"] for e in examples], "labels": [e["labels"] for e in examples]}


def chat_rows(rows: datasets.Dataset, cfg: DataConfig, tokenizer: PreTrainedTokenizerBase) -> datasets.Dataset:
    """One {input_ids, labels} row per conversation that keeps at least one assistant token after truncation."""
    if tokenizer.chat_template is None:
        raise DataError(f"data.format is chat but tokenizer {tokenizer.name_or_path!r} has no chat template")
    examples = rows.map(_chat_batch, batched=True, remove_columns=rows.column_names, num_proc=cfg.num_proc,
                        fn_kwargs={"tokenizer": tokenizer, "field": cfg.messages_field, "max_length": cfg.max_length},
                        desc="apply chat template")
    return examples.filter(lambda labels: any(t != IGNORE_INDEX for t in labels), input_columns="labels",
                           num_proc=cfg.num_proc, desc="keep rows with assistant tokens")


# ---------------------------------------------------------------------------------------------------------------
# Acceptance prompts
# ---------------------------------------------------------------------------------------------------------------

def read_eval_prompts(path: str) -> list[PromptRow]:
    """Prompt rows of a .jsonl ('prompt' or 'messages', optional 'category') or .txt file, read as
    eval_acceptance reads them (decode.inputs.prompts). Raises DataError naming the key and the file."""
    try:
        return read_prompt_rows(path)
    except LoadError as err:
        raise DataError(f"data.eval_prompts: {err}") from None


def as_prompt_row(item: Any, fmt: str, category: str | None = None) -> PromptRow:
    """A held-out item (text, a conversation, or a PromptRow of a file) as a PromptRow; in a chat-format run a plain
    prompt is one user turn, since the draft is trained on conversations."""
    if isinstance(item, PromptRow):
        if fmt == "chat" and not item.is_conversation:
            return PromptRow(messages=({"role": "user", "content": item.text},), category=item.category)
        return item
    if isinstance(item, str):
        return as_prompt_row(PromptRow(text=item, category=category), fmt)
    try:
        return PromptRow(messages=prompt_messages(item, "a held-out conversation"), category=category)
    except LoadError as err:
        raise DataError(f"data.eval_prompts: {err}") from None


def prompt_ids(row: PromptRow, tokenizer: PreTrainedTokenizerBase, max_tokens: int,
               chat_template: str = "auto") -> torch.Tensor:
    """1-D token ids of one prompt (decode.inputs.prompts renders it): raw text keeps its first max_tokens tokens;
    templated text keeps its last max_tokens so the generation prompt survives."""
    ids = prompt_token_ids(tokenizer, row, chat_template)
    kept = ids[-max_tokens:] if uses_template(tokenizer, row, chat_template) else ids[:max_tokens]
    return torch.tensor(kept, dtype=torch.long)


def eval_prompt_set(items: list[Any], fmt: str, tokenizer: PreTrainedTokenizerBase, max_tokens: int,
                    chat_template: str = "auto",
                    categories: list[str | None] | None = None) -> tuple[list[torch.Tensor], list[str | None]]:
    """Token-id prompts for decode.measure.evaluate.evaluate_acceptance and their categories; empty prompts
    are dropped."""
    try:
        check_chat_template(tokenizer, chat_template, option="eval.chat_template")
    except LoadError as err:
        raise DataError(str(err)) from None
    rows = [as_prompt_row(item, fmt, (categories or [None] * len(items))[i]) for i, item in enumerate(items)]
    kept = [(prompt_ids(row, tokenizer, max_tokens, chat_template), row.category) for row in rows]
    kept = [(ids, category) for ids, category in kept if ids.numel() > 0]
    return [ids for ids, _ in kept], [category for _, category in kept]


def eval_prompts(items: list[Any], fmt: str, tokenizer: PreTrainedTokenizerBase, max_tokens: int,
                 chat_template: str = "auto") -> list[torch.Tensor]:
    """Token-id prompts for decode.measure.evaluate.evaluate_acceptance; empty prompts are dropped."""
    return eval_prompt_set(items, fmt, tokenizer, max_tokens, chat_template)[0]


def held_in_prompts(rows: datasets.Dataset, count: int, max_tokens: int, seed: int = 0) -> list[torch.Tensor]:
    """``count`` prompts of the training rows themselves (1-D token ids), for acceptance measured on what the draft
    trained on beside the held-out prompts: rows drawn with ``seed``, each one's tokens before its first trained label
    (a conversation's prompt, its last ``max_tokens`` tokens), or for a row trained from its first token (packed
    text) its first ``max_tokens`` tokens. Rows with nothing before their labels and a single token are skipped."""
    if count <= 0 or len(rows) == 0:
        return []
    rows = rows.select_columns(["input_ids", "labels"])  # not the cached teacher or hidden states
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed)).tolist()
    prompts = []
    for index in order:
        row = rows[index]
        ids, labels = list(row["input_ids"]), list(row["labels"])
        first = next((i for i, label in enumerate(labels) if label != IGNORE_INDEX), len(ids))
        prompt = ids[max(0, first - max_tokens):first] if first > 0 else ids[:min(max_tokens, len(ids) - 1)]
        if prompt:
            prompts.append(torch.tensor(prompt, dtype=torch.long))
        if len(prompts) == count:
            break
    return prompts


def padding_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id that fills padded positions: pad, else eos (Llama 3 has no pad token); padding is masked anyway."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


@dataclass
class DistillCollator:
    """Right-pads rows {input_ids, labels} into a batch {input_ids, attention_mask, labels} [B, T]; with
    ``every_token`` (data.loss_tokens all) every real token is a label, the rows' prompts too (padding never)."""

    pad_token_id: int
    every_token: bool = False

    def __call__(self, rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        width = max(len(r["input_ids"]) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)  # [B, T]
        labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)  # [B, T]
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)  # [B, T]
        for i, row in enumerate(rows):
            n = len(row["input_ids"])
            input_ids[i, :n] = torch.tensor(row["input_ids"])
            labels[i, :n] = torch.tensor(row["input_ids"] if self.every_token else row["labels"])
            attention_mask[i, :n] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
