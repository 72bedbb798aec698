"""The `train:` section of a recipe: transformers.TrainingArguments' own fields, validated by pydantic.

The schema is built at import from `dataclasses.fields(TrainingArguments)`: every field keeps transformers' name,
type, default and help, and nothing of it is declared again here. What this project changes is in three tables:
  TRAINING_ARGUMENTS_CHANGES  our defaults, ranges and notes (merged into transformers' field)
  SET_BY_THE_RUN              fields the run sets itself (passed to TrainingArguments; a recipe may not set them)
  LEFT_TO_OTHERS              fields another part of the project owns (refused, naming that part)
plus resume_from_checkpoint's one more value (true: the latest checkpoint; transformers leaves that field to
scripts), and `RunFolderKeys` holds our keys that are no TrainingArguments field (overwrite_output_dir,
preemption_grace_s). A field transformers renamed keeps its new name on every release (FORMER_TRANSFORMERS_NAMES:
train.activation_checkpointing is gradient_checkpointing before transformers 5.23).
`training_arguments(cfg)` builds TrainingArguments(**the section, **SET_BY_THE_RUN) under the installed release's
names; transformers' own checks between fields run there (distill.run.preflight names what they refuse).
"""
from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any, Literal

import torch
from pydantic import Field, JsonValue, create_model, model_validator
from pydantic.fields import FieldInfo
from transformers import TrainingArguments

from distill.recipe.schema import RecipeError, Section, require

TRAINING_ARGUMENTS_CHANGES: dict[str, FieldInfo] = {
    "output_dir": Field("outputs/draft", min_length=1,
                        description="Checkpoints, logs, acceptance.jsonl and the exported best draft."),
    "max_steps": Field(ge=-1, description="Optimizer steps; -1 = run num_train_epochs."),
    "num_train_epochs": Field(1.0, gt=0, description="Epochs over the training set when max_steps is -1."),
    "per_device_train_batch_size": Field(gt=0, description="Sequences per process per micro-batch."),
    "gradient_accumulation_steps": Field(gt=0, description="Micro-batches per optimizer step."),
    "learning_rate": Field(1e-4, gt=0, description="Peak learning rate."),
    "lr_scheduler_type": Field("cosine"),
    "warmup_steps": Field(0.03, ge=0, description="Linear warm-up: a number < 1 is a fraction of the total steps, "
                                                  ">= 1 a number of steps."),
    "weight_decay": Field(ge=0),
    "optim": Field("adamw_torch"),
    "max_grad_norm": Field(ge=0, description="Gradient clipping norm; 0 = off."),
    "logging_steps": Field(10, gt=0, description="Log loss, kd, tv, learning rate and tokens/s every this many "
                                                 "steps."),
    "save_steps": Field(gt=0, description="Save a checkpoint (and measure acceptance) every this many steps."),
    "save_total_limit": Field(3, gt=0, description="Keep at most this many checkpoints (the best is always kept)."),
    "seed": Field(description="Random seed (model init, data order, held-out prompts)."),
    "bf16": Field(description="bfloat16 mixed precision: the draft's forward and the loss's lm_head matmuls in "
                              "bfloat16, weights and divergences in float32. Needs a GPU with bfloat16 (Ampere or "
                              "newer), or train.use_cpu=true on a CPU (worth it with AVX512-BF16 or AMX)."),
    "fp16": Field(description="float16 mixed precision with loss scaling (needs a GPU; refused on CPU)."),
    "activation_checkpointing": Field(False, description="Recompute draft activations in the backward pass (less "
                                                         "activation memory, ~30% more compute)."),
    "report_to": Field(default_factory=lambda: ["tensorboard"],
                       description="Trackers (tensorboard, wandb, ...); [] = none."),
    "dataloader_num_workers": Field(ge=0, description="Data loader worker processes."),
    "dataloader_pin_memory": Field(None, description="Pin batches in page-locked memory for faster copies to the "
                                                     "accelerator; null = on when torch sees one, off on a CPU-only "
                                                     "machine (where pinning only warns)."),
    "ddp_timeout": Field(gt=0, description="Seconds a process waits for the others (acceptance runs on rank 0 "
                                           "only)."),
    "resume_from_checkpoint": Field(description="A checkpoint folder, or true for the latest checkpoint in "
                                                "output_dir."),
}
ALSO_ALLOWED = {"resume_from_checkpoint": Literal[True],  # read by distill.run.preflight.plan_run, not by the Trainer
                "dataloader_pin_memory": types.NoneType}  # null: decided by training_arguments on this machine
# the run folder's keys: Trainer.train gets resume
NOT_PASSED = ("resume_from_checkpoint", "overwrite_output_dir", "preemption_grace_s")
SET_BY_THE_RUN: dict[str, tuple[Any, str]] = {  # name -> (value, why)
    "eval_strategy": ("no", "acceptance is measured at every checkpoint (the eval: section); the Trainer has no "
                            "evaluation set"),
    "save_strategy": ("steps", "checkpoints, and the acceptance measured at each, come every train.save_steps"),
    "remove_unused_columns": (False, "the collator yields exactly the columns the loss reads"),
    "average_tokens_across_devices": (True, "the loss is a per-token mean over every process (distill/run/trainer.py)"),
    "ddp_find_unused_parameters": (False, "every trained parameter gets a gradient at every step"),
}
_HUB = "the hub: section publishes the exported draft (hub.push_to_hub, hub.repo_id, hub.private)"
_DEVICES = "device modes come from the accelerate config given to accelerate launch (recipes/accelerate/)"
LEFT_TO_OTHERS: dict[str, str] = {
    **{name: _HUB for name in ("push_to_hub", "hub_model_id", "hub_strategy", "hub_token", "hub_private_repo",
                               "hub_always_push", "hub_revision")},
    **{name: _DEVICES for name in ("deepspeed", "fsdp", "fsdp_config", "accelerator_config", "parallelism_config")},
    "gradient_checkpointing": "transformers 5 renamed it train.activation_checkpointing (the same switch)",
    "gradient_checkpointing_kwargs": "transformers 5 renamed it train.activation_checkpointing_kwargs",
}


# Our key -> the TrainingArguments field it was called before transformers 5.23 (the schema names the switch the same
# on every transformers this project takes; training_arguments passes it under the installed transformers' name).
FORMER_TRANSFORMERS_NAMES = {"activation_checkpointing": "gradient_checkpointing",
                             "activation_checkpointing_kwargs": "gradient_checkpointing_kwargs"}


def installed_names(arguments: type = TrainingArguments) -> dict[str, str]:
    """Our key -> the field of `arguments` (a TrainingArguments class) that holds it, for the keys whose name
    depends on the transformers release."""
    present = {f.name for f in dataclasses.fields(arguments)}
    return {ours: ours if ours in present else former for ours, former in FORMER_TRANSFORMERS_NAMES.items()
            if ours in present or former in present}


INSTALLED_NAMES = installed_names()


class RunFolderKeys(Section):
    """The optimisation loop: transformers.TrainingArguments' own fields (these rows: where our default or meaning
    differs), and two keys of ours: the output folder's, and the grace period after a preemption signal."""

    section = "train"
    refused = {**{name: f"set by the run to {value!r} ({why}); leave it out"
                  for name, (value, why) in SET_BY_THE_RUN.items()},
               **{name: f"not a recipe key: {why}" for name, why in LEFT_TO_OTHERS.items()}}
    former_names = {"warmup_ratio": "warmup_steps"}

    overwrite_output_dir: bool = Field(
        False, description="Start a new run in an output_dir that holds one (its checkpoints, logs and export are "
                           "deleted); without it such a run is refused.")
    preemption_grace_s: float = Field(
        30.0, gt=0, description="After SIGTERM, SIGINT, SIGUSR1 or SIGHUP (a scheduler's notice before it kills, a "
                                "terminal that closes): the step in progress ends, a checkpoint of it is saved and "
                                "the run exits with code 75 "
                                "(resume_from_checkpoint=true continues bit for bit); past this many seconds it exits "
                                "at once, the last complete checkpoint kept. 30 = SLURM's default KillWait.")

    @model_validator(mode="after")
    def _rules(self) -> RunFolderKeys:
        require(self.max_steps != 0, "train.max_steps", self.max_steps, "-1 or an integer > 0")
        require(not (self.overwrite_output_dir and self.resume_from_checkpoint), "train.overwrite_output_dir", True,
                "false with train.resume_from_checkpoint (resume keeps the run, overwrite deletes it)",
                ["train.resume_from_checkpoint"])
        return self


# ---------------------------------------------------------------------------------------------------------------
# The schema from TrainingArguments' fields
# ---------------------------------------------------------------------------------------------------------------

def _as_yaml_type(hint: Any) -> Any:
    """transformers' annotation as a recipe gives it: an Enum becomes a Literal of its values (the `| str` next to it
    is for the command line and goes), a bare dict or Any holds JSON values (so NaN is refused inside)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return Literal[tuple(member.value for member in hint)]
    if origin in (typing.Union, types.UnionType):
        has_enum = any(isinstance(a, type) and issubclass(a, enum.Enum) for a in args)
        kept = [_as_yaml_type(a) for a in args if not (has_enum and a is str)]
        return typing.Union[tuple(kept)]  # noqa: UP007 (built from a tuple; X | Y may give a types.UnionType instead)
    if origin is list:
        return list[_as_yaml_type(args[0])] if args else list[JsonValue]
    if hint is dict or (origin is dict and args[1] is Any):
        return dict[str, JsonValue]
    return JsonValue if hint is Any else hint


def schema_fields(arguments: type = TrainingArguments) -> dict[str, tuple[Any, FieldInfo]]:
    """(type, field) of every field of `arguments` (a TrainingArguments class) a recipe may set, under our key
    (FORMER_TRANSFORMERS_NAMES), with TRAINING_ARGUMENTS_CHANGES merged in."""
    hints = typing.get_type_hints(arguments)
    skipped = {*SET_BY_THE_RUN, *LEFT_TO_OTHERS, *RunFolderKeys.model_fields}
    ours = {installed: name for name, installed in installed_names(arguments).items()}  # a former field: our key
    fields = {}
    for f in dataclasses.fields(arguments):
        name = ours.get(f.name, f.name)
        if not f.init or (name in skipped and f.name not in ours):
            continue
        hint, change = _as_yaml_type(hints[f.name]), TRAINING_ARGUMENTS_CHANGES.get(name, Field())
        if f.name in ALSO_ALLOWED:
            hint = typing.Union[hint, ALSO_ALLOWED[f.name]]  # noqa: UP007 (X | Y may give a types.UnionType instead)
        if change.default_factory is not None:  # ours replaces transformers' default
            default = {}
        else:
            default = {"default_factory": f.default_factory} if f.default is dataclasses.MISSING \
                else {"default": f.default}
        info = FieldInfo.from_annotated_attribute(hint, Field(**default, description=f.metadata.get("help")))
        info = FieldInfo.merge_field_infos(info, change)
        fields[name] = (hint, info)
    return fields


def as_installed(values: dict[str, Any], names: dict[str, str] = INSTALLED_NAMES) -> dict[str, Any]:
    """A train section's values under the field names of the installed TrainingArguments (`names`: installed_names)."""
    return {names.get(key, key): value for key, value in values.items()}


TrainConfig = create_model("TrainConfig", __base__=RunFolderKeys, __module__=__name__, **schema_fields())
TrainConfig.__doc__ = RunFolderKeys.__doc__


def accelerator_present() -> bool:
    """Whether torch sees an accelerator (CUDA, XPU, MPS, ...) that pinned host memory would feed."""
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    return accelerator.is_available() if accelerator is not None else torch.cuda.is_available()


def training_arguments(cfg: TrainConfig) -> TrainingArguments:
    """transformers.TrainingArguments of a recipe's train section (checkpoints every save_steps, no Trainer eval).
    Raises ValueError where transformers refuses a combination of fields (distill.run.preflight names it)."""
    values = as_installed(cfg.model_dump(exclude=set(NOT_PASSED)))  # transformers < 5.23: gradient_checkpointing
    if values["dataloader_pin_memory"] is None:
        values["dataloader_pin_memory"] = accelerator_present()
    return TrainingArguments(**values, **{name: value for name, (value, _) in SET_BY_THE_RUN.items()})


def check_precision(cfg: TrainConfig, source: str | None = None) -> None:
    """Refuse mixed precision this machine cannot run, before TrainingArguments sees it.

    Raises RecipeError naming train.fp16 on a CPU-only run (accelerate would silently train in float32 there) and
    train.bf16 without a bfloat16-capable GPU (transformers refuses it with use_cpu unset, as train.py leaves it).
    """
    import torch
    from accelerate.utils import parse_flag_from_env
    from transformers.utils import is_torch_bf16_gpu_available

    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6: cuda, xpu, mps, ...
    has_gpu = accelerator.is_available() if accelerator is not None else torch.cuda.is_available()
    on_cpu = not has_gpu or parse_flag_from_env("ACCELERATE_USE_CPU") or cfg.use_cpu
    if cfg.fp16 and on_cpu:
        raise RecipeError("train.fp16", "got true on a CPU-only run; allowed: false. float16 mixed precision needs "
                          "a GPU (on CPU accelerate would silently train in float32); leave train.fp16 and "
                          "train.bf16 false on CPU", source)
    if cfg.bf16 and not cfg.use_cpu and (on_cpu or not is_torch_bf16_gpu_available()):  # use_cpu: CPU autocast
        raise RecipeError("train.bf16", "got true without a bfloat16-capable GPU; allowed: false. bfloat16 mixed "
                          "precision needs an Ampere-or-newer GPU here (transformers refuses it on CPU unless "
                          "TrainingArguments(use_cpu=True)); on a CPU add train.use_cpu=true for CPU autocast (worth "
                          "it where the CPU has AVX512-BF16 or AMX), or leave it false", source)
