"""Loading targets, drafts and tokenizers, with one-line errors for what users get wrong (prompt files:
decode/inputs/prompts.py). A model path is a local folder, a hub id or a .gguf file; `resolve_model_path` turns the last
into its converted folder (decode/inputs/gguf.py), which every loader and vLLM then read; `resolve_draft_path` also
turns a draft's hub id into its downloaded folder, so that its kind is read from its config.json like a local one's."""
from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

import torch

from decode.inputs.gguf import GGUFProblem, gguf_folder, is_gguf_path

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


class LoadError(ValueError):
    """A model, tokenizer or prompt file could not be loaded; the message says which and why."""


def first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


def is_training_checkpoint(path: Path) -> bool:
    """A Trainer checkpoint folder (trainer_state.json, weights, no config.json): the run's export is its parent."""
    return (path / "trainer_state.json").is_file() and not (path / "config.json").is_file()


def not_found_where(name: str | os.PathLike) -> str:
    """Where a model that loaded from neither place was looked for, for its one-line error: a training checkpoint
    (its run's export named), a local folder without one, a file, a folder whose parent is local (most often a typo:
    the parent's folder of the closest name is offered, else its folders listed), or neither a local folder nor a
    repository on the Hub."""
    path = Path(name).expanduser()
    if is_training_checkpoint(path):
        return (f"a training checkpoint, not an exported model: {path.parent} holds the run's export (its best "
                f"checkpoint), {path.parent / 'acceptance.jsonl'} every checkpoint's acceptance")
    if path.is_dir():
        return "a local folder without a model"
    if path.is_file():
        return "a file, not a model folder (a model is a folder, a .gguf file or a hub id)"
    parent = path.parent
    if str(parent) not in ("", ".") and parent.is_dir():
        folders = sorted(p.name for p in parent.iterdir() if p.is_dir() and not p.name.startswith("."))
        close = difflib.get_close_matches(path.name, folders, n=1)
        shown = f"did you mean {parent / close[0]}?" if close else \
            f"{parent}/ holds " + (", ".join(folders[:8]) + (", ..." if len(folders) > 8 else "") or "no folders")
        return f"no such local folder ({shown}), and not found on the Hub"
    return "not a local folder, and not found on the Hub"


def load_failure(name: str | os.PathLike, err: Exception) -> str:
    """Why ``name`` could not be read, in one line: the error's first line, after where it was looked for when it is
    not a local model folder (a model folder's error says what it lacks; a training checkpoint's names its export)."""
    path = Path(name).expanduser()
    if path.is_dir() and not is_training_checkpoint(path):
        return first_line(err)
    return f"{not_found_where(name)} ({first_line(err)})"


def resolve_model_path(path: str | os.PathLike, what: str = "") -> str:
    """The name to load a model path from: a .gguf file's converted folder (converted on first use, then reused),
    any other path or hub id unchanged. Raises LoadError (one line, prefixed by ``what``, a flag or recipe key) for
    a missing .gguf, a file that is not a GGUF, a truncated one, or an architecture transformers cannot load."""
    if not is_gguf_path(path):
        return str(path)
    try:
        return str(gguf_folder(Path(path)))
    except GGUFProblem as err:
        cause = f" ({first_line(err.cause)})" if err.cause is not None else ""
        raise LoadError(f"{what}: {err}{cause}" if what else f"{err}{cause}") from None


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name, as the Hub spells repository ids
# what a draft's folder needs from its repository: configs, weights, tokenizer (not .bin / .pt / .gguf duplicates)
DRAFT_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.py"]


def resolve_draft_path(draft: str | os.PathLike, what: str = "--draft") -> str:
    """resolve_model_path for a draft, and a hub id (`RedHatAI/...-speculator.eagle3`, not a local path) as the folder
    of its files in the Hub cache (downloaded unless HF_HUB_OFFLINE=1 and cached already): a draft's kind is told by
    its config.json, which has to be on disk. Anything else (a local folder, "prompt-lookup") unchanged. LoadError
    (one line) for a hub id that is neither cached nor downloadable."""
    if is_gguf_path(draft) or Path(draft).expanduser().exists() or not HUB_ID.match(str(draft)):
        return resolve_model_path(draft, what)
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(str(draft), allow_patterns=DRAFT_FILES)
    except Exception as err:  # noqa: BLE001 - offline, unknown repo, gated, network: all one line
        raise LoadError(f"{what} {str(draft)!r}: {not_found_where(draft)} ({first_line(err)})") from None


def resolve_device(name: str | None) -> torch.device:
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise LoadError(f"--device {name} was asked for but CUDA is not available on this machine")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype | str:
    if name not in DTYPES:
        raise LoadError(f"unknown dtype {name!r}; choose from {sorted(DTYPES)}")
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def load_causal_lm(name: str, device: torch.device, dtype: torch.dtype | str, trust_remote_code: bool = False):
    """``AutoModelForCausalLM.from_pretrained`` in eval mode on ``device`` (a .gguf file: its converted folder,
    decode.inputs.gguf); LoadError if it cannot be found."""
    from transformers import AutoModelForCausalLM

    name = resolve_model_path(name)
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise LoadError(f"could not load model {name!r}: {not_found_where(name)} ({first_line(err)})") from None
    return model.to(device).eval()


def load_tokenizer(name: str, required: bool = True):
    """``AutoTokenizer.from_pretrained`` (a .gguf file: its converted folder's); LoadError, or None when not
    ``required``, if it cannot be loaded."""
    from transformers import AutoTokenizer

    name = resolve_model_path(name)
    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError, TypeError) as err:
        if not required:
            return None
        raise LoadError(f"could not load a tokenizer from {name!r}: {load_failure(name, err)}") from None
