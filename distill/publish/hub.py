"""Publish a trained draft model on the Hugging Face Hub: the model card (distill.publish.model_card) is written into
the model folder as README.md, then the folder's publishable files are uploaded in one commit.

    plan = push_to_hub(Path("out/draft"), repo_id="me/qwen-draft", dry_run=True)   # card written, nothing uploaded
    push_to_hub(Path("out/draft"), repo_id="me/qwen-draft")                          # card written + uploaded

The upload is ``HfApi.upload_folder(folder_path=model_dir, allow_patterns=plan.files)``: exactly the weights,
configs, tokenizer files, recipe.yaml, acceptance.jsonl, the eval JSON (copied next to them) and README.md; never
sub-folders (checkpoints/, runs/) or trainer state; nothing is staged or copied. A dry run returns the same plan.

The token is resolved by ``huggingface_hub`` (``HF_TOKEN`` or the local login); this module never passes, prints
or logs it, and scrubs the token (and anything token-shaped) from the error messages it writes.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2  # huggingface_hub's HTTP client: its transport errors are the network failing
from huggingface_hub import HfApi, ModelCard
from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError, OfflineModeIsEnabled

from decode.inputs.checks import check_text_file, read_text
from decode.inputs.loading import is_training_checkpoint, not_found_where
from decode.inputs.manifest import MANIFEST
from decode.inputs.writes import write_atomic
from distill.outputs.acceptance_log import ACCEPTANCE_LOG
from distill.publish.model_card import (
    CARD_TAGS,
    CardText,
    build_model_card,
    check_repo_id,
    eval_prompts,
    infer_target,
    load_eval_results,
)

__all__ = ["HubError", "UploadPlan", "check_repo_id", "describe_hub_failure", "push_to_hub", "upload_plan"]

# Top-level files of a training OUTPUT_DIR that make up the published model; sub-folders (checkpoints/, runs/)
# and trainer state (optimizer.pt, scheduler.pt, rng_state*.pth, training_args.bin) are never uploaded.
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json", "adapter_config.json")
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model", "chat_template.jinja", "chat_template.json",
)
RESULT_FILES = ("recipe.yaml", ACCEPTANCE_LOG, MANIFEST)  # the manifest: `specdistill check` verifies a download
CARD_FILE = "README.md"
EVAL_FILE = "eval_acceptance.json"  # the eval JSON's name when its own would clash with a model file
WEIGHTS_GLOB = "*.safetensors"

NETWORK_ERRORS = (httpx2.TransportError, ConnectionError, TimeoutError, socket.gaierror)
NETWORK_ERRNOS = (errno.ENETUNREACH, errno.ENETDOWN, errno.EHOSTUNREACH)  # plain OSErrors of a missing network
_TOKEN_SHAPE = re.compile(r"hf_[A-Za-z0-9]{6,}")


class HubError(RuntimeError):
    """The Hub could not be reached or refused the request; the message is one line and never holds a token."""


@dataclass(frozen=True)
class UploadPlan:
    """What is uploaded: ``files`` (names inside ``folder``, sorted), given to upload_folder as allow_patterns."""

    folder: Path
    files: list[str]


# ---------------------------------------------------------------------------------------------------------------
# What is published
# ---------------------------------------------------------------------------------------------------------------

def check_model_dir(model_dir: Path) -> list[Path]:
    """The safetensors weight files of ``model_dir``; FileNotFoundError if the folder or the weights are missing, or
    the folder is a training checkpoint (weights without a config: the run's export is its parent)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model folder {model_dir} does not exist")
    if is_training_checkpoint(model_dir):
        raise FileNotFoundError(f"{model_dir} is {not_found_where(model_dir)}: push that export")
    weights = sorted(model_dir.glob(WEIGHTS_GLOB))
    if not weights:
        raise FileNotFoundError(
            f"no {WEIGHTS_GLOB} weights in {model_dir}: pass the training OUTPUT_DIR that holds the final model "
            "(saved with save_pretrained)")
    return weights


def check_card_writable(model_dir: Path) -> None:
    """Raise FileExistsError when ``model_dir/README.md`` exists and is not a card specdistill wrote (it would be
    overwritten)."""
    card = Path(model_dir) / CARD_FILE
    if card.is_file():
        check_text_file(card)
    if card.is_file() and not set(CARD_TAGS) <= set(ModelCard.load(card).data.tags or []):
        raise FileExistsError(f"{card} exists and was not written by specdistill: move it away (the model card is "
                              "written there)")


def eval_file_name(model_dir: Path, eval_json: Path) -> str:
    """The name the eval JSON is published under: its own, unless that is a model file or README.md."""
    name = Path(eval_json).name
    taken = {p.name for p in check_model_dir(model_dir)} | set(MODEL_FILES + TOKENIZER_FILES + RESULT_FILES)
    return EVAL_FILE if name in taken | {CARD_FILE} else name


def upload_plan(model_dir: Path, eval_json: Path | None = None) -> UploadPlan:
    """The files of ``model_dir`` to publish: weights, model and tokenizer files and logs present, the eval JSON's
    name (``eval_file_name``) and README.md."""
    model_dir = Path(model_dir)
    named = [name for name in MODEL_FILES + TOKENIZER_FILES + RESULT_FILES if (model_dir / name).is_file()]
    files = [p.name for p in check_model_dir(model_dir)] + named + [CARD_FILE]
    if eval_json is not None:
        files.append(eval_file_name(model_dir, eval_json))
    return UploadPlan(model_dir, sorted(set(files)))


# ---------------------------------------------------------------------------------------------------------------
# Hub failures as one line
# ---------------------------------------------------------------------------------------------------------------

def _redact(text: str) -> str:
    """Remove any token value (from the environment or token-shaped) from ``text``."""
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        secret = os.environ.get(var)
        if secret:
            text = text.replace(secret, "***")
    return _TOKEN_SHAPE.sub("hf_***", text)


def describe_hub_failure(exc: BaseException, action: str, repo_id: str) -> str:
    """One line saying why ``action`` on ``repo_id`` failed and what to do; never contains a token."""
    if isinstance(exc, OfflineModeIsEnabled):
        line = (f"could not {action} {repo_id}: HF_HUB_OFFLINE=1 is set, so the Hugging Face Hub is not contacted "
                "(set HF_HUB_OFFLINE=0 to upload)")
    elif isinstance(exc, LocalTokenNotFoundError):
        line = (f"could not {action} {repo_id}: no Hugging Face token found "
                "(set HF_TOKEN to a write token or run `hf auth login`)")
    elif isinstance(exc, HfHubHTTPError):
        status = getattr(exc.response, "status_code", None)
        if status == 401:
            line = (f"could not {action} {repo_id}: the Hub rejected the token (HTTP 401); "
                    "set HF_TOKEN to a valid write token or run `hf auth login`")
        elif status == 403:
            line = (f"could not {action} {repo_id}: the token may not write to '{repo_id.split('/')[0]}' (HTTP 403); "
                    "use a token with write access to that namespace")
        else:
            detail = " ".join(str(exc.server_message or "").split())[:200]
            line = f"could not {action} {repo_id}: the Hub answered HTTP {status}" + (f": {detail}" if detail else "")
    elif isinstance(exc, NETWORK_ERRORS) or getattr(exc, "errno", None) in NETWORK_ERRNOS:
        line = (f"could not reach the Hugging Face Hub to {action} {repo_id}: no network connection "
                "(set HF_HUB_OFFLINE=0 and check your connection or proxy)")
    else:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        filename = getattr(exc, "filename", None)
        line = f"could not {action} {repo_id}: {reason}" + (f": {filename}" if filename else "")
    return _redact(" ".join(line.split()))


@contextmanager
def _hub_errors(action: str, repo_id: str) -> Iterator[None]:
    """Turn network/auth failures inside the block into a one-line HubError (no chained traceback, no token)."""
    try:
        yield
    except (OSError, httpx2.TransportError) as exc:  # the hub's errors are OSErrors (HfHubHTTPError, offline, token)
        raise HubError(describe_hub_failure(exc, action, repo_id)) from None


# ---------------------------------------------------------------------------------------------------------------
# Publish
# ---------------------------------------------------------------------------------------------------------------

def write_card(model_dir: Path, *, repo_id: str, card: CardText, eval_json: Path | None = None,
               target: str | None = None, step: int | None = None) -> Path:
    """Write the model card to ``model_dir/README.md`` (``card``: what it says of the draft's kind) and copy
    ``eval_json`` next to the weights; return the card.

    ``target`` defaults to the eval JSON's target, else ``model.target`` in recipe.yaml; ``step`` picks the
    acceptance.jsonl rows when no eval JSON is given (default: the exported checkpoint's, else the last step).
    Raises ValueError (unknown target), FileNotFoundError, FileExistsError (a README.md not ours)."""
    model_dir = Path(model_dir)
    target = target or infer_target(model_dir, eval_json)
    if not target:
        raise ValueError(f"cannot tell the target model of {model_dir}: pass --target "
                         "(or --eval-json from specdistill-eval, or keep recipe.yaml with model.target)")
    results, hardware = load_eval_results(model_dir, eval_json, step=step)
    check_card_writable(model_dir)
    recipe = model_dir / "recipe.yaml"
    text = build_model_card(model_dir, target=target, recipe_text=read_text(recipe) if recipe.is_file() else None,
                            eval_results=results, hardware=hardware, repo_id=repo_id, card=card,
                            prompts=eval_prompts(model_dir, eval_json))
    if eval_json is not None:
        copy = model_dir / eval_file_name(model_dir, eval_json)
        if not copy.exists() or not copy.samefile(eval_json):
            shutil.copyfile(eval_json, copy)
    write_atomic(model_dir / CARD_FILE, text)
    return model_dir / CARD_FILE


def push_to_hub(model_dir: Path, *, repo_id: str, card: CardText, private: bool = False, dry_run: bool = False,
                eval_json: Path | None = None, target: str | None = None, step: int | None = None,
                api: Any = None) -> UploadPlan:
    """Write the card into ``model_dir`` (``write_card``, ``card``: what it says of the draft's kind) and upload the
    plan's files to the model repo ``repo_id``; return the plan. ``dry_run`` writes the card and uploads nothing.

    ``api`` is an ``HfApi``-like object (tests pass a fake). Raises ValueError (bad repo id, unknown target),
    FileNotFoundError (no folder or weights), FileExistsError (a README.md not ours), HubError (network/auth).
    """
    check_repo_id(repo_id)
    model_dir = Path(model_dir)
    check_model_dir(model_dir)
    write_card(model_dir, repo_id=repo_id, card=card, eval_json=eval_json, target=target, step=step)
    plan = upload_plan(model_dir, eval_json)
    if dry_run:
        return plan

    api = api or HfApi()
    with _hub_errors("create", repo_id):
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    with _hub_errors("upload to", repo_id):
        api.upload_folder(repo_id=repo_id, folder_path=str(plan.folder), repo_type="model",
                          allow_patterns=plan.files, commit_message="Upload draft model with specdistill")
    return plan
