"""Publish a trained draft model on the Hugging Face Hub with a model card built from measured numbers.

    folder = push_to_hub(Path("out/draft"), repo_id="me/qwen-draft", dry_run=True)   # stage only
    push_to_hub(Path("out/draft"), repo_id="me/qwen-draft")                          # stage + upload

The card states the target, embeds the training recipe, tabulates acceptance and speedup exactly as measured
(from an eval_acceptance JSON, else the acceptance.jsonl rows of the exported checkpoint, else of the last one)
with the hardware they were measured on, and shows how to use the draft with transformers and vLLM.

The token is resolved by ``huggingface_hub`` (``HF_TOKEN`` or the local login); this module never passes, prints
or logs it, and scrubs the token (and anything token-shaped) from the error messages it writes.
"""
from __future__ import annotations

import errno
import importlib
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import HfApi, ModelCardData
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalTokenNotFoundError, OfflineModeIsEnabled
from huggingface_hub.utils import validate_repo_id

from distill.acceptance_log import best_checkpoint
from distill.card_sections import category_section, deploy_section
from distill.report import read_acceptance_log, read_eval_json

CARD_TAGS = ["speculative-decoding", "draft-model", "specdistill"]

# Top-level files of a training OUTPUT_DIR that make up the published model; sub-folders (checkpoints/, runs/)
# and trainer state (optimizer.pt, scheduler.pt, rng_state*.pth, training_args.bin) are never copied.
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json", "adapter_config.json")
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model", "chat_template.jinja", "chat_template.json",
)
RESULT_FILES = ("recipe.yaml", "acceptance.jsonl")
WEIGHTS_GLOB = "*.safetensors"

_TOKEN_SHAPE = re.compile(r"hf_[A-Za-z0-9]{6,}")


class HubError(RuntimeError):
    """The Hub could not be reached or refused the request; the message is one line and never holds a token."""


# ---------------------------------------------------------------------------------------------------------------
# Inputs: weights, recipe, measured results
# ---------------------------------------------------------------------------------------------------------------

def check_repo_id(repo_id: str) -> None:
    """Raise ValueError unless ``repo_id`` has the form ``user/name`` with characters the Hub accepts."""
    if not isinstance(repo_id, str) or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ValueError(f"repo id {repo_id!r} must look like 'user/name' (or 'org/name')")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        reason = " ".join(str(exc).split())
        raise ValueError(f"repo id {repo_id!r} is not valid on the Hub: {reason}") from None


def check_model_dir(model_dir: Path) -> list[Path]:
    """The safetensors weight files of ``model_dir``; FileNotFoundError if the folder or the weights are missing."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model folder {model_dir} does not exist")
    weights = sorted(model_dir.glob(WEIGHTS_GLOB))
    if not weights:
        raise FileNotFoundError(
            f"no {WEIGHTS_GLOB} weights in {model_dir}: pass the training OUTPUT_DIR that holds the final model "
            "(saved with save_pretrained)")
    return weights


def load_eval_results(model_dir: Path, eval_json: Path | None = None, *,
                      step: int | None = None) -> tuple[list[dict], str]:
    """Measured results and the hardware they came from.

    From ``eval_json`` (an eval_acceptance JSON) when given; else the rows of ``model_dir/acceptance.jsonl`` at
    ``step`` (default: the exported checkpoint's step from train_results.json, else the last step logged);
    else ``([], "")``. Raises FileNotFoundError / ValueError on a missing or malformed file, or a ``step`` the
    log does not hold.
    """
    if eval_json is not None:
        payload = read_eval_json(Path(eval_json))
        return list(payload["results"]), describe_hardware(payload)
    log = Path(model_dir) / "acceptance.jsonl"
    if not log.is_file():
        return [], ""
    rows = read_acceptance_log(log)
    if not rows:
        return [], ""
    steps = sorted({row["step"] for row in rows})
    exported = exported_step(model_dir) if step is None else None
    chosen = step if step is not None else exported if exported in steps else steps[-1]
    if chosen not in steps:
        raise ValueError(f"{log} has no rows for step {step}; steps logged: {', '.join(map(str, steps))}")
    picked = [row for row in rows if row["step"] == chosen]
    return picked, describe_hardware(picked[0]) or "not recorded in acceptance.jsonl (measured during training)"


def exported_step(model_dir: Path) -> int | None:
    """The step of the checkpoint the trainer exported to ``model_dir`` (train_results.json ``best.step``)."""
    path = Path(model_dir) / "train_results.json"
    if not path.is_file():
        return None
    best = json.loads(path.read_text()).get("best")
    step = best.get("step") if isinstance(best, dict) else None
    return step if isinstance(step, int) else None


def describe_hardware(record: dict) -> str:
    """``"cuda (NVIDIA H100), bfloat16, torch 2.13.0"`` from the device/dtype/torch_version keys present."""
    parts = [str(record["device"])] if record.get("device") else []
    if record.get("dtype"):
        parts.append(str(record["dtype"]))
    if record.get("torch_version"):
        parts.append(f"torch {record['torch_version']}")
    return ", ".join(parts)


def infer_target(model_dir: Path, eval_json: Path | None = None) -> str | None:
    """The target model id: the eval JSON's ``target``, else ``model.target`` of ``model_dir/recipe.yaml``."""
    if eval_json is not None:
        target = read_eval_json(Path(eval_json)).get("target")
        if target:
            return str(target)
    recipe = Path(model_dir) / "recipe.yaml"
    if recipe.is_file():
        parsed = yaml.safe_load(recipe.read_text())
        model_section = parsed.get("model") if isinstance(parsed, dict) else None
        if isinstance(model_section, dict) and model_section.get("target"):
            return str(model_section["target"])
    return None


def is_hub_id(name: str) -> bool:
    """True when ``name`` reads as a Hub repo id (``org/name``) and is not a folder on this machine."""
    try:
        check_repo_id(name)
    except ValueError:
        return False
    return not Path(name).exists()


def describe_draft(model_dir: Path) -> str:
    """One line on the draft's architecture from config.json and its parameter count from the safetensors headers."""
    parts = []
    config_path = Path(model_dir) / "config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text())
        parts.append(str(config.get("model_type", "unknown architecture")))
        layers = config.get("num_hidden_layers", config.get("n_layer"))
        hidden = config.get("hidden_size", config.get("n_embd"))
        if layers is not None:
            parts.append(f"{layers} layers")
        if hidden is not None:
            parts.append(f"hidden size {hidden}")
    n_params = count_parameters(model_dir)
    if n_params:
        parts.append(f"{human_count(n_params)} parameters")
    return ", ".join(parts)


def human_count(n: int) -> str:
    """1234 -> '1.2K', 494_032_768 -> '494.0M', 7_615_616_512 -> '7.6B'."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def count_parameters(model_dir: Path) -> int:
    """Number of stored parameters, read from the safetensors headers (8-byte length + JSON) without loading weights."""
    total = 0
    for path in sorted(Path(model_dir).glob(WEIGHTS_GLOB)):
        with open(path, "rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(header_len))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            n = 1
            for dim in info["shape"]:
                n *= dim
            total += n
    return total


# ---------------------------------------------------------------------------------------------------------------
# Model card
# ---------------------------------------------------------------------------------------------------------------

def _fmt(value: Any, spec: str, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def results_table(results: list[dict]) -> str:
    """Markdown table of the measured results, sorted by temperature then gamma."""
    lines = [
        "| gamma | temperature | acceptance_rate | mean_accepted_tokens | speedup | predicted_speedup |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in sorted(results, key=lambda r: (r.get("temperature", 0.0), str(r.get("gamma", 0)).zfill(4))):
        lines.append(
            f"| {row.get('gamma', 'n/a')} | {_fmt(row.get('temperature'), 'g')} "
            f"| {_fmt(row.get('acceptance_rate'), '.3f')} | {_fmt(row.get('mean_accepted_tokens'), '.2f')} "
            f"| {_fmt(row.get('speedup'), '.2f', 'x')} | {_fmt(row.get('predicted_speedup'), '.2f', 'x')} |")
    return "\n".join(lines)


def best_gamma(results: list[dict]) -> int | None:
    """The gamma of distill.acceptance_log.best_checkpoint (cost-model speedup from measured acceptance, at the
    lowest temperature measured), or None when nothing was measured."""
    choice = best_checkpoint(results)
    return choice.gamma if choice else None


def _results_section(results: list[dict], hardware: str) -> str:
    if not results:
        return ("## Measured acceptance and speedup\n\n"
                "No measurements are available for this model yet: no eval_acceptance JSON was given and no "
                "acceptance.jsonl was found next to the weights. Run `specdistill-eval` and push again with "
                "`--eval-json`.\n")
    steps = sorted({row["step"] for row in results if "step" in row})
    source = (f"Measured by the trainer at step {steps[-1]} (acceptance.jsonl)." if steps
              else "Measured with `specdistill-eval` (eval_acceptance JSON).")
    return (
        "## Measured acceptance and speedup\n\n"
        f"{source} Hardware: **{hardware or 'not recorded'}**. Speedups are wall-clock and hold for that "
        "hardware only.\n\n"
        f"{results_table(results)}\n\n"
        "- `acceptance_rate`: per-token acceptance probability, the mean over verified positions of "
        "sum_x min(p(x), q(x)) (= 1 - total variation between target p and draft q).\n"
        "- `mean_accepted_tokens`: tokens produced per target verify pass, the bonus or resampled token "
        "included (block efficiency).\n"
        "- `speedup`: wall-clock tokens/s of speculative decoding over the target alone at the temperature shown; "
        "`predicted_speedup`: mean_accepted_tokens / (gamma * draft_cost_ratio + verify_cost_ratio) from measured "
        "step costs.\n")


def _usage_section(target: str, repo_id: str, gamma: int | None) -> str:
    g = gamma if gamma is not None else 4
    why = ("the gamma with the best cost-model speedup above (mean_accepted_tokens / (gamma * draft_cost_ratio + "
           "verify_cost_ratio))" if gamma is not None
           else "an untuned default: measure and pick your own")
    spec = json.dumps({"model": repo_id, "num_speculative_tokens": g})
    return f"""## Usage

The draft must share the target's tokenizer; the target's output distribution is unchanged. `gamma = {g}`
is {why}.

### transformers (assisted generation)

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{target}")
target = AutoModelForCausalLM.from_pretrained("{target}", dtype="auto", device_map="auto")
draft = AutoModelForCausalLM.from_pretrained("{repo_id}", dtype="auto", device_map="auto")
# transformers reads the draft length from the draft's generation_config.
draft.generation_config.num_assistant_tokens = {g}
draft.generation_config.num_assistant_tokens_schedule = "constant"
draft.generation_config.assistant_confidence_threshold = 0.0

inputs = tokenizer("def fibonacci(n):", return_tensors="pt").to(target.device)
outputs = target.generate(**inputs, assistant_model=draft, max_new_tokens=128)
print(tokenizer.decode(outputs[0], skip_special_tokens=True))
```

### vLLM

```python
from vllm import LLM, SamplingParams

llm = LLM(model="{target}", speculative_config={spec})
outputs = llm.generate(["def fibonacci(n):"], SamplingParams(temperature=0.0, max_tokens=128))
print(outputs[0].outputs[0].text)
```

```bash
vllm serve {target} --speculative-config '{spec}'
```
"""


def _metadata(target: str) -> str:
    data = ModelCardData(
        library_name="transformers",
        tags=list(CARD_TAGS),
        base_model=target if is_hub_id(target) else None,
        pipeline_tag="text-generation",
    )
    return data.to_yaml().rstrip("\n") + "\n"


def build_model_card(model_dir: Path, *, target: str, recipe_text: str | None, eval_results: list[dict],
                     hardware: str, repo_id: str) -> str:
    """README.md text for the draft in ``model_dir``: metadata, target, measured table, usage, recipe."""
    target_ref = f"[`{target}`](https://huggingface.co/{target})" if is_hub_id(target) else f"`{target}`"
    draft_line = describe_draft(model_dir)
    recipe = (f"```yaml\n{recipe_text.rstrip()}\n```\n" if recipe_text
              else "No recipe.yaml was saved with this model.\n")
    sections = [
        f"---\n{_metadata(target)}---\n",
        f"# {repo_id.split('/')[-1]}\n\n"
        f"A draft model for speculative decoding with target {target_ref}, trained with specdistill. "
        "The draft proposes tokens that the target verifies in one forward pass, so generation follows the "
        "target's distribution and only its speed changes.\n\n"
        f"- **Target model:** `{target}`\n"
        + (f"- **Draft:** {draft_line}\n" if draft_line else ""),
        _results_section(eval_results, hardware),
        *[section for section in (category_section(eval_results), deploy_section(model_dir)) if section],
        _usage_section(target, repo_id, best_gamma(eval_results)),
        f"## Training recipe\n\n{recipe}",
    ]
    return "\n".join(sections)


# ---------------------------------------------------------------------------------------------------------------
# Staging and upload
# ---------------------------------------------------------------------------------------------------------------

def _link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link ``src`` to ``dst`` (no copy of multi-GB weights), copying where linking is impossible.

    A staged folder therefore shares its weights with the model folder: stage again after retraining."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def prepare_upload_folder(model_dir: Path, staging_dir: Path, card: str, eval_json: Path | None = None) -> Path:
    """Fill the empty (or new) ``staging_dir`` with the files to publish and README.md; return it.

    Copies the weights, config, generation config, tokenizer files, recipe.yaml, acceptance.jsonl and
    ``eval_json``; never sub-folders or trainer state. Raises FileExistsError if ``staging_dir`` is not empty.
    """
    model_dir, staging_dir = Path(model_dir), Path(staging_dir)
    weights = check_model_dir(model_dir)
    if staging_dir.exists() and any(staging_dir.iterdir()):
        raise FileExistsError(f"staging folder {staging_dir} is not empty: choose a new or empty folder")
    staging_dir.mkdir(parents=True, exist_ok=True)
    named = [model_dir / name for name in MODEL_FILES + TOKENIZER_FILES + RESULT_FILES]
    for src in weights + [p for p in named if p.is_file()]:
        _link_or_copy(src, staging_dir / src.name)
    if eval_json is not None:
        eval_json = Path(eval_json)
        name = eval_json.name
        if (staging_dir / name).exists() or name == "README.md":
            name = "eval_acceptance.json"
        shutil.copy2(eval_json, staging_dir / name)
    (staging_dir / "README.md").write_text(card)
    return staging_dir


def _redact(text: str) -> str:
    """Remove any token value (from the environment or token-shaped) from ``text``."""
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        secret = os.environ.get(var)
        if secret:
            text = text.replace(secret, "***")
    return _TOKEN_SHAPE.sub("hf_***", text)


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Exception classes that mean 'the network failed', for whichever HTTP clients are installed."""
    classes: list[type[BaseException]] = [ConnectionError, TimeoutError, socket.gaierror]
    for module, attr in (("httpx2", "TransportError"), ("httpx", "TransportError"),
                         ("requests.exceptions", "ConnectionError"), ("requests.exceptions", "Timeout")):
        try:
            classes.append(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError):
            continue
    return tuple(classes)


def _is_local_os_error(exc: OSError) -> bool:
    """True for a failure of this machine's files (missing, unreadable, disk full) rather than of the network."""
    local_types = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
    return isinstance(exc, local_types) or exc.errno in (errno.ENOSPC, errno.EROFS, errno.EIO, errno.EMFILE)


def describe_hub_failure(exc: BaseException, action: str, repo_id: str) -> str:
    """One line saying why ``action`` on ``repo_id`` failed and what to do; never contains a token."""
    if isinstance(exc, OfflineModeIsEnabled):
        line = (f"could not {action} {repo_id}: HF_HUB_OFFLINE=1 is set, so the Hugging Face Hub is not contacted "
                "(set HF_HUB_OFFLINE=0 to upload)")
    elif isinstance(exc, LocalTokenNotFoundError):
        line = (f"could not {action} {repo_id}: no Hugging Face token found "
                "(set HF_TOKEN to a write token or run `hf auth login`)")
    elif isinstance(exc, HfHubHTTPError):
        response = getattr(exc, "response", None)
        status = getattr(response, "status_code", None)
        if status == 401:
            line = (f"could not {action} {repo_id}: the Hub rejected the token (HTTP 401); "
                    "set HF_TOKEN to a valid write token or run `hf auth login`")
        elif status == 403:
            line = (f"could not {action} {repo_id}: the token may not write to '{repo_id.split('/')[0]}' (HTTP 403); "
                    "use a token with write access to that namespace")
        else:
            detail = " ".join(str(getattr(exc, "server_message", None) or "").split())[:200]
            line = f"could not {action} {repo_id}: the Hub answered HTTP {status}" + (f": {detail}" if detail else "")
    elif isinstance(exc, _transport_errors()) or (isinstance(exc, OSError) and not _is_local_os_error(exc)):
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
    except (OSError, HfHubHTTPError, *_transport_errors()) as exc:
        raise HubError(describe_hub_failure(exc, action, repo_id)) from None


def push_to_hub(model_dir: Path, *, repo_id: str, private: bool = False, dry_run: bool = False,
                eval_json: Path | None = None, staging_dir: Path | None = None, target: str | None = None,
                step: int | None = None, api: Any = None) -> Path:
    """Stage ``model_dir`` with a model card and upload it to the model repo ``repo_id``; return the staged folder.

    ``target`` defaults to the eval JSON's target, else ``model.target`` in recipe.yaml; ``step`` picks the
    acceptance.jsonl rows when no eval JSON is given (default: the last step). ``dry_run`` stages and
    uploads nothing. ``staging_dir`` defaults to a new temporary folder (kept, so it can be inspected).
    ``api`` is an ``HfApi``-like object (tests pass a fake). Raises ValueError (bad repo id, unknown target),
    FileNotFoundError (no folder or weights), FileExistsError (staging folder not empty), HubError (network/auth).
    """
    check_repo_id(repo_id)
    model_dir = Path(model_dir)
    check_model_dir(model_dir)
    target = target or infer_target(model_dir, eval_json)
    if not target:
        raise ValueError(f"cannot tell the target model of {model_dir}: pass --target "
                         "(or --eval-json from specdistill-eval, or keep recipe.yaml with model.target)")
    results, hardware = load_eval_results(model_dir, eval_json, step=step)
    recipe = model_dir / "recipe.yaml"
    card = build_model_card(model_dir, target=target, recipe_text=recipe.read_text() if recipe.is_file() else None,
                            eval_results=results, hardware=hardware, repo_id=repo_id)
    if staging_dir is None:
        staging_dir = Path(tempfile.mkdtemp(prefix="specdistill-hub-"))
    folder = prepare_upload_folder(model_dir, Path(staging_dir), card, eval_json=eval_json)
    if dry_run:
        return folder

    api = api or HfApi()
    with _hub_errors("create", repo_id):
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    with _hub_errors("upload to", repo_id):
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model",
                          commit_message="Upload draft model with specdistill")
    return folder
