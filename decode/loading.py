"""Loading targets, drafts, tokenizers and prompt files, with one-line errors for what users get wrong."""
from __future__ import annotations

import json
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


class LoadError(ValueError):
    """A model, tokenizer or prompt file could not be loaded; the message says which and why."""


def first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


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
    """``AutoModelForCausalLM.from_pretrained`` in eval mode on ``device``; LoadError if it cannot be found."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        where = "a local directory without a model" if Path(name).is_dir() else "not a local directory"
        raise LoadError(f"could not load model {name!r}: {where}, and not loadable from the Hub "
                        f"({first_line(err)})") from None
    return model.to(device).eval()


def load_tokenizer(name: str, required: bool = True):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError, TypeError) as err:
        if not required:
            return None
        raise LoadError(f"could not load a tokenizer from {name!r}: {first_line(err)}") from None


def read_prompts(path: str | Path, limit: int | None = None) -> list[str]:
    """Prompts from a .jsonl file (a ``prompt`` field per line) or a .txt file (one prompt per line)."""
    path = Path(path)
    if not path.is_file():
        raise LoadError(f"prompts file {str(path)!r} does not exist")
    if path.suffix == ".json":  # a JSON array would otherwise be read as lines of text
        raise LoadError(f"prompts file {str(path)!r}: .json is not read; use .jsonl (one {{\"prompt\": ...}} per "
                        "line) or .txt (one prompt per line)")
    prompts: list[str] = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            if path.suffix == ".jsonl":
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise LoadError(f"{path}:{line_no}: not valid JSON ({err.msg})") from None
                if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                    fields = ", ".join(row) if isinstance(row, dict) else type(row).__name__
                    raise LoadError(f"{path}:{line_no}: each line needs a string field 'prompt' (found: {fields})")
                prompts.append(row["prompt"])
            else:
                prompts.append(line.rstrip("\n").replace("\\n", "\n"))
    prompts = [p for p in prompts if p.strip()]
    if not prompts:
        raise LoadError(f"prompts file {str(path)!r} contains no prompts")
    return prompts[:limit] if limit else prompts


def encode_prompts(tokenizer, prompts: list[str], max_prompt_tokens: int | None = None) -> list[torch.Tensor]:
    """Token ids [L] per prompt (BOS added as the tokenizer does), keeping the last ``max_prompt_tokens``."""
    encoded = []
    for text in prompts:
        ids = tokenizer(text, return_tensors="pt").input_ids[0]
        if ids.numel() == 0:
            raise LoadError(f"prompt {text[:40]!r} encodes to no tokens")
        encoded.append(ids[-max_prompt_tokens:] if max_prompt_tokens else ids)
    return encoded
