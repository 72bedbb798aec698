"""EAGLE-3 heads in a run (model.draft_kind eagle3): the plan from configs, the head built from the target, the
draft vocabulary from the training rows, and the head read back from a checkpoint (its served folder:
kinds.eagle3.Eagle3Kind.save).

The head itself (its maths, files and vLLM semantics) is kinds/eagle3/model.py; its training-time test is
kinds/eagle3/loss.py; HeadTrainer (kinds/eagle3/trainer.py) trains it through kinds.eagle3.loss.UnrolledHead.

Under ZeRO-3 and FSDP2 (where heads train from the hidden-state cache) a head reads a whole copy of the target's
input embedding (`head_embedding`) and its teacher is a whole copy of the target's lm_head (`teacher_lm_head`): no
training step runs the sharded target.

Draft vocabulary: the `model.draft_vocab_size` most frequent tokens among the label tokens of the tokenised
training rows (every row a process trains on: dataset rows and target responses alike), ties broken by the smaller
id, kept in ascending id order (Eagle3Head.set_vocab). Counted on the main process, sent to the others.
"""
from __future__ import annotations

import logging
from pathlib import Path

import datasets
import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel

from decode.inputs.checks import safetensors_header
from distill.models.distributed import gathered, is_partitioned, whole_parameter, zero3_enabled
from distill.models.fsdp import fsdp_enabled
from distill.recipe.sections import ModelKeys
from distill.utils import ModelSetupError
from kinds.draft_vocab import frequent_label_tokens
from kinds.eagle3.loss import UnrolledHead
from kinds.eagle3.model import Eagle3Head, head_config

logger = logging.getLogger(__name__)

MAX_DEFAULT_DRAFT_VOCAB = 32768  # model.draft_vocab_size null: the whole vocabulary up to this size


def draft_vocab_size(cfg: ModelKeys, vocab_size: int) -> int:
    """model.draft_vocab_size, or its default: the whole vocabulary when it is <= 32768 tokens, else 32768."""
    return cfg.draft_vocab_size if cfg.draft_vocab_size is not None else min(vocab_size, MAX_DEFAULT_DRAFT_VOCAB)


def plan_head(cfg: ModelKeys, target_config: PretrainedConfig) -> PretrainedConfig:
    """The head's config from the target's (configs only, no weights). Raises ModelSetupError for an aux layer id
    the target does not have or a draft vocabulary larger than the target's."""
    vocab = target_config.get_text_config().vocab_size
    size = draft_vocab_size(cfg, vocab)
    if size > vocab:
        raise ModelSetupError(f"model.draft_vocab_size: got {size}; allowed: an integer in [1, {vocab}] (the "
                              "target's vocabulary size)")
    text = target_config.get_text_config()
    missing = [key for key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "max_position_embeddings")
               + (("intermediate_size",) if cfg.head_intermediate_size is None else ())
               if not isinstance(getattr(text, key, None), int)]
    if missing or getattr(text, "rope_parameters", None) is None:
        raise ModelSetupError(f"model.draft_kind: an EAGLE-3 head needs a Llama-like target with rotary positions "
                              f"(Llama, Qwen2, Mistral, ...); {type(text).__name__} has no "
                              f"{', '.join(missing) or 'rope_parameters'}")
    if text.num_hidden_layers < 3:
        raise ModelSetupError(f"model.draft_kind: an EAGLE-3 head reads the hidden states of 3 distinct target "
                              f"layers (as vLLM serves it); the target has {text.num_hidden_layers}")
    try:
        return head_config(target_config, aux_layers=cfg.aux_layers, draft_vocab_size=size,
                           intermediate_size=cfg.head_intermediate_size, num_layers=cfg.head_layers)
    except ValueError as err:
        raise ModelSetupError(f"model.aux_layers: {err}") from None


def head_embedding(target: PreTrainedModel) -> nn.Module:
    """The target's input embedding as its head reads it: the module itself; under ZeRO-3 or FSDP2, where the target is
    (or will be) sharded, a whole frozen nn.Embedding of its weights on this process (gathered under ZeRO-3: a
    collective), so the head embeds tokens without a collective and rank 0 can measure it alone."""
    embed = target.get_input_embeddings()
    if not (zero3_enabled() or fsdp_enabled()):
        return embed
    with whole_parameter(embed.weight) as weight:
        return nn.Embedding.from_pretrained(weight.detach().clone(), freeze=True,
                                            padding_idx=getattr(embed, "padding_idx", None))


def teacher_lm_head(target: PreTrainedModel) -> nn.Module:
    """The target's lm_head with whole weights on this process: the module itself, or for a sharded target (ZeRO-3,
    FSDP2) a frozen nn.Linear copy of its weights (gathered: a collective, every rank calls it). The teacher of a
    head trained from the hidden-state cache: only this copy of the target is needed in a training step."""
    head = target.get_output_embeddings()
    if not is_partitioned(head):
        return head
    parts = [p for p in (head.weight, getattr(head, "bias", None)) if p is not None]
    copies = []
    for part in parts:
        with whole_parameter(part) as whole:
            copies.append(whole.detach().clone())
    weight = copies[0]  # [V, H']
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=len(copies) > 1, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        for param, value in zip(linear.parameters(), copies):
            param.copy_(value)
    return linear.requires_grad_(False)


def build_head(cfg: ModelKeys, target: PreTrainedModel, dtype: torch.dtype,
               config: PretrainedConfig | None = None) -> Eagle3Head:
    """A fresh, trainable head on `target` (its input embedding shared and frozen: head_embedding), in train mode,
    of `config` (default: plan_head's). Its vocabulary is the first draft_vocab_size ids until set_draft_vocabulary."""
    head = Eagle3Head(config or plan_head(cfg, target.config)).to(dtype)
    head.bind_embeddings(head_embedding(target))
    head.set_vocab(torch.arange(head.d2t.numel()))
    return head.requires_grad_(True).train()


@torch.no_grad()
def init_from_target(head: Eagle3Head, target: PreTrainedModel) -> list[str]:
    """model.head_init target: copy into the head what has the same role in the target, so training starts from a
    head that already reads out like the target. Call after the draft vocabulary is set. Returns the names copied.
    The head's N layers stand for the target's last N (L - N .. L - 1):

        lm_head[i]  = target.lm_head[d2t-mapped id of draft id i]       (the rows of the draft vocabulary)
        norm        = target's final norm
        midlayer.mlp, post_attention_layernorm = the target's layer L - N's (when the MLP widths match)
        layers.i    = the target's layer L - N + i, whole (when every shape matches)
    """
    inner = target.get_decoder() if hasattr(target, "get_decoder") else None
    layers = getattr(inner, "layers", None)
    out, final_norm = target.get_output_embeddings(), getattr(inner, "norm", None)
    count = len(layers) if layers is not None else 0
    sources = [layers[count - head.num_layers + i] if count >= head.num_layers else None
               for i in range(head.num_layers)]  # the target layer each head layer starts from
    read = [p for m in (out, final_norm, *sources) if m is not None for p in m.parameters()]
    copied = []
    with gathered(read):  # ZeRO-3: the target's partitions whole while they are read (a collective)
        if out is not None and out.weight.shape[1] == head.lm_head.weight.shape[1]:
            rows = out.weight.index_select(0, head.target_ids.to(out.weight.device))  # [V_draft, H]
            head.lm_head.weight.copy_(rows.to(head.lm_head.weight))
            copied.append("lm_head")
        if final_norm is not None and final_norm.weight.shape == head.norm.weight.shape:
            head.norm.weight.copy_(final_norm.weight.to(head.norm.weight))
            copied.append("norm")
        first = sources[0]
        src = first.mlp.state_dict() if first is not None and hasattr(first, "mlp") else {}
        dst = head.midlayer.mlp.state_dict()
        if src.keys() == dst.keys() and all(src[k].shape == dst[k].shape for k in dst):
            head.midlayer.mlp.load_state_dict({k: v.to(dst[k]) for k, v in src.items()})
            head.midlayer.post_attention_layernorm.weight.copy_(
                first.post_attention_layernorm.weight.to(head.fc.weight))
            copied.append("midlayer.mlp")
        for index, source in enumerate(sources[1:], start=1):
            copied += copy_layer(head.layer(index), source, f"layers.{index}")
    return copied


@torch.no_grad()
def fc_from_last_aux(head: Eagle3Head) -> None:
    """model.head_fc_init last_aux: fc [H, k H'] = [0 ... 0 | I], so fuse(h) = h[l_k], the target's hidden state at
    the deepest aux layer (the residual stream the head adds its attention and MLP to). Needs H = H'."""
    width, fused_width = head.fc.weight.shape
    source = head.config.target_hidden_size
    if width != source:
        raise ModelSetupError(f"model.head_fc_init: last_aux needs the head's hidden size ({width}) to be the "
                              f"target's ({source}); use random")
    head.fc.weight.zero_()
    head.fc.weight[:, fused_width - source:].copy_(torch.eye(source, dtype=head.fc.weight.dtype))


@torch.no_grad()
def attention_from_target(head: Eagle3Head, target: PreTrainedModel, required: bool = True) -> bool:
    """model.head_attn_init target: the first layer's attention starts as the target's layer L - N's (the layer its MLP
    starts from), reading the hidden half of x = [input_layernorm(embed), hidden_norm(hidden)]:

        q_proj = [0 | W_q],  k_proj = [0 | W_k],  v_proj = [0 | W_v],  o_proj = W_o,  hidden_norm = its input_layernorm

    so layer 0's attention output is that layer's on `hidden`, whatever the token (a Qwen2 target's q/k/v biases are
    left out). Where the target has no such layer or its attention's shapes differ: ModelSetupError when `required`
    (the recipe asked for it), else one warning and the attention left random (the kind's default). Returns whether
    it copied."""
    inner = target.get_decoder() if hasattr(target, "get_decoder") else None
    layers = getattr(inner, "layers", None)
    index = len(layers) - head.num_layers if layers is not None else -1
    source = layers[index] if index >= 0 else None
    attn, mine = getattr(source, "self_attn", None), head.midlayer.self_attn
    norm = getattr(source, "input_layernorm", None)
    names = ("q_proj", "k_proj", "v_proj", "o_proj")
    parts = [getattr(attn, name, None) for name in names]
    width = head.config.hidden_size
    if norm is None or any(part is None for part in parts):
        return _not_copied(f"model.head_attn_init: target needs a Llama decoder layer {index} in the target "
                           f"({type(target).__name__} has not); use random", required)
    with gathered([p for m in (norm, *parts) for p in m.parameters()]):  # ZeRO-3: whole while read
        shapes = [getattr(mine, name).weight.shape for name in names]
        wanted = [(shape[0], width) for shape in shapes[:3]] + [shapes[3]]
        if norm.weight.shape != head.midlayer.hidden_norm.weight.shape or any(
                part.weight.shape != shape for part, shape in zip(parts, wanted)):
            return _not_copied(f"model.head_attn_init: target needs the target's layer {index} attention in the "
                               "head's shapes (its heads, head size and width); use random", required)
        for part, name in zip(parts[:3], names):
            weight = getattr(mine, name).weight  # [out, 2H]: [embedding half | hidden half]
            weight.zero_()
            weight[:, width:].copy_(part.weight.to(weight))
        mine.o_proj.weight.copy_(parts[3].weight.to(mine.o_proj.weight))
        head.midlayer.hidden_norm.weight.copy_(norm.weight.to(head.midlayer.hidden_norm.weight))
    return True


def _not_copied(problem: str, required: bool) -> bool:
    """attention_from_target's answer where the target's layer does not fit: the error, or one warning."""
    if required:
        raise ModelSetupError(problem)
    logger.warning("%s (the kind's default: the attention starts random)", problem.removesuffix("; use random"))
    return False


def copy_layer(layer: nn.Module, source: nn.Module | None, name: str) -> list[str]:
    """A later head layer (kinds.eagle3.layers.DecoderLayer) copied from a target decoder layer: its attention
    projections, MLP and both norms (a Qwen2 target's q/k/v biases, which the head has not, are left out); [name]
    when every weight the head layer has is there in the same shape (nothing copied otherwise)."""
    wanted = layer.state_dict()
    have = source.state_dict() if source is not None else {}
    if any(key not in have or have[key].shape != value.shape for key, value in wanted.items()):
        return []
    layer.load_state_dict({key: have[key].to(value) for key, value in wanted.items()})
    return [name]


# model.head_frozen's parts -> the head's modules they name (the first: init_from_target's name for the part)
FROZEN_PARTS = {"lm_head": ("lm_head",), "norm": ("norm",),
                "mlp": ("midlayer.mlp", "midlayer.post_attention_layernorm")}


def freeze_parts(head: Eagle3Head, parts: list[str], copied: list[str]) -> None:
    """model.head_frozen: the named parts (FROZEN_PARTS) of a head started from the target train no further. Raises
    ModelSetupError for a part init_from_target could not copy (`copied`: its answer), which would stay random."""
    for part in parts:
        if FROZEN_PARTS[part][0] not in copied:
            raise ModelSetupError(f"model.head_frozen: {part} was not copied from the target (its shape differs: "
                                  f"copied {', '.join(copied) or 'nothing'}), so it would stay at random weights; "
                                  f"leave it out of model.head_frozen")
        for name in FROZEN_PARTS[part]:
            head.get_submodule(name).requires_grad_(False)


def served_head(model: nn.Module) -> Eagle3Head | None:
    """The Eagle3Head of a trained head (UnrolledHead or Eagle3Head); None for a standalone draft."""
    if isinstance(model, UnrolledHead):
        return model.head
    return model if isinstance(model, Eagle3Head) else None


# ---------------------------------------------------------------------------------------------------------------
# The draft vocabulary
# ---------------------------------------------------------------------------------------------------------------

def set_draft_vocabulary(model: nn.Module, rows: datasets.Dataset) -> torch.Tensor:
    """Set the head's vocabulary to the most frequent label tokens of `rows` (counted on the main process and
    broadcast, so every process holds the same). Returns the draft ids' target ids [V_draft]."""
    head = served_head(model)
    ids = frequent_label_tokens(rows, head.config.vocab_size, head.d2t.numel())
    head.set_vocab(ids)
    return ids


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------------------

CHECKPOINT_PREFIX = "head."  # UnrolledHead's name for the head in a Trainer checkpoint's model.safetensors


def head_at_checkpoint(folder: Path, final: nn.Module) -> Eagle3Head:
    """The head saved in a Trainer checkpoint folder (model.safetensors of UnrolledHead), on `final`'s embedding
    and device, in eval mode."""
    trained = served_head(final)
    head = Eagle3Head(trained.config).to(trained.fc.weight.dtype)
    state = load_file(str(Path(folder) / "model.safetensors"), device=str(trained.fc.weight.device))
    head.load_state_dict({k.removeprefix(CHECKPOINT_PREFIX): v for k, v in state.items()}, strict=True)
    head.to(trained.fc.weight.device)
    return head.bind_embeddings(trained.bound_embeddings).eval()


def check_resume_head_shape(recipe, resume: str) -> None:
    """An EAGLE-3 head's checkpoint (weights only, `head.*`) has the shapes of the recipe's head (read from the
    safetensors header: no weights load)."""
    weights = Path(resume) / "model.safetensors"
    if not weights.is_file():
        return
    trust = recipe.model.trust_remote_code
    planned = plan_head(recipe.model, AutoConfig.from_pretrained(recipe.model.target, trust_remote_code=trust))
    up, n = [planned.intermediate_size, planned.hidden_size], planned.num_hidden_layers
    want = {"fc.weight": [planned.hidden_size, 3 * planned.target_hidden_size],
            "lm_head.weight": [planned.draft_vocab_size, planned.hidden_size],
            "midlayer.mlp.up_proj.weight": up,
            **({f"layers.{n - 1}.mlp.up_proj.weight": up} if n > 1 else {}),
            f"layers.{n}.mlp.up_proj.weight": None}  # model.head_layers: its deepest layer there, none past it
    saved = safetensors_header(weights, "train.resume_from_checkpoint").tensors
    for name, shape in want.items():
        got = saved.get(CHECKPOINT_PREFIX + name, {}).get("shape")
        if got != shape:
            raise ModelSetupError(f"train.resume_from_checkpoint: {resume} holds no EAGLE-3 head of the "
                                  f"recipe's shape ({name}: {got}, the recipe's head has {shape or 'none'}); resume "
                                  "with the recipe that made it, or start a new run (train.overwrite_output_dir=true)")
