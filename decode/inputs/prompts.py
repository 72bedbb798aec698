"""Evaluation prompts as a deployed draft meets them: rows from a file, a local dataset folder or a hub dataset,
rendered with the target's chat template when they are conversations, each with an optional category.

    rows = read_prompt_rows("question.jsonl", messages_field="turns", category_field="category")
    ids = encode_prompt_rows(tokenizer, rows, chat_template="auto", max_prompt_tokens=1024)   # [L] per row

A row is a plain prompt (``text``) or a conversation (``messages``), plus an optional ``category``.

Conversations (the multi-turn rule, deterministic): the prompt is the conversation up to and including its last
user turn; the earlier user turns stay answered by the row's own assistant turns, and whatever follows the last
user turn (a reference answer) is dropped; the template's generation prompt is appended. A list of plain strings
(the user's turns with no answers, as MT-bench's ``prompt`` and Spec-Bench's ``turns``) keeps its first turn only:
the later turns would need the target's own answer to the first.

chat_template: ``on`` renders every row with the target tokenizer's chat template (a plain prompt becomes one user
turn; a tokenizer without a template is an error); ``off`` tokenises raw text (a conversation becomes its turns'
contents joined by blank lines); ``auto`` is ``on`` for a conversation when the tokenizer has a template, else
``off``. Templated text already holds the template's special tokens, so none are added when it is tokenised.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from decode.inputs.checks import FileProblem, check_text_file, read_text
from decode.inputs.command_line import CHAT_TEMPLATE_MODES
from decode.inputs.data_files import (
    DATA_FILE_BUILDERS,
    TEXT_DATA_SUFFIXES,
    cache_write_problem,
    first_bad_json_line,
    first_empty_file,
    own_error_lines,
)
from decode.inputs.loading import LoadError, first_line

PROMPT_FILE_SUFFIXES = (".jsonl", ".txt")  # read by read_prompt_file; other data files go through datasets
SAVED_DATASET_FILES = ("dataset_info.json", "state.json", "dataset_dict.json")  # Dataset(Dict).save_to_disk

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptRow:
    """One evaluation prompt: ``text`` or ``messages`` ([{role, content}], already cut by the multi-turn rule)."""

    text: str | None = None
    messages: tuple[dict, ...] | None = None
    category: str | None = None

    @property
    def is_conversation(self) -> bool:
        return self.messages is not None


@dataclass(frozen=True)
class PromptFields:
    """Which fields of a row hold the prompt, the conversation and the category. A field left None is looked for
    under its default name; a field named explicitly must exist. Dotted names reach into dicts
    (``translation.de``). ``prompt_flag``: how the caller names another prompt field (`--prompt-field`), so that a
    row without the prompt field is answered with the flag for one of the string fields it has."""

    prompt_field: str | None = None
    messages_field: str | None = None
    category_field: str | None = None
    prompt_flag: str | None = None

    DEFAULTS = {"prompt_field": "prompt", "messages_field": "messages", "category_field": "category"}


# ---------------------------------------------------------------------------------------------------------------
# Conversations: the multi-turn rule
# ---------------------------------------------------------------------------------------------------------------

def prompt_messages(value: Any, where: str) -> tuple[dict, ...]:
    """The messages a conversation's prompt keeps (see module docstring); LoadError naming ``where`` if unusable."""
    if isinstance(value, list) and value and all(isinstance(turn, str) for turn in value):
        return ({"role": "user", "content": value[0]},)  # the user's turns only: answering them needs the target
    if not isinstance(value, list) or not all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                              and isinstance(m.get("role"), str) for m in value):
        raise LoadError(f"{where}: a conversation must be a list of {{'role', 'content'}} messages or of strings")
    last_user = max((i for i, m in enumerate(value) if m["role"] == "user"), default=None)
    if last_user is None:
        raise LoadError(f"{where}: the conversation has no user turn to answer")
    return tuple({"role": m["role"], "content": m["content"]} for m in value[: last_user + 1])


def field_value(row: dict, name: str) -> Any:
    """``row[name]``, following dots into nested dicts (``translation.de``); None when absent."""
    value: Any = row
    for part in name.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def to_prompt_row(row: Any, fields: PromptFields, where: str) -> PromptRow:
    """A PromptRow from one raw row (a dict of a .jsonl line or of a dataset); LoadError naming ``where``."""
    if not isinstance(row, dict):
        raise LoadError(f"{where}: each row must be a JSON object (found: {type(row).__name__})")
    messages_name = fields.messages_field or PromptFields.DEFAULTS["messages_field"]
    prompt_name = fields.prompt_field or PromptFields.DEFAULTS["prompt_field"]
    category_name = fields.category_field or PromptFields.DEFAULTS["category_field"]
    category = field_value(row, category_name)
    if category is None and fields.category_field is not None:
        raise LoadError(f"{where}: no category field {category_name!r} (found: {', '.join(row)})")
    category = None if category is None else str(category)
    conversation = field_value(row, messages_name) if fields.prompt_field is None else None
    if conversation is not None:
        return PromptRow(messages=prompt_messages(conversation, where), category=category)
    text = field_value(row, prompt_name) if fields.messages_field is None else None
    if not isinstance(text, str):
        found = ", ".join(row)
        if fields.messages_field is not None:
            raise LoadError(f"{where}: each line needs a list field {messages_name!r} (found: {found})")
        strings = [name for name, value in row.items() if isinstance(value, str) and value.strip()]
        raise LoadError(f"{where}: each line needs a string field {prompt_name!r} (found: {found})"
                        + ("" if fields.prompt_field else f"; a conversation needs a list field {messages_name!r}")
                        + (f"; {fields.prompt_flag} {strings[0]} reads its {strings[0]!r} field"
                           if fields.prompt_flag and strings and fields.messages_field is None else ""))
    return PromptRow(text=text, category=category)


# ---------------------------------------------------------------------------------------------------------------
# Sources: a .jsonl / .txt file, a local dataset folder, a hub dataset id
# ---------------------------------------------------------------------------------------------------------------

def read_prompt_file(path: Path, fields: PromptFields) -> list[PromptRow]:
    """Rows of a .jsonl file (one JSON object per line) or a .txt file (one plain prompt per line, ``\\n``
    written as the two characters backslash-n). LoadError naming the file when its bytes are not text."""
    rows = []
    for line_no, line in enumerate(_prompt_text(path).split("\n"), 1):
        if not line.strip():
            continue
        if path.suffix != ".jsonl":
            rows.append(PromptRow(text=line.replace("\\n", "\n")))
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as err:
            raise LoadError(f"{path}:{line_no}: not valid JSON ({err.msg})") from None
        rows.append(to_prompt_row(raw, fields, f"{path}:{line_no}"))
    return rows


def _prompt_text(path: Path) -> str:
    """The text of a prompt file (decode.inputs.checks.read_text), its problems raised as LoadError."""
    try:
        return read_text(path, "prompts file")
    except FileProblem as err:
        raise LoadError(str(err)) from None


def load_prompt_dataset(source: str, split: str, config: str | None):
    """A ``datasets.Dataset``: a folder written by ``save_to_disk``, else ``load_dataset(source)`` (a local folder
    of data files or a hub id). LoadError with one line when it cannot be loaded or has no such split."""
    import datasets

    try:
        if Path(source).is_file():  # a .json / .csv / .parquet file: one split, whatever --prompts-split says
            if Path(source).suffix != ".parquet":
                check_text_file(source, "prompts file")  # datasets' message for a binary file names no file
            with own_error_lines():  # a malformed file: named below in one line, file and line
                return datasets.load_dataset(DATA_FILE_BUILDERS[Path(source).suffix], data_files=source,
                                             split="train")
        if Path(source).is_dir() and any((Path(source) / name).is_file() for name in SAVED_DATASET_FILES):
            loaded = datasets.load_from_disk(source)  # Arrow files: binary by design
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise LoadError(f"prompt dataset {source!r} has no split {split!r} (splits: {', '.join(loaded)})")
                loaded = loaded[split]
            return loaded
        if Path(source).is_dir():  # a folder of data files: datasets reads those it knows by their suffix
            for file in sorted(Path(source).rglob("*")):
                if file.suffix in TEXT_DATA_SUFFIXES:
                    check_text_file(file, "prompts file")
        return datasets.load_dataset(source, config, split=split)
    except (datasets.exceptions.DatasetsError, FileNotFoundError, ConnectionError, ValueError, OSError) as err:
        if isinstance(err, (LoadError, FileProblem)):
            raise LoadError(str(err)) from None
        cache = cache_write_problem(err) if isinstance(err, OSError) else None
        if cache:
            raise LoadError(f"prompts {source}: {cache}") from None
        if Path(source).is_file():  # name the empty file or the bad line that datasets' generic message hides
            problem = first_bad_json_line([source]) or (f"{source} is empty" if first_empty_file([source]) else None)
            if problem:
                raise LoadError(f"prompts file {problem}") from None
        raise LoadError(f"could not load prompt dataset {source!r} (split {split!r}): {first_line(err)}") from None


def read_prompt_dataset(source: str, fields: PromptFields, split: str = "train",
                        config: str | None = None) -> list[PromptRow]:
    """Rows of a dataset (see load_prompt_dataset); a field named explicitly must be one of its columns."""
    dataset = load_prompt_dataset(source, split, config)
    columns = list(dataset.column_names)
    for flag, name in (("--prompt-field", fields.prompt_field), ("--messages-field", fields.messages_field),
                       ("--category-field", fields.category_field)):
        if name is not None and name.split(".")[0] not in columns:
            raise LoadError(f"{flag} {name!r} is not a column of prompt dataset {source!r} (columns: "
                            f"{', '.join(columns)})")
    return [to_prompt_row(row, fields, f"{source} row {i}") for i, row in enumerate(dataset)]


def looks_like_file(source: str) -> bool:
    return source.endswith(tuple(DATA_FILE_BUILDERS)) or source.startswith((".", "/", "~"))


def read_prompt_rows(source: str | Path, fields: PromptFields | None = None, *, split: str = "train",
                     config: str | None = None, limit: int | None = None) -> list[PromptRow]:
    """Prompt rows from a .jsonl/.txt file, a .json/.csv/.parquet file, a local dataset folder, or a hub dataset
    id; the first ``limit``.

    Raises LoadError (one line naming the file, line, field or column) for a missing file, bad JSON, a row
    without a prompt, an unknown field, or no prompts at all."""
    fields = fields or PromptFields()
    source = str(source)
    path = Path(source).expanduser()
    if path.is_file() and (path.suffix in PROMPT_FILE_SUFFIXES or path.suffix not in DATA_FILE_BUILDERS):
        rows = read_prompt_file(path, fields)
    elif path.is_file() or path.is_dir() or not looks_like_file(source):
        rows = read_prompt_dataset(source, fields, split=split, config=config)
    else:
        raise LoadError(f"prompts file {source!r} does not exist")
    kept = [r for r in rows if (r.text or "").strip() or r.is_conversation]
    if not kept:
        raise LoadError(f"prompts file {source!r} contains no prompts")
    if len(kept) < len(rows):  # said, not silently dropped: the measured count differs from the file's rows
        logger.warning("%s: %d empty prompt%s skipped (%d kept)", source, len(rows) - len(kept),
                       "" if len(rows) - len(kept) == 1 else "s", len(kept))
    return kept[:limit] if limit else kept


# ---------------------------------------------------------------------------------------------------------------
# Rendering and tokenising
# ---------------------------------------------------------------------------------------------------------------

def check_chat_template(tokenizer, mode: str, option: str = "--chat-template") -> None:
    """LoadError unless ``mode`` is auto/on/off, and for ``on`` with a tokenizer that has no chat template."""
    if mode not in CHAT_TEMPLATE_MODES:
        raise LoadError(f"{option} must be one of {', '.join(CHAT_TEMPLATE_MODES)}, got {mode!r}")
    if mode == "on" and not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise LoadError(f"{option} on, but tokenizer {name!r} has no chat template")


def uses_template(tokenizer, row: PromptRow, mode: str) -> bool:
    """Whether ``row`` is rendered with the chat template under ``mode`` (see module docstring)."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    return mode == "on" or (mode == "auto" and row.is_conversation and has_template)


def raw_prompts_note(tokenizer, rows: Sequence[PromptRow], mode: str, option: str = "--chat-template") -> str | None:
    """One line when ``auto`` gives a chat model plain prompts as raw text (a chat endpoint would serve each as a user
    turn, and a head trained on templated rows accepts less on raw ones); None when nothing is left raw."""
    raw = sum(not row.is_conversation for row in rows)
    if mode != "auto" or not raw or not getattr(tokenizer, "chat_template", None):
        return None
    return (f"note: {raw} of {len(rows)} prompts are plain text and go to the target raw ({option} auto templates "
            f"conversations only); {option} on serves each as one user turn of the target's chat template")


def render_prompt(tokenizer, row: PromptRow, mode: str) -> tuple[str, bool]:
    """(the text the target is given, whether it is templated) for one row under chat-template ``mode``."""
    if uses_template(tokenizer, row, mode):
        messages = list(row.messages) if row.is_conversation else [{"role": "user", "content": row.text}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text, True
    if row.is_conversation:
        return "\n\n".join(m["content"] for m in row.messages), False
    return row.text, False


def prompt_token_ids(tokenizer, row: PromptRow, mode: str) -> list[int]:
    """Token ids of one rendered row: templated text as is, raw text with the tokenizer's own special tokens."""
    text, templated = render_prompt(tokenizer, row, mode)
    return tokenizer(text, add_special_tokens=not templated)["input_ids"]


def encode_prompt_rows(tokenizer, rows: Sequence[PromptRow], chat_template: str = "auto",
                       max_prompt_tokens: int | None = None) -> list[torch.Tensor]:
    """Token ids [L] per row, keeping the last ``max_prompt_tokens`` (so a generation prompt survives)."""
    check_chat_template(tokenizer, chat_template)
    encoded = []
    for row in rows:
        ids = prompt_token_ids(tokenizer, row, chat_template)
        if not ids:
            shown = row.text if row.text is not None else row.messages[-1]["content"]
            raise LoadError(f"prompt {shown[:40]!r} encodes to no tokens")
        ids = ids[-max_prompt_tokens:] if max_prompt_tokens else ids
        encoded.append(torch.tensor(ids, dtype=torch.long))
    return encoded
