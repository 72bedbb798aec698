"""Loading targets, drafts and tokenizers, with one-line errors for what users get wrong (prompt files:
decode/prompts.py)."""
from __future__ import annotations

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
