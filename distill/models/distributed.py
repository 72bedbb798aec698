"""Distributed set-up: which launch mode this process is in, and DeepSpeed ZeRO-3's partitioned weights.

Device modes (single process, DDP, DeepSpeed ZeRO-1/2/3, FSDP2) come from the accelerate config given to
`accelerate launch`; `check_device_mode` refuses the settings DistillTrainer cannot run, before any weights load.
FSDP2's sharding of the target and its whole copies live in distill/models/fsdp.py; `is_partitioned` and `plain_copy`
answer for both kinds of sharded model.

Under DeepSpeed ZeRO-3 (`zero3_enabled`) both models are partitioned as they load (transformers' zero.Init): the
target gets DeepSpeed's inference hooks (`shard_for_inference`, every forward gathers one layer at a time) instead
of a replica per process, and `plain_copy` gathers a whole copy onto rank 0 (a collective: every rank calls it).
"""
from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from typing import Any

import torch
from accelerate import PartialState
from accelerate.utils import DistributedType
from torch import nn
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, PreTrainedModel, TrainingArguments
from transformers.initialization import no_init_weights

from distill.models.fsdp import LAYOUT, from_layout, fsdp_enabled, is_sharded, whole_copy
from distill.models.lora import is_lora

# ---------------------------------------------------------------------------------------------------------------
# Launch mode
# ---------------------------------------------------------------------------------------------------------------

class UnsupportedModeError(ValueError):
    """The launch configuration asks for a setting DistillTrainer cannot run (named in the message)."""


def fsdp_requested(args: TrainingArguments) -> bool:
    """Whether this run is to use FSDP: asked for in TrainingArguments, by the accelerate launcher, or by an
    Accelerator that already exists.

    The check runs before the Trainer creates its Accelerator, when accelerate has not decided yet: `accelerate
    launch` with an FSDP config passes ACCELERATE_USE_FSDP, which AcceleratorState reads when it is created
    (distill.models.fsdp.fsdp_enabled reads it with accelerate's own flag parser). An AcceleratorState set up earlier in
    this process (a script that made its own Accelerator) answers for itself.
    """
    return bool(args.fsdp) or fsdp_enabled()


# FSDP settings from the accelerate config (the launcher passes them as these variables) -> what they must be
FSDP_SETTINGS = {
    "FSDP_VERSION": ("2", "fsdp_version: 2 (FSDP1 is not supported)"),
    "FSDP_STATE_DICT_TYPE": ("SHARDED_STATE_DICT", "fsdp_state_dict_type: SHARDED_STATE_DICT (resume reads the "
                             "sharded state; whole weights are written next to it)"),
    "FSDP_CPU_RAM_EFFICIENT_LOADING": ("false", "fsdp_cpu_ram_efficient_loading: false (every process loads the "
                                       "models before sharding them)"),
}


def check_device_mode(args: TrainingArguments) -> None:
    """Raise UnsupportedModeError for ZeRO-3 unless checkpoints hold whole weights (the export and acceptance read
    them), and for FSDP settings other than FSDP_SETTINGS (recipes/accelerate/fsdp.yaml has them)."""
    if args.deepspeed_plugin is not None and args.deepspeed_plugin.zero_stage == 3:
        zero = args.deepspeed_plugin.deepspeed_config.get("zero_optimization", {})
        if zero.get("stage3_gather_16bit_weights_on_model_save") is not True:
            raise UnsupportedModeError(
                "DeepSpeed ZeRO-3 needs whole weights in every checkpoint: set zero3_save_16bit_model: true in the "
                "accelerate config (recipes/accelerate/deepspeed_zero3.yaml), or "
                "zero_optimization.stage3_gather_16bit_weights_on_model_save: true in a DeepSpeed JSON config")
    if fsdp_requested(args):
        defaults = {"FSDP_VERSION": "1", "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT",
                    "FSDP_CPU_RAM_EFFICIENT_LOADING": "false"}  # accelerate's defaults when the config says nothing
        for variable, (wanted, setting) in FSDP_SETTINGS.items():
            value = os.environ.get(variable, defaults[variable])
            if value.upper() != wanted.upper():
                raise UnsupportedModeError(f"FSDP needs {setting} in the accelerate config, got {value} "
                                           "(recipes/accelerate/fsdp.yaml)")


# What a collective raises when a peer process is gone: gloo's closed or reset connection, NCCL's watchdog timeout or
# remote error, torch's DistBackendError / DistNetworkError.
LOST_PEER = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Watchdog caught collective",
             "timed out", "Timed out", "NCCL communicator was aborted", "remote process exited")


def lost_peer(err: BaseException) -> str | None:
    """The one line for a collective that failed because another process of the run stopped (killed, crashed, out of
    memory) or hung past the collective timeout (train.ddp_timeout); None for any other error or a single process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    text = str(err)
    backend_error = type(err).__name__ in ("DistBackendError", "DistNetworkError", "DistStoreError")
    if not backend_error and not (isinstance(err, RuntimeError) and any(cue in text for cue in LOST_PEER)):
        return None
    rank, world = dist.get_rank(), dist.get_world_size()
    others = [r for r in range(world) if r != rank]
    who = f"rank {others[0]}" if len(others) == 1 else "another rank (the launcher's summary names it)"
    return (f"rank {rank} of {world}: {who} stopped or stopped answering in a collective, so this process stops too "
            f"({type(err).__name__}); the complete checkpoints are intact: continue with "
            "train.resume_from_checkpoint=true, on as many processes")


def check_fsdp_devices(args: TrainingArguments) -> None:
    """Raise UnsupportedModeError for FSDP on CPU processes (accelerate launch with ACCELERATE_USE_CPU): accelerate
    applies its FSDP plugin to GPU process groups only, so the draft would train unsharded next to a sharded target.
    Call after the processes are set up (TrainingArguments), before anything loads."""
    state = PartialState()
    if fsdp_requested(args) and state.distributed_type in (DistributedType.MULTI_CPU, DistributedType.NO) \
            and state.device.type == "cpu":
        raise UnsupportedModeError(
            "FSDP2 needs GPUs: accelerate applies its FSDP plugin to GPU processes only, so on CPU processes the draft "
            "would train unsharded next to a sharded target; try a recipe on CPU processes with DDP: "
            "ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 --num_machines 1 "
            "--mixed_precision no --dynamo_backend no scripts/train.py RECIPE.yaml")


# ---------------------------------------------------------------------------------------------------------------
# DeepSpeed ZeRO-3: partitioned weights
# ---------------------------------------------------------------------------------------------------------------

def zero3_enabled() -> bool:
    """True when the TrainingArguments of this process configured DeepSpeed ZeRO-3."""
    from transformers.integrations import is_deepspeed_zero3_enabled
    return is_deepspeed_zero3_enabled()


def is_partitioned(model: nn.Module) -> bool:
    """True when some weight of `model` is a ZeRO-3 partition or an FSDP2 shard (only 1/P of it lives in this
    process): every rank must run its forwards, and whole copies are gathered (plain_copy)."""
    return _zero3_partitioned(model) or is_sharded(model)


def _zero3_partitioned(model: nn.Module) -> bool:
    return any(hasattr(p, "ds_id") for p in model.parameters())


@contextlib.contextmanager
def outside_zero3_init() -> Iterator[None]:
    """Build models whole in this process even under ZeRO-3 (transformers would otherwise partition them)."""
    if not zero3_enabled():
        yield
        return
    from transformers.modeling_utils import set_zero3_state
    with set_zero3_state():
        yield


def zero3_inference_config(train_config: dict[str, Any], hidden_size: int | None,
                           dtype: torch.dtype) -> dict[str, Any]:
    """The DeepSpeed config for a frozen model under ZeRO-3, from the training run's config (not changed).

    No optimizer, scheduler or optimizer offload; the batch keys are placeholders (no training step is taken);
    precision follows the model's own dtype, so DeepSpeed never casts it; "auto" bucket sizes get TRL's values for
    `hidden_size` (the Trainer fills them for the draft only). Parameter offload is kept.
    """
    config = copy.deepcopy(train_config)
    for key in ("optimizer", "scheduler", "train_batch_size", "gradient_clipping"):
        config.pop(key, None)
    config.update(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1,
                  bf16={"enabled": dtype == torch.bfloat16}, fp16={"enabled": dtype == torch.float16})
    zero = config.setdefault("zero_optimization", {})
    zero["stage"] = 3
    zero.pop("offload_optimizer", None)
    if hidden_size:
        for key, value in (("reduce_bucket_size", hidden_size * hidden_size),
                           ("stage3_prefetch_bucket_size", int(0.9 * hidden_size * hidden_size)),
                           ("stage3_param_persistence_threshold", 10 * hidden_size)):
            if zero.get(key, "auto") == "auto":
                zero[key] = value
    return config


def shard_for_inference(model: PreTrainedModel) -> PreTrainedModel:
    """Give a frozen, ZeRO-3-partitioned model DeepSpeed's inference hooks (as TRL does for its reference model):
    each forward gathers a layer's weights, runs it and frees them. Every process must run every forward. Returns
    `model` itself (hooked in place) in eval mode."""
    import deepspeed
    from transformers.integrations.deepspeed import deepspeed_config

    hidden_size = getattr(model.config.get_text_config(), "hidden_size", None)
    config = zero3_inference_config(deepspeed_config(), hidden_size, next(model.parameters()).dtype)
    engine, *_ = deepspeed.initialize(model=model, config=config)
    return engine.module.eval()


@contextlib.contextmanager
def gathered(params: list[nn.Parameter]) -> Iterator[None]:
    """The ZeRO-3 partitions among `params` whole inside the block, to read (a collective: every rank enters it when
    one is partitioned); nothing happens for plain parameters."""
    partitioned = [p for p in params if hasattr(p, "ds_id")]
    if not partitioned:
        yield
        return
    import deepspeed
    with deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None):
        yield


@contextlib.contextmanager
def whole_parameter(param: nn.Parameter) -> Iterator[torch.Tensor]:
    """The whole tensor of `param` inside the block, to read: a ZeRO-3 partition gathered, an FSDP2 shard
    all-gathered (each a collective: every rank enters it), a plain parameter as it is."""
    if isinstance(param, DTensor):
        yield param.full_tensor()
        return
    with gathered([param]):
        yield param.data if hasattr(param, "ds_id") else param


def _gathered_state_dict(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """Every parameter of a ZeRO-3 model, whole and on the CPU, on rank 0 (None elsewhere). A collective: every rank
    calls it; one weight is gathered at a time, so no process ever holds more than one whole weight extra.
    Buffers are left out: ZeRO-3 does not partition them and a model's buffers follow from its config."""
    import deepspeed

    state: dict[str, torch.Tensor] = {}
    rank_zero = torch.distributed.get_rank() == 0
    for name, param in model.named_parameters():
        with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
            if rank_zero:
                state[name] = param.data.detach().to("cpu", copy=True)
    return state if rank_zero else None


def _empty_like(model: PreTrainedModel) -> PreTrainedModel:
    """A whole (unpartitioned) model on the CPU with `model`'s architecture and dtype; weights not initialised."""
    with outside_zero3_init(), no_init_weights():
        return AutoModelForCausalLM.from_config(model.config, dtype=next(model.parameters()).dtype)


def plain_copy(model: nn.Module) -> PreTrainedModel | None:
    """A plain transformers model equal to `model`, which is left unchanged: LoRA adapters are merged into the
    weights (merge_and_unload), ZeRO-3 partitions or FSDP2 shards gathered (into the layout remembered for a model
    that is not a transformers model, e.g. an EAGLE-3 head: distill.models.fsdp.remember_layout). The copy is on
    the CPU when gathered, else on the model's device.

    A collective when `model` is partitioned (every rank must call it; the copy is returned on rank 0, None
    elsewhere); otherwise a local copy.
    """
    if is_sharded(model):  # FSDP2: the full state dict into the layout remembered before sharding
        copied = whole_copy(model)
        if copied is None:
            return None
    elif _zero3_partitioned(model):
        state = _gathered_state_dict(model)
        if state is None:
            return None
        if LAYOUT in model.__dict__:  # not a transformers model (an EAGLE-3 head): its layout, its own buffers
            params = dict(model.named_parameters())
            buffers = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items() if k not in params}
            return from_layout(model, {**state, **buffers}).eval()
        copied = _empty_like(model)  # LoRA under ZeRO-3 is refused by load_draft: no adapters here
        missing, unexpected = copied.load_state_dict(state, strict=False)
        named = dict(copied.named_parameters())
        if unexpected or any(key in named for key in missing):
            raise RuntimeError(f"gathered weights do not fit the model: missing {missing}, unexpected {unexpected}")
        copied.tie_weights()
    else:
        copied = copy.deepcopy(model)
    if is_lora(copied):
        copied = copied.merge_and_unload()
    return copied.eval()
