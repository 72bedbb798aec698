"""Plain-text files (.txt) as training text: read as text, not as a list of lines.

data.text_sample_by says what one document of a .txt file is:
  document   the whole file (default): its line breaks are kept, no eos inside it, one eos after it (so one eos
             between consecutive files). A large file is read in pieces of about TEXT_PIECE_CHARS characters cut at
             line ends; each piece is tokenised on its own, so the token stream can differ from the whole file's
             encoding only where two pieces meet.
  paragraph  each run of non-blank lines (blank lines separate documents); eos after each.
  line       each non-empty line, without its line break; eos after each (what datasets' text builder gives).

Rows are {"text", "first", "last"}: `first` marks the start of a document (the tokenizer's own leading special
tokens, e.g. bos, go there), `last` its end (eos goes there). They are written by datasets.Dataset.from_generator,
so a corpus larger than memory streams through to disk; its cache key includes each file's size and mtime.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Literal

import datasets
from transformers import PreTrainedTokenizerBase

SampleBy = Literal["document", "paragraph", "line"]
PIECE_COLUMNS = ("text", "first", "last")
TEXT_PIECE_CHARS = 1 << 20  # ~1M characters per piece of a large file


class TextFileError(ValueError):
    """A .txt file cannot be read as UTF-8 text; the message names the file."""


def read_pieces(path: str, piece_chars: int) -> Iterator[str]:
    """Consecutive pieces of the file, each ending at a line end once it holds >= piece_chars characters;
    "".join(pieces) is the file's text exactly (line endings untouched). Raises TextFileError naming the file."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            lines: list[str] = []
            size = 0
            for line in f:
                lines.append(line)
                size += len(line)
                if size >= piece_chars:
                    yield "".join(lines)
                    lines, size = [], 0
            if lines:
                yield "".join(lines)
    except UnicodeDecodeError as err:
        raise TextFileError(f"{path} is not UTF-8 text (byte {err.start}: {err.reason})") from None


def document_rows(path: str, piece_chars: int) -> Iterator[dict]:
    """The file as one document: its pieces, the first marked first and the last marked last."""
    pieces = read_pieces(path, piece_chars)
    current, first = next(pieces, None), True
    while current is not None:
        following = next(pieces, None)
        yield {"text": current, "first": first, "last": following is None}
        current, first = following, False


def paragraph_rows(path: str, piece_chars: int) -> Iterator[dict]:
    """One document per run of non-blank lines (its inner line breaks kept, the final one dropped)."""
    paragraph: list[str] = []
    for piece in read_pieces(path, piece_chars):
        for line in piece.splitlines(keepends=True):
            if line.strip():
                paragraph.append(line)
            elif paragraph:
                yield {"text": "".join(paragraph).rstrip("\r\n"), "first": True, "last": True}
                paragraph = []
    if paragraph:
        yield {"text": "".join(paragraph).rstrip("\r\n"), "first": True, "last": True}


def line_rows(path: str, piece_chars: int) -> Iterator[dict]:
    """One document per non-empty line, without its line break."""
    for piece in read_pieces(path, piece_chars):
        for line in piece.splitlines():
            if line.strip():
                yield {"text": line, "first": True, "last": True}


ROW_READERS = {"document": document_rows, "paragraph": paragraph_rows, "line": line_rows}


def _rows(files: list[str], sample_by: str, piece_chars: int, stamps: list[tuple[int, int]]) -> Iterator[dict]:
    del stamps  # only part of the cache key: a changed file is read again
    for path in files:
        yield from ROW_READERS[sample_by](path, piece_chars)


def load_text_files(files: list[str], sample_by: SampleBy, piece_chars: int | None = None) -> datasets.Dataset:
    """Rows {text, first, last} of the .txt `files`, in order (see the module docstring).

    Raises TextFileError (as the cause of datasets' DatasetGenerationError) for a file that is not UTF-8."""
    stamps = [(os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files]
    features = datasets.Features({"text": datasets.Value("string"), "first": datasets.Value("bool"),
                                  "last": datasets.Value("bool")})
    return datasets.Dataset.from_generator(
        _rows, features=features,
        gen_kwargs={"files": files, "sample_by": sample_by, "piece_chars": piece_chars or TEXT_PIECE_CHARS,
                    "stamps": stamps})


def tokenize_pieces(batch: dict[str, list], tokenizer: PreTrainedTokenizerBase) -> dict[str, list]:
    """Token ids of each row: the tokenizer's leading special tokens only where a document starts, eos only where
    it ends (a tokenizer that appends eos itself has it removed inside a document)."""
    eos = tokenizer.eos_token_id
    ids: list[list[int]] = [[] for _ in batch["text"]]
    for starts in (True, False):  # one batched call per kind of row
        index = [i for i, first in enumerate(batch["first"]) if first == starts]
        if index:
            encoded = tokenizer([batch["text"][i] for i in index], add_special_tokens=starts)["input_ids"]
            for i, row in zip(index, encoded):
                ids[i] = row
    out = []
    for row, last in zip(ids, batch["last"]):
        if not last and row and row[-1] == eos:
            row = row[:-1]
        if last and (not row or row[-1] != eos):
            row = row + [eos]
        out.append(row)
    return {"input_ids": out}
