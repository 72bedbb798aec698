"""Typed recipes: one dataclass per concern (model, data, distill, train, eval, hub) under `Recipe`.

A recipe YAML file holds the fields of these dataclasses; defaults live here and nowhere else.
`load_recipe(path, overrides)` reads the file, applies `section.key=value` overrides and builds the dataclasses,
whose `__post_init__` checks types and ranges. Every problem raises `RecipeError` naming the key, the file (or the
command-line override), the bad value and what is allowed, before any model is loaded.

Regenerate the key reference in recipes/README.md with `python -m distill.config`.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from distill.losses import LOSSES

DTYPES = ("auto", "float32", "bfloat16", "float16")
DATA_FORMATS = ("auto", "text", "chat")
SECTIONS = ("model", "data", "distill", "train", "eval", "hub")
OVERRIDE_SOURCE = "command-line override"


class RecipeError(ValueError):
    """A recipe key is unknown, has the wrong type or is out of range. The message names key, source and value."""

    def __init__(self, key: str, problem: str, source: str | None = None):
        self.key, self.problem, self.source = key, problem, source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{key}: {problem}")

    def located(self, section: str, source: str) -> "RecipeError":
        """The same error with the key prefixed by its section and the source (file or override) attached."""
        key = self.key if self.key.startswith(f"{section}.") else f"{section}.{self.key}"
        return RecipeError(key, self.problem, source)


def option(default: Any, help: str) -> Any:
    """A dataclass field with a default (copied for lists and dicts) and a one-line help for the README."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


# ---------------------------------------------------------------------------------------------------------------
# Type and range checks used by every section's __post_init__
# ---------------------------------------------------------------------------------------------------------------

def _describe(hint: Any) -> str:
    """'an int', 'one of ...', 'a list of int or null': how a type hint reads in an error message."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _describe(a) for a in args)
    if origin is list:
        plural = {int: "integers", float: "numbers", str: "strings", bool: "true/false values"}
        return f"a list of {plural.get(args[0], _describe(args[0]))}" if args else "a list"
    if origin is dict:
        return "a mapping"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


def _short(hint: Any) -> str:
    """'int', 'list[int] | null', "'auto' | 'text'": how a type hint reads in the README table."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return " \\| ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join("null" if a is type(None) else _short(a) for a in args)
    if origin is list:
        return f"list[{_short(args[0])}]"
    if origin is dict:
        return "mapping"
    return getattr(hint, "__name__", str(hint))


def _coerce(value: Any, hint: Any) -> tuple[bool, Any]:
    """(ok, value) where value is converted only where it is lossless: int -> float, '1e-4' -> float."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True, value
    if origin is Literal:
        return value in args, value
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            ok, converted = (value is None, None) if arg is type(None) else _coerce(value, arg)
            if ok:
                return True, converted
        return False, value
    if origin is list:
        if not isinstance(value, list):
            return False, value
        items = [_coerce(v, args[0]) if args else (True, v) for v in value]
        return all(ok for ok, _ in items), [v for _, v in items]
    if origin is dict:
        return isinstance(value, dict), value
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
            try:
                return True, float(value)
            except ValueError:
                return False, value
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return is_number, float(value) if is_number else value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is str:
        return isinstance(value, str), value
    return isinstance(value, hint), value


def check_types(instance: Any) -> None:
    """Check (and losslessly convert) every field of a dataclass instance against its type hint."""
    hints = typing.get_type_hints(type(instance))
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        ok, converted = _coerce(value, hints[f.name])
        if not ok:
            raise RecipeError(f.name, f"got {value!r} ({type(value).__name__}); allowed: {_describe(hints[f.name])}")
        object.__setattr__(instance, f.name, converted)


def require(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise RecipeError for `key` unless `ok`."""
    if not ok:
        raise RecipeError(key, f"got {value!r}; allowed: {allowed}")


# ---------------------------------------------------------------------------------------------------------------
# The sections
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class ModelConfig:
    """Which target to distil from and how the draft is made (exactly one of draft, draft_layers, draft_config)."""

    target: str = option("", "Target LLM: local folder or hub id (required).")
    target_dtype: Literal["auto", "float32", "bfloat16", "float16"] = option(
        "auto", "dtype the frozen target is loaded in; auto = the dtype in its config.")
    draft: str | None = option(None, "Draft to fine-tune: local folder or hub id.")
    draft_layers: list[int] | None = option(
        None, "Build the draft from the target by keeping these decoder layers (0-based, increasing).")
    draft_config: dict[str, Any] | None = option(
        None, "Build the draft from scratch: the target's config with these keys overridden.")
    draft_dtype: Literal["float32", "bfloat16", "float16"] = option(
        "float32", "dtype of the trainable draft weights (use train.bf16 for mixed precision).")
    tokenizer: str | None = option(None, "Tokenizer folder or hub id; null = the target's.")
    trust_remote_code: bool = option(False, "Allow model code from the hub (only for repos you trust).")
    attn_implementation: str | None = option(None, "eager, sdpa, flash_attention_2, ...; null = transformers' pick.")

    def __post_init__(self) -> None:
        check_types(self)
        require(bool(self.target), "target", self.target, "a local folder or hub id of the target model")
        chosen = [k for k in ("draft", "draft_layers", "draft_config") if getattr(self, k) is not None]
        require(len(chosen) == 1, "draft", chosen or None,
                "exactly one of model.draft, model.draft_layers, model.draft_config")
        if self.draft_layers is not None:
            layers = self.draft_layers
            require(len(layers) > 0 and min(layers) >= 0 and layers == sorted(set(layers)), "draft_layers", layers,
                    "a non-empty, strictly increasing list of layer indices >= 0")


@dataclass
class DataConfig:
    """Where the training text comes from and how it becomes token blocks; which prompts measure acceptance."""

    dataset: str = option("", "Hub id, or local .txt/.json/.jsonl/.parquet file, folder or glob (required).")
    dataset_config: str | None = option(None, "Hub dataset configuration name.")
    split: str = option("train", "Split to train on (slicing such as train[:10%] works).")
    text_field: str = option("text", "Column holding plain text (format text).")
    messages_field: str = option("messages", "Column holding chat messages [{role, content}] (format chat).")
    format: Literal["auto", "text", "chat"] = option(
        "auto", "text: pack documents into max_length blocks; chat: one conversation per row, loss on assistant "
                "tokens only; auto: chat if messages_field exists, else text.")
    max_length: int = option(1024, "Tokens per training sequence (packed block or truncated conversation).")
    max_samples: int | None = option(None, "Use at most this many rows of the dataset.")
    num_proc: int | None = option(None, "Processes for tokenisation (datasets.map).")
    eval_prompts: str | None = option(
        None, "Acceptance prompts: .jsonl with a 'prompt' field or .txt (one per line); null = hold out "
              "num_eval_prompts rows of the dataset.")
    num_eval_prompts: int = option(16, "How many prompts to measure acceptance on.")
    eval_prompt_tokens: int = option(128, "Prompts are truncated to this many tokens.")

    def __post_init__(self) -> None:
        check_types(self)
        require(bool(self.dataset), "dataset", self.dataset, "a hub id or a local file, folder or glob")
        require(self.max_length >= 2, "max_length", self.max_length, "an integer >= 2")
        require(self.max_samples is None or self.max_samples > 0, "max_samples", self.max_samples, "null or > 0")
        require(self.num_proc is None or self.num_proc > 0, "num_proc", self.num_proc, "null or > 0")
        require(self.num_eval_prompts >= 0, "num_eval_prompts", self.num_eval_prompts, "an integer >= 0")
        require(self.eval_prompt_tokens > 0, "eval_prompt_tokens", self.eval_prompt_tokens, "an integer > 0")


@dataclass
class DistillConfig:
    """The per-token objective: a divergence between target and draft next-token distributions, plus optional CE."""

    loss: str = option("forward_kl", f"Divergence: one of {', '.join(LOSSES)}.")
    beta: float = option(0.5, "Mixture weight of the generalised JSD (loss jsd), in [0, 1].")
    temperature: float = option(1.0, "Softmax temperature applied to both models' logits, > 0.")
    ce_weight: float = option(0.0, "w in loss = (1 - w) * divergence + w * cross-entropy on data tokens, in [0, 1].")
    chunk_size: int = option(1024, "Token positions per chunk when computing logits (bounds memory), > 0.")

    def __post_init__(self) -> None:
        check_types(self)
        require(self.loss in LOSSES, "loss", self.loss, "one of " + ", ".join(LOSSES))
        require(0.0 <= self.beta <= 1.0, "beta", self.beta, "a number in [0, 1]")
        require(self.temperature > 0, "temperature", self.temperature, "a number > 0")
        require(0.0 <= self.ce_weight <= 1.0, "ce_weight", self.ce_weight, "a number in [0, 1]")
        require(self.chunk_size > 0, "chunk_size", self.chunk_size, "an integer > 0")


@dataclass
class TrainConfig:
    """The optimisation loop (passed to transformers.TrainingArguments)."""

    output_dir: str = option("outputs/draft", "Checkpoints, logs, acceptance.jsonl and the exported best draft.")
    max_steps: int = option(-1, "Optimizer steps; -1 = run num_train_epochs.")
    num_train_epochs: float = option(1.0, "Epochs over the training set when max_steps is -1.")
    per_device_train_batch_size: int = option(8, "Sequences per process per micro-batch.")
    gradient_accumulation_steps: int = option(1, "Micro-batches per optimizer step.")
    learning_rate: float = option(1e-4, "Peak learning rate.")
    lr_scheduler_type: str = option("cosine", "transformers scheduler name (linear, cosine, constant, ...).")
    warmup_ratio: float = option(0.03, "Fraction of steps with linear warm-up, in [0, 1).")
    weight_decay: float = option(0.0, "AdamW weight decay.")
    optim: str = option("adamw_torch", "transformers optimizer name.")
    max_grad_norm: float = option(1.0, "Gradient clipping norm; 0 = off.")
    logging_steps: int = option(10, "Log loss, kd, tv, learning rate and tokens/s every this many steps.")
    save_steps: int = option(500, "Save a checkpoint (and measure acceptance) every this many steps.")
    save_total_limit: int | None = option(3, "Keep at most this many checkpoints (the best is always kept).")
    seed: int = option(42, "Random seed (model init, data order, held-out prompts).")
    bf16: bool = option(False, "bfloat16 mixed precision.")
    fp16: bool = option(False, "float16 mixed precision.")
    gradient_checkpointing: bool = option(False, "Recompute draft activations in the backward pass.")
    resume_from_checkpoint: str | bool | None = option(
        None, "A checkpoint folder, or true for the latest checkpoint in output_dir.")
    report_to: list[str] = option(["tensorboard"], "Trackers (tensorboard, wandb, ...); [] = none.")
    dataloader_num_workers: int = option(0, "Data loader worker processes.")
    ddp_timeout: int = option(1800, "Seconds a process waits for the others (acceptance runs on rank 0 only).")

    def __post_init__(self) -> None:
        check_types(self)
        require(bool(self.output_dir), "output_dir", self.output_dir, "a folder path")
        require(self.max_steps == -1 or self.max_steps > 0, "max_steps", self.max_steps, "-1 or an integer > 0")
        require(self.num_train_epochs > 0, "num_train_epochs", self.num_train_epochs, "a number > 0")
        for key in ("per_device_train_batch_size", "gradient_accumulation_steps", "logging_steps", "save_steps"):
            require(getattr(self, key) > 0, key, getattr(self, key), "an integer > 0")
        require(self.learning_rate > 0, "learning_rate", self.learning_rate, "a number > 0")
        require(0.0 <= self.warmup_ratio < 1.0, "warmup_ratio", self.warmup_ratio, "a number in [0, 1)")
        require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "a number >= 0")
        require(self.max_grad_norm >= 0, "max_grad_norm", self.max_grad_norm, "a number >= 0")
        require(self.save_total_limit is None or self.save_total_limit > 0, "save_total_limit",
                self.save_total_limit, "null or an integer > 0")
        require(not (self.bf16 and self.fp16), "fp16", self.fp16, "false when train.bf16 is true")
        require(self.resume_from_checkpoint is not False, "resume_from_checkpoint", False,
                "null, true or a checkpoint folder")
        require(self.dataloader_num_workers >= 0, "dataloader_num_workers", self.dataloader_num_workers, ">= 0")
        require(self.ddp_timeout > 0, "ddp_timeout", self.ddp_timeout, "an integer > 0")


@dataclass
class EvalConfig:
    """Acceptance measured with decode.evaluate at every checkpoint (see docs/INTERFACES.md)."""

    gammas: list[int] = option([1, 2, 4], "Draft lengths to measure; the best one goes into generation_config.")
    temperatures: list[float] = option(
        [0.0], "Sampling temperatures to measure; the first one picks the best checkpoint.")
    max_new_tokens: int = option(64, "Tokens generated per prompt.")
    top_k: int | None = option(None, "Top-k sampling filter (temperature > 0).")
    top_p: float | None = option(None, "Top-p sampling filter (temperature > 0).")
    seed: int = option(0, "Sampling seed.")
    repeats: int = option(1, "Timing repeats per prompt.")
    at_checkpoints: bool = option(True, "Measure at every checkpoint; false = only at the end of training.")

    def __post_init__(self) -> None:
        check_types(self)
        require(len(self.gammas) > 0 and all(g > 0 for g in self.gammas), "gammas", self.gammas,
                "a non-empty list of integers > 0")
        require(len(self.temperatures) > 0 and all(t >= 0 for t in self.temperatures), "temperatures",
                self.temperatures, "a non-empty list of numbers >= 0")
        require(self.max_new_tokens > 0, "max_new_tokens", self.max_new_tokens, "an integer > 0")
        require(self.top_k is None or self.top_k > 0, "top_k", self.top_k, "null or an integer > 0")
        require(self.top_p is None or 0 < self.top_p <= 1, "top_p", self.top_p, "null or a number in (0, 1]")
        require(self.repeats > 0, "repeats", self.repeats, "an integer > 0")


@dataclass
class HubConfig:
    """Publishing the exported draft (distill.hub.push_to_hub)."""

    push_to_hub: bool = option(False, "Push the exported best draft at the end of training.")
    repo_id: str | None = option(None, "Hub repository, e.g. you/qwen2.5-0.5b-draft (required to push).")
    private: bool = option(True, "Create the repository as private.")

    def __post_init__(self) -> None:
        check_types(self)
        require(not self.push_to_hub or bool(self.repo_id), "repo_id", self.repo_id,
                "a hub repository id when hub.push_to_hub is true")


SECTION_TYPES: dict[str, type] = {
    "model": ModelConfig, "data": DataConfig, "distill": DistillConfig,
    "train": TrainConfig, "eval": EvalConfig, "hub": HubConfig,
}


@dataclass
class Recipe:
    """A whole training run; each attribute is one section of the YAML file."""

    model: ModelConfig
    data: DataConfig
    distill: DistillConfig = field(default_factory=DistillConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    hub: HubConfig = field(default_factory=HubConfig)


# ---------------------------------------------------------------------------------------------------------------
# Loading: file -> dict -> overrides -> dataclasses
# ---------------------------------------------------------------------------------------------------------------

def _unknown_key(key: str, valid: typing.Iterable[str], source: str) -> RecipeError:
    valid = list(valid)
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], [v.rsplit(".", 1)[-1] for v in valid], n=1)
    prefix = key.rsplit(".", 1)[0] + "." if "." in key else ""
    hint = f"did you mean '{prefix}{close[0]}'?" if close else "valid keys: " + ", ".join(valid)
    return RecipeError(key, f"unknown key; {hint}", source)


def parse_override(text: str) -> tuple[list[str], Any]:
    """'train.learning_rate=1e-4' -> (['train', 'learning_rate'], 1e-4); the value is read as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or "." not in key or not all(key.split(".")):
        raise RecipeError(text, "an override must look like section.key=value, e.g. train.learning_rate=1e-4",
                          OVERRIDE_SOURCE)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as err:
        raise RecipeError(key, f"cannot read value {raw!r} as YAML ({err.problem})", OVERRIDE_SOURCE) from None
    return key.split("."), value


def _apply_override(raw: dict[str, dict], path: list[str], value: Any) -> None:
    """Set raw[path[0]][path[1]]... = value on a dict we own (never the caller's)."""
    section = path[0]
    if section not in SECTION_TYPES:
        raise _unknown_key(section, SECTIONS, OVERRIDE_SOURCE)
    names = [f.name for f in dataclasses.fields(SECTION_TYPES[section])]
    if path[1] not in names:
        raise _unknown_key(".".join(path[:2]), [f"{section}.{n}" for n in names], OVERRIDE_SOURCE)
    if not isinstance(raw.get(section), dict):
        raw[section] = {}
    node = raw[section]
    for part in path[1:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value


def build_recipe(raw: dict[str, Any], source: str = "<dict>", override_keys: typing.Collection[str] = ()) -> Recipe:
    """Recipe from a {section: {key: value}} mapping; errors name `source` (or the override that set the key)."""
    if not isinstance(raw, dict):
        raise RecipeError("<top level>", f"expected a mapping of sections {SECTIONS}, got {type(raw).__name__}",
                          source)
    sections = {}
    for name in raw:
        if name not in SECTION_TYPES:
            raise _unknown_key(str(name), SECTIONS, source)
    for name, cls in SECTION_TYPES.items():
        values = raw.get(name) or {}
        if not isinstance(values, dict):
            raise RecipeError(name, f"expected a mapping of keys, got {values!r}", source)
        names = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in names:
                raise _unknown_key(f"{name}.{key}", [f"{name}.{n}" for n in names], source)
        try:
            sections[name] = cls(**values)
        except RecipeError as err:
            key = f"{name}.{err.key}"
            where = OVERRIDE_SOURCE if any(key == k or key.startswith(k + ".") for k in override_keys) else source
            raise err.located(name, where) from None
    return Recipe(**sections)


def load_recipe(path: str | Path, overrides: typing.Sequence[str] = ()) -> Recipe:
    """Read a recipe YAML file, apply `section.key=value` overrides and validate everything.

    Raises RecipeError (a ValueError) naming key, file and value; FileNotFoundError naming the path.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"recipe file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise RecipeError("<yaml>", f"not valid YAML: {err}", str(path)) from None
    if not isinstance(raw, dict):
        raise RecipeError("<top level>", f"expected a mapping of sections {SECTIONS}", str(path))
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    override_keys = []
    for text in overrides:
        key_path, value = parse_override(text)
        _apply_override(raw, key_path, value)
        override_keys.append(".".join(key_path[:2]))
    return build_recipe(raw, str(path), override_keys)


def with_overrides(recipe: Recipe, overrides: typing.Sequence[str]) -> Recipe:
    """A new Recipe with overrides applied; `recipe` itself is left untouched."""
    raw = recipe_to_dict(recipe)
    keys = []
    for text in overrides:
        key_path, value = parse_override(text)
        _apply_override(raw, key_path, value)
        keys.append(".".join(key_path[:2]))
    return build_recipe(raw, OVERRIDE_SOURCE, keys)


def recipe_to_dict(recipe: Recipe) -> dict[str, dict[str, Any]]:
    """A deep-copied plain-dict view of the recipe (YAML-safe)."""
    return dataclasses.asdict(recipe)


def save_recipe(recipe: Recipe, path: str | Path) -> None:
    """Write the resolved recipe as YAML (loads back with load_recipe)."""
    Path(path).write_text(yaml.safe_dump(recipe_to_dict(recipe), sort_keys=False))


# ---------------------------------------------------------------------------------------------------------------
# Reference table for recipes/README.md
# ---------------------------------------------------------------------------------------------------------------

def reference_markdown() -> str:
    """A markdown table of every recipe key with its type, default and help, generated from the dataclasses."""
    lines = []
    for name, cls in SECTION_TYPES.items():
        hints = typing.get_type_hints(cls)
        lines += [f"### `{name}`", "", (cls.__doc__ or "").strip(), "", "| key | type | default | meaning |",
                  "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            shown = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
            shown = "(required)" if default == "" else f"`{shown}`"
            lines.append(f"| `{name}.{f.name}` | {_short(hints[f.name])} | {shown} | {f.metadata['help']} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
