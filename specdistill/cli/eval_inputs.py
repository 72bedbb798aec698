"""`specdistill-eval`'s inputs checked before any weight loads (a bad --draft is named before a large target takes
minutes to load): model paths, the draft's tokenizer, whether the draft fits the target, for the draft's kind; and
before vLLM starts, whether the prompts and new tokens fit the target's context."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from decode.deploy.deploy_check import load_target_config
from decode.inputs.checks import (
    check_json_files_text,
    check_language_model_folder,
    check_safetensors_whole,
    context_length,
)
from decode.inputs.loading import (
    LoadError,
    is_training_checkpoint,
    load_failure,
    load_tokenizer,
    not_found_where,
    resolve_draft_path,
    resolve_model_path,
)
from decode.inputs.vocab import check_tokenizers_compatible
from decode.loop.auto_gamma import fixed_gammas
from decode.serving.vllm_engine import check_context
from kinds import Kind


def with_model_folders(args: argparse.Namespace) -> argparse.Namespace:
    """A copy of ``args`` whose .gguf --target / --draft name their converted folders (decode.inputs.gguf: converted on
    first use) and whose hub-id --draft names its downloaded folder; LoadError for a bad GGUF file or an unknown
    hub id."""
    return argparse.Namespace(**{**vars(args), "target": resolve_model_path(args.target, "--target"),
                                 "draft": resolve_draft_path(args.draft, "--draft")})


def check_model_paths(args: argparse.Namespace, kind: Kind) -> None:
    """Local model folders exist and hold whole weights (no weights are loaded: a bad --draft is named before a
    large target takes minutes to load); a --draft of a ``kind`` without weights (prompt lookup) has none."""
    for flag, name in (("--target", args.target), ("--draft", args.draft)):
        if flag == "--draft" and not kind.has_weights:
            continue
        if name.startswith(("/", ".", "~")) and not Path(name).expanduser().exists():
            raise LoadError(f"could not load model {name!r} ({flag}): no such local folder")
        if Path(name).expanduser().is_file() or is_training_checkpoint(Path(name).expanduser()):  # .gguf: a folder
            raise LoadError(f"could not load model {name!r} ({flag}): {not_found_where(name)}")
        check_safetensors_whole(name, flag)
        check_json_files_text(name, flag)
        if flag == "--target":
            check_language_model_folder(name, flag)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_draft_tokenizer(args: argparse.Namespace, target_tokenizer, kind: Kind) -> None:
    """The draft's tokenizer (when it has one) matches the target's, checked before any weights load. A local folder
    without tokenizer files has none (a head or a DFlash draft saved alone: they use the target's vocabulary)."""
    folder = Path(args.draft).expanduser()
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return
    if kind.has_weights:
        draft_tokenizer = load_tokenizer(args.draft, required=False)
        if draft_tokenizer is not None:
            check_tokenizers_compatible(target_tokenizer, draft_tokenizer)


def check_draft_fits(args: argparse.Namespace, kind: Kind) -> None:
    """The draft can run next to the target (an EAGLE-3 head reads its hidden states and embedding), checked on the
    configs before any weights load. The draft's folder is checked already (check_model_paths), so a config that
    cannot be read is the target's: one line saying where it was looked for."""
    try:
        problem = kind.fit_problem(args.draft, args.target, args.trust_remote_code)
    except (OSError, ValueError) as err:
        raise LoadError(f"could not read the config of --target {args.target!r}: "
                        f"{load_failure(args.target, err)}") from None
    if problem:
        raise LoadError(f"--draft {args.draft} ({kind.name}) does not fit --target {args.target}: {problem}")


def check_context_fits(args: argparse.Namespace, tokenizer, prompt_ids: Sequence[torch.Tensor]) -> None:
    """The longest prompt and --max-new-tokens against the target's context (decode.inputs.checks.context_length):
    vLLM refuses a run past it, so --engine vllm / both stop here in one line before vLLM starts (ServingError); our
    decoder runs it, after a note (the target generates at positions it was not trained on)."""
    context = context_length(load_target_config(args.target, args.trust_remote_code), tokenizer)
    longest = max(ids.numel() for ids in prompt_ids)
    if args.engine != "specdistill":
        check_context(context, longest, args.max_new_tokens, max(fixed_gammas(args.gamma)))
    elif context is not None and longest + args.max_new_tokens > context:
        print(f"note: the longest prompt ({longest} tokens) and --max-new-tokens {args.max_new_tokens} reach position "
              f"{longest + args.max_new_tokens}, past the target's context of {context}: it generates where it was "
              "not trained (speculative decoding stays lossless there)", file=sys.stderr)
