"""FSDP2 (torch.distributed.fsdp.fully_shard): the frozen target sharded for inference, whole copies of sharded
models, and the heads the loss reads after a forward.

Under `accelerate launch --config_file recipes/accelerate/fsdp.yaml` (fsdp_version: 2) accelerate shards the draft
when the Trainer prepares it (fsdp2_prepare_model: one unit per module whose class is named in the draft's
`_no_split_modules`, the input embedding, the final norm with the output head kept whole after the forward, the rest
as the root); nothing here assumes a transformers class for it. The target is never prepared by the Trainer:
`shard_for_inference` shards it here the same way (one unit per layer class, the output head, the root), every unit
resharded after each forward, with no gradients and no optimizer state. Every forward of a sharded model is a
collective: every rank must run it.

Whole copies (`whole_copy`, `local_copy`) are built from a meta-device layout taken before sharding
(`remember_layout`: the module deep-copied with its parameters on the meta device, its buffers real) and a full
state dict gathered by torch.distributed.checkpoint.state_dict, so any nn.Module (a peft model, a hidden-state head)
is copied as the same class.
"""
from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from accelerate.state import AcceleratorState, is_initialized
from accelerate.utils import DistributedType, parse_flag_from_env
from torch import nn
from torch.distributed.tensor import DTensor

LAYOUT = "_specdistill_layout"  # key in a module's __dict__ (not a submodule: never in state_dict or modules())


def fsdp_enabled() -> bool:
    """Whether this process runs under FSDP: asked for by the accelerate launcher (ACCELERATE_USE_FSDP, read with
    accelerate's own parser) or by an AcceleratorState that already exists."""
    if parse_flag_from_env("ACCELERATE_USE_FSDP"):
        return True
    return is_initialized() and AcceleratorState().distributed_type == DistributedType.FSDP


def is_sharded(model: nn.Module) -> bool:
    """True when some parameter of `model` is an FSDP2 shard (a DTensor: only 1/P of it lives in this process)."""
    return any(isinstance(p, DTensor) for p in model.parameters())


# ---------------------------------------------------------------------------------------------------------------
# The frozen target, sharded for inference
# ---------------------------------------------------------------------------------------------------------------

def _layer_classes(model: nn.Module) -> set[str]:
    """Class names of the blocks to shard one by one: the model's `_no_split_modules` (transformers' convention;
    any nn.Module may declare it), else none (the model is one unit)."""
    return set(getattr(model, "_no_split_modules", None) or ())


def shard_for_inference(target: nn.Module, device: torch.device) -> nn.Module:
    """Shard the frozen `target` in place over every process with fully_shard: one unit per layer (classes named in
    `_no_split_modules`), the input embedding (when not tied to the output head), the rest (final norm, output
    head) as the root; each unit is gathered for its forward and freed after it (reshard_after_forward for the root
    too). Every process holds 1/P of each weight on `device` and must run every forward. Returns `target` in eval
    mode."""
    from torch.distributed import get_world_size
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    remember_layout(target)
    mesh = init_device_mesh(device.type, (get_world_size(),))
    layers = _layer_classes(target)
    for module in list(target.modules())[1:]:
        if type(module).__name__ in layers:
            fully_shard(module, mesh=mesh, reshard_after_forward=True)
    head = getattr(target, "get_output_embeddings", lambda: None)()  # any nn.Module: these are transformers' names
    embed = getattr(target, "get_input_embeddings", lambda: None)()
    if embed is not None and (head is None or head.weight is not embed.weight):
        fully_shard(embed, mesh=mesh, reshard_after_forward=True)
    # the head stays in the root: whole_head gathers it for the loss, which calls it as a plain module
    fully_shard(target, mesh=mesh, reshard_after_forward=True)
    return target.eval()


@contextlib.contextmanager
def whole_head(model: nn.Module, head: nn.Module | None) -> Iterator[None]:
    """`head`'s weights whole inside the block when they belong to the root unit of the FSDP-sharded `model` (as
    shard_for_inference leaves the target's head): the root is gathered before and freed after. A collective:
    every rank enters it. The loss then calls the head, a plain module without FSDP hooks, on its own chunks with
    no collective per chunk (ranks keep different numbers of tokens)."""
    from torch.distributed.fsdp import FSDPModule

    if head is None or not isinstance(head.weight, DTensor):
        yield  # not sharded, or already whole (the draft's head: accelerate keeps it whole after the forward)
        return
    if isinstance(head, FSDPModule) or not isinstance(model, FSDPModule):
        raise RuntimeError(f"the output head of {type(model).__name__} must belong to its root FSDP unit")
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


@contextlib.contextmanager
def generating_on(target: nn.Module, device: torch.device) -> Iterator[None]:
    """Under FSDP2, before the target is sharded (it is whole on every process's CPU): on the main process the
    target is on `device` inside the block (it generates the target's responses or the teacher cache there alone,
    as acceptance at checkpoints does), and back on the CPU after. Does nothing otherwise."""
    from accelerate import PartialState

    if not fsdp_enabled() or not PartialState().is_main_process or is_sharded(target):
        yield
        return
    target.to(device)
    try:
        yield
    finally:
        target.to("cpu")


# ---------------------------------------------------------------------------------------------------------------
# Whole copies
# ---------------------------------------------------------------------------------------------------------------

def remember_layout(model: nn.Module, keep_weights: bool = False) -> None:
    """Keep a copy of `model` with its parameters on the meta device (no memory) and its buffers real, taken before
    it is sharded: the skeleton of every whole copy of it. `keep_weights` keeps a real copy of the weights instead
    (a LoRA draft: its frozen base, which rank 0 needs alone to merge the adapters of a checkpoint)."""
    if LAYOUT in model.__dict__:
        return
    memo = {} if keep_weights else {
        id(p): nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
        for p in model.parameters()}
    model.__dict__[LAYOUT] = copy.deepcopy(model, memo)


def unsharded_original(model: nn.Module) -> nn.Module:
    """The copy remember_layout kept of `model` (its weights as loaded when kept), else `model` itself."""
    return model.__dict__.get(LAYOUT, model)


def from_layout(model: nn.Module, state: dict[str, torch.Tensor]) -> nn.Module:
    """A plain module of `model`'s class (its remembered layout) holding the tensors of the full `state`."""
    layout = model.__dict__.get(LAYOUT)
    if layout is None:
        raise RuntimeError(f"{type(model).__name__} was sharded without remember_layout: no whole copy can be made")
    copied = copy.deepcopy(layout)  # meta parameters: nothing allocated
    copied.load_state_dict(state, strict=True, assign=True)
    if hasattr(copied, "tie_weights"):
        copied.tie_weights()  # assign=True put separate tensors under tied names
    return copied


def _full_state(model: nn.Module, *, everywhere: bool) -> dict[str, torch.Tensor]:
    """Every weight of the sharded `model`, whole: on rank 0's CPU only (empty elsewhere), or on every rank's
    device with `everywhere`. A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=not everywhere)
    return get_model_state_dict(model, options=options)


def whole_copy(model: nn.Module) -> nn.Module | None:
    """A plain (unsharded) copy of the FSDP-sharded `model` on rank 0's CPU, None on the other ranks; `model` is left
    unchanged. A collective: every rank calls it."""
    state = _full_state(model, everywhere=False)
    return from_layout(model, state) if state else None


def local_copy(model: nn.Module) -> nn.Module:
    """A plain copy of the FSDP-sharded `model` on every rank, on its device (e.g. to sample from it without a
    collective per forward). A collective: every rank calls it."""
    state = _full_state(model, everywhere=True)
    copied = from_layout(model, state)
    # the layout's buffers were kept on the CPU: they join the weights on this rank's device
    return copied.to(next(iter(state.values())).device) if state else copied
