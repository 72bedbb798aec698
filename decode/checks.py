"""File checks made before anything heavy runs: outputs that can be written, weights and tokenizers that are whole.

Each check raises FileProblem (a ValueError) whose message names the path (and the flag or recipe key given as
`what`), so command-line tools can print it as one line.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

# Files any transformers tokenizer folder holds at least one of.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


class FileProblem(ValueError):
    """A path given by the user cannot be used; the message names the flag or key and the path."""


def check_writable_file(path: str | Path, what: str) -> None:
    """A file can be created (or replaced) at `path`: not a folder, its nearest existing parent a writable folder."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise FileProblem(f"{what}: {path} is a folder; give a file path")
    parent = _nearest_existing(path.parent)
    if not parent.is_dir():
        raise FileProblem(f"{what}: cannot create {path}: {parent} is a file, not a folder")
    if path.exists() and not os.access(path, os.W_OK):
        raise FileProblem(f"{what}: {path} is not writable")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise FileProblem(f"{what}: cannot create {path}: folder {parent} is not writable")


def check_writable_folder(path: str | Path, what: str) -> None:
    """A folder exists at `path` or can be created there, and files can be written in it."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise FileProblem(f"{what}: {path} is a file, not a folder")
    existing = _nearest_existing(path)
    if not existing.is_dir():
        raise FileProblem(f"{what}: cannot create folder {path}: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise FileProblem(f"{what}: folder {existing} is not writable")


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_safetensors_whole(folder: str | Path, what: str) -> None:
    """Every *.safetensors file in a local model folder is as long as its header says (not truncated)."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    for file in sorted(folder.glob("*.safetensors")):
        size = file.stat().st_size
        try:
            with file.open("rb") as f:
                (header_size,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(header_size)) if 8 + header_size <= size else None
        except (struct.error, ValueError, UnicodeDecodeError):
            header = None
        if header is None:
            raise FileProblem(f"{what}: {file} is not a readable safetensors file (truncated or corrupt header)")
        # data ends at the largest end offset of any tensor, after the 8-byte length and the JSON header
        needed = 8 + header_size + max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"),
                                       default=0)
        if size < needed:
            raise FileProblem(f"{what}: {file} is truncated ({size} bytes, its header needs {needed}); "
                              "copy or download it again")


def check_tokenizer_files(folder: str | Path, what: str, hint: str) -> None:
    """A local folder used as a tokenizer holds tokenizer files (else transformers asks for sentencepiece)."""
    folder = Path(folder)
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise FileProblem(f"{what}: {folder} holds no tokenizer files ({', '.join(TOKENIZER_FILES[:4])}); {hint}")


class OneLineArgumentParser:
    """Mixin for argparse.ArgumentParser: a usage error is one line `PROG: error: ...` and exit status 1
    (argparse prints the usage block and exits 2)."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        import sys

        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(1)
