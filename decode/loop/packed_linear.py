"""oneDNN-packed linear layers for eager decoding on CPU.

``F.linear`` on CPU multiplies by the weight as stored (row-major [out, in]) at every call; oneDNN can reorder a
weight once into its own blocked layout and multiply by that. A 1-token step costs about the same either way, but a
few-token product gets much cheaper, so a verify pass costs little more than a 1-token step (what it costs, per CPU,
and what that does to speculative decoding: docs/benchmarks/verify_cost.md).

    n = pack_linears(model)   # after loading, before decoding; 0 on CUDA, without oneDNN, or when already packed
    tune_plain_rows(model, range(1, 6))   # optional: F.linear at the row counts where it measured faster

Which kernel is faster depends on the CPU and the row count (on some CPUs F.linear wins at 1-3 rows).
``tune_plain_rows`` times both on the model's own layers at each row count (a decoder's 1-token step, its
gamma + 1-token verify pass) and keeps F.linear where it was faster (``specdistill-eval --cpu-linear auto``).

A ``PackedLinear`` keeps the original ``weight`` and ``bias`` parameters (state_dict, tied embeddings and code
reading ``model.lm_head.weight`` are unchanged) and a packed copy of the weight beside them, repacked if the weight
is modified in place. It computes with the packed copy only under ``torch.no_grad``/``inference_mode`` and outside
``torch.compile``; with autograd on, or while being compiled, it is a plain ``F.linear``. It is meant for
inference models that a decoder owns: never pack a model that is still training.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


def packing_available(weight: torch.Tensor) -> bool:
    """Whether oneDNN can pack ``weight``: a whole CPU tensor of a packable dtype (not a DTensor shard of FSDP2 nor a
    DeepSpeed ZeRO-3 partition, whose values live elsewhere), oneDNN built in (and bf16 support for bfloat16)."""
    if weight.device.type != "cpu" or weight.dtype not in PACKABLE_DTYPES or not torch.backends.mkldnn.is_available():
        return False
    if type(weight.detach()) is not torch.Tensor or hasattr(weight, "ds_id"):
        return False
    return weight.dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()


class PackedLinear(nn.Linear):
    """``nn.Linear``'s product, y = x W^T + b, computed with a oneDNN-packed copy of W (x [..., in] -> [..., out])."""

    def __init__(self, linear: nn.Linear) -> None:
        nn.Module.__init__(self)  # not nn.Linear.__init__: the parameters are the given layer's own, not new ones
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.packed: torch.Tensor | None = None
        self.packed_from: tuple[int, int] | None = None  # weight_key() of the weight that was packed
        self.plain_rows: frozenset[int] = frozenset()  # row counts (tokens) multiplied by F.linear instead
        self.packed_weight()

    def weight_key(self) -> tuple[int, int]:
        """(storage address, version counter) of the weight: changes when it is moved, cast or modified in place
        (an inference tensor has no version counter: only a move or a cast shows)."""
        weight = self.weight
        return weight.data_ptr(), 0 if weight.is_inference() else weight._version

    @torch.no_grad()
    def packed_weight(self) -> torch.Tensor | None:
        """The weight reordered into oneDNN's blocked layout (repacked after a change of the weight; None where it
        cannot be packed). No batch-size hint: packed for 1 row, 5-row products (a verify pass) take twice as long;
        without one, 1-row products cost the same and 5-row ones the least."""
        if self.packed_from != self.weight_key():
            weight = self.weight.detach()
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None) if packing_available(weight) else None
            self.packed_from = self.weight_key()
        return self.packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or torch.compiler.is_compiling() or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        if torch.is_autocast_enabled(x.device.type):  # autocast casts inside F.linear: keep its precision
            return F.linear(x, self.weight, self.bias)
        if self.plain_rows and x.numel() // self.in_features in self.plain_rows:
            return F.linear(x, self.weight, self.bias)
        packed = self.packed_weight()
        if packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, packed, self.bias, "none", [], "")

    def __getstate__(self) -> dict:
        # oneDNN's packed tensors cannot be copied or pickled: a copy repacks on its first call
        return {**super().__getstate__(), "packed": None, "packed_from": None}


def pack_linears(model: nn.Module) -> int:
    """Swap every ``nn.Linear`` of ``model`` whose weight oneDNN can pack (CPU, float32 or bfloat16) for a
    ``PackedLinear`` sharing its parameters, in place; the number swapped (0 on CUDA, without oneDNN, or for a model
    already packed). For inference models only: see the module docstring."""
    return len(_swap_in_packed(model))


def _swap_in_packed(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """pack_linears' swaps: (parent, name, the nn.Linear replaced). A layer with forward hooks (accelerate's
    offloading, a user's probe) stays as it is: a PackedLinear would not run them."""
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if type(child) is nn.Linear and packing_available(child.weight) and not has_hooks(child)]
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear(child))
    return swaps


def has_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or getattr(module, "_hf_hook", None))


@dataclass(frozen=True)
class Packing:
    """What packed_linears did: how many layers it packed and, per model given, the token counts those layers keep on
    F.linear (None for a model with nothing packed by the block, or not a module)."""

    layers: int
    plain_rows: tuple[frozenset[int] | None, ...]


@contextmanager
def packed_linears(*models: object, tune_rows: Iterable[int] = (),
                   plain_rows: Sequence[frozenset[int] | None] | None = None) -> Iterator[Packing]:
    """Inside the block, the linear layers of each model (None and non-modules skipped) multiply by oneDNN-packed
    weights (pack_linears), keeping F.linear at the token counts of ``tune_rows`` where that measured faster
    (tune_plain_rows), or, with ``plain_rows`` (one entry per model, as a previous block's Packing gave them), at
    those token counts without timing anything. After the block (also on error) exactly the layers it packed are the
    original ``nn.Linear`` modules again, with the same parameters, and the packed copies are freed.

    For a model that generates for a while and is then used otherwise: the target writing training data or caches
    (its forwards run without autograd), a draft measured between training steps (what it gains:
    docs/benchmarks/responses.md, docs/benchmarks/hidden_cache.md)."""
    swapped = [(model, _swap_in_packed(model) if isinstance(model, nn.Module) else []) for model in models]
    try:
        rows, chosen = list(tune_rows), []
        for i, (model, swaps) in enumerate(swapped):
            if not swaps:
                chosen.append(None)
            elif plain_rows is not None and plain_rows[i] is not None:
                set_plain_rows(model, plain_rows[i])
                chosen.append(frozenset(plain_rows[i]))
            else:
                chosen.append(tune_plain_rows(model, rows) if rows else frozenset())
        yield Packing(sum(len(swaps) for _, swaps in swapped), tuple(chosen))
    finally:
        for _, swaps in swapped:
            for parent, name, linear in swaps:
                setattr(parent, name, linear)


def packed_layers(model: nn.Module) -> list[PackedLinear]:
    """The ``PackedLinear`` layers of ``model``, in module order."""
    return [m for m in model.modules() if isinstance(m, PackedLinear)]


def set_plain_rows(model: nn.Module, rows: Iterable[int]) -> None:
    """Every packed layer of ``model`` multiplies ``rows``-row inputs by F.linear, every other row count packed."""
    for layer in packed_layers(model):
        layer.plain_rows = frozenset(rows)


@torch.inference_mode()
def time_layers(layers: list[PackedLinear], inputs: dict[tuple[int, int], torch.Tensor], rows: int) -> float:
    """Seconds to run every layer once on a ``rows``-row input: the linear part of a forward of ``rows`` tokens,
    every weight streamed from memory as in the model's own pass."""
    started = time.perf_counter()
    for layer in layers:
        layer(inputs[rows, layer.in_features])
    return time.perf_counter() - started


def faster_plain(seconds: dict[tuple[int, str], list[float]]) -> frozenset[int]:
    """The row counts whose median F.linear time ("plain") is below the packed one: {(rows, mode): [s, ...]}."""
    median = {key: statistics.median(times) for key, times in seconds.items()}
    return frozenset(n for n, mode in median if mode == "plain" and median[n, "plain"] < median[n, "packed"])


def tune_plain_rows(model: nn.Module, rows: Iterable[int], rounds: int = 5) -> frozenset[int]:
    """Time the packed layers of ``model`` with both kernels at each row count of ``rows`` (``rounds`` interleaved
    rounds after one warm-up, medians compared), set F.linear where it was faster (``set_plain_rows``) and return
    those row counts. Row counts not tuned (a prefill) stay packed. Nothing to tune: an empty set."""
    layers, counts = packed_layers(model), sorted(set(rows))
    if not layers or not counts:
        return frozenset()
    generator = torch.Generator().manual_seed(0)
    inputs = {(n, width): torch.randn(n, width, generator=generator).to(layers[0].weight.dtype)
              for n in counts for width in {layer.in_features for layer in layers}}
    seconds: dict[tuple[int, str], list[float]] = {(n, mode): [] for n in counts for mode in ("packed", "plain")}
    for round_ in range(rounds + 1):
        for n in counts:
            for mode in ("packed", "plain") if (round_ + n) % 2 else ("plain", "packed"):
                set_plain_rows(model, [n] if mode == "plain" else [])
                elapsed = time_layers(layers, inputs, n)
                if round_:  # round 0 warms up
                    seconds[n, mode].append(elapsed)
    chosen = faster_plain(seconds)
    set_plain_rows(model, chosen)
    return chosen
