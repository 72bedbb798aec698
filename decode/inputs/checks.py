"""Input checks made before anything heavy runs: outputs that can be written, weights and tokenizers that are whole,
files that are text, and the architectures a model folder's config names.

Each check raises FileProblem (a ValueError) whose message names the path (and the flag or recipe key given as
`what`), so command-line tools can print it as one line. Every file the commands read as text goes through
`read_text` (or `check_text_file` where a library reads it): bytes that are not UTF-8 text (binary, UTF-16, an
image renamed .txt) are one line naming the file, never a UnicodeDecodeError. Files that must never be seen half
written go through decode.inputs.writes.write_atomic; command-line parsers are decode.inputs.command_line's.
"""
from __future__ import annotations

import codecs
import json
import os
import struct
from dataclasses import dataclass
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


@dataclass(frozen=True)
class SafetensorsHeader:
    """What a safetensors file's header says: its tensors and where their bytes lie."""

    tensors: dict[str, dict]  # name -> {"dtype", "shape", "data_offsets"} (offsets from data_start; no __metadata__)
    data_start: int           # 8-byte length + the JSON header: where the first tensor's bytes begin

    @property
    def data_end(self) -> int:
        """The byte the file must reach: after the largest end offset of any tensor."""
        return self.data_start + max((t["data_offsets"][1] for t in self.tensors.values()), default=0)


def safetensors_header(path: str | Path, what: str = "") -> SafetensorsHeader:
    """The header of a safetensors file (8-byte little-endian length, then that many bytes of JSON), read without
    loading any weight: the one reader of safetensors headers. Raises FileProblem (naming `what` and the file) when
    the header is cut short, not JSON or not a JSON object."""
    path = Path(path)
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            (header_size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_size)) if 8 + header_size <= size else None
    except (struct.error, ValueError):  # shorter than 8 bytes; bytes that are not (UTF-8) JSON
        header = None
    if not isinstance(header, dict):
        raise FileProblem(f"{what + ': ' if what else ''}{path} is not a readable safetensors file (truncated or "
                          "corrupt header)")
    header.pop("__metadata__", None)
    return SafetensorsHeader(tensors=header, data_start=8 + header_size)


def check_safetensors_whole(folder: str | Path, what: str) -> None:
    """Every *.safetensors file in a local model folder is as long as its header says (not truncated)."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    for file in sorted(folder.glob("*.safetensors")):
        size, needed = file.stat().st_size, safetensors_header(file, what).data_end
        if size < needed:
            raise FileProblem(f"{what}: {file} is truncated ({size} bytes, its header needs {needed}); "
                              "copy or download it again")


def check_language_model_folder(folder: str | Path, what: str) -> None:
    """A local folder given as a target holds a model transformers builds: its config.json's architectures are
    transformers classes, or the folder brings its own code (auto_map). A draft's folder (an EAGLE-3 or P-EAGLE
    head, a DFlash draft) names a class of its own and runs only next to its target: refused here, in one line,
    instead of loading as a model with half its weights missing."""
    config_file = Path(folder).expanduser() / "config.json"
    if not config_file.is_file():
        return
    try:
        config = json.loads(read_text(config_file))
    except ValueError:  # not JSON, or not text: check_json_files_text names it
        return
    if not isinstance(config, dict) or "auto_map" in config:
        return
    import transformers

    unknown = [name for name in architectures(config) if not hasattr(transformers, name)]
    if unknown:
        raise FileProblem(f"{what}: {folder} is not a model to draft for: its config.json's architectures "
                          f"{unknown[0]} is no transformers class (a draft's folder? a draft is given as the draft, "
                          "next to the model it drafts for)")


def check_tokenizer_files(folder: str | Path, what: str, hint: str) -> None:
    """A local folder used as a tokenizer holds tokenizer files (else transformers asks for sentencepiece)."""
    folder = Path(folder)
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise FileProblem(f"{what}: {folder} holds no tokenizer files ({', '.join(TOKENIZER_FILES[:4])}); {hint}")


# ---------------------------------------------------------------------------------------------------------------
# Text files
# ---------------------------------------------------------------------------------------------------------------

TEXT_CHUNK_BYTES = 1 << 20
UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)


def text_problem(path: str | Path) -> str | None:
    """Why the bytes of a file are not UTF-8 text (an invalid byte, or a NUL byte as in binary or UTF-16 files),
    else None. Reads the file in chunks, so a large corpus is checked in constant memory."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with Path(path).open("rb") as f:
        while chunk := f.read(TEXT_CHUNK_BYTES):
            if offset == 0 and chunk.startswith(UTF16_BOMS):
                return "it starts with a UTF-16 byte-order mark; save it as UTF-8"
            pending = len(decoder.getstate()[0])  # bytes of a character cut by the previous chunk
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as err:
                return f"byte {offset - pending + err.start}: {err.reason}"
            nul = chunk.find(b"\0")
            if nul >= 0:
                return f"a NUL byte at byte {offset + nul}: binary data or UTF-16"
            offset += len(chunk)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as err:
        return f"it ends inside a character: {err.reason}"
    return None


def check_text_file(path: str | Path, what: str | None = None) -> None:
    """Raise FileProblem naming `path` (and `what`: a flag, a recipe key or a kind of file) unless it is text."""
    problem = text_problem(path)
    if problem is not None:
        where = f"{what}: " if what else ""
        raise FileProblem(f"{where}{path} is not UTF-8 text ({problem})")


def read_text(path: str | Path, what: str | None = None) -> str:
    """The text of a UTF-8 file (line ends as Path.read_text gives them); FileProblem naming the file otherwise."""
    check_text_file(path, what)
    return Path(path).read_text(encoding="utf-8")


def check_json_files_text(folder: str | Path, what: str) -> None:
    """Every *.json file of a local model folder (config, tokenizer, generation config) is text."""
    folder = Path(folder)
    if folder.is_dir():
        for file in sorted(folder.glob("*.json")):
            check_text_file(file, what)


def architectures(config) -> list[str]:
    """The `architectures` a model config names: a config.json dict or a loaded config ([] when it names none)."""
    named = config.get("architectures") if isinstance(config, dict) else getattr(config, "architectures", None)
    return list(named or [])


def folder_architectures(path: str | Path) -> list[str]:
    """The `architectures` of a local model folder's config.json; [] for anything else (no folder, no config, a
    config that is not JSON text: loading it as a model names that problem)."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return []
    try:
        return architectures(json.loads(read_text(config_file)))
    except ValueError:  # not JSON, or not text (FileProblem)
        return []


# ---------------------------------------------------------------------------------------------------------------
# A model's context, as vLLM reads it from the config (vllm/config/model.py, _get_and_verify_max_len)
# ---------------------------------------------------------------------------------------------------------------
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length",
                "max_seq_length", "seq_len")  # vLLM takes the least of these a config sets
UNSCALED_ROPE = ("default", "su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def text_config(config):
    """The language model's part of a config (a multimodal config's text_config; the config itself otherwise)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def rope_type(config) -> str:
    """The rope scaling kind of a config: rope_parameters (transformers 5) or rope_scaling, 'default' if none."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        params = next(iter(params.values()))  # per-layer-type parameters (e.g. full/sliding attention)
    return str(params.get("rope_type", params.get("type", "default"))) if isinstance(params, dict) else "default"


def context_length(config, tokenizer=None) -> int | None:
    """The most positions a model takes, as vLLM derives its largest max_model_len: the least of the config's
    CONTEXT_KEYS, capped by the tokenizer's model_max_length where that is set (transformers leaves ~1e30 when not).
    None when the config sets none of them, or scales RoPE by a factor vLLM multiplies in (linear, dynamic): that
    length is left to vLLM to derive."""
    text = text_config(config)
    lengths = [int(n) for n in (getattr(text, key, None) for key in CONTEXT_KEYS)
               if isinstance(n, (int, float)) and not isinstance(n, bool) and n > 0]
    if not lengths or rope_type(text) not in UNSCALED_ROPE:
        return None
    tokenizer_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tokenizer_max, int) and 0 < tokenizer_max < 10**9:
        lengths.append(tokenizer_max)
    return min(lengths)
