"""The frozen target, the trainable draft, and the checks that they can work together.

The draft comes from exactly one of (see ModelKeys):
- `model.draft`: an existing model (local folder or hub id), fine-tuned as it is;
- `model.draft_layers`: the target with only these decoder layers kept (embeddings, final norm, lm_head copied);
- `model.draft_config`: a fresh model with the target's config and these keys overridden (trained from scratch).

With `lora.enabled` the draft is wrapped by peft (distill/models/lora.py). Under DeepSpeed ZeRO-3 both models are
partitioned as they load and the target is hooked for inference (distill/models/distributed.py); under FSDP2 both load
whole on the CPU and are sharded later (distill/models/fsdp.py: the target after the tokenise step, the draft by the
Trainer).

`check_model_plan` reads only configs and tokenizers, so its errors come before any weights are loaded. A `.gguf`
target, draft or tokenizer is converted once into a plain folder (decode.inputs.gguf) by `with_model_folders`, which the
check step runs first: everything after it sees folders only.
"""
from __future__ import annotations

import copy
import difflib
import logging
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from huggingface_hub.errors import StrictDataclassError
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.initialization import no_init_weights

from decode.inputs.loading import DTYPES, LoadError, load_failure, resolve_model_path
from distill.models.distributed import is_partitioned, outside_zero3_init, shard_for_inference, zero3_enabled
from distill.models.fsdp import fsdp_enabled, remember_layout
from distill.models.lora import is_lora
from distill.recipe.sections import LoraConfig, ModelKeys
from distill.utils import ModelSetupError, parameter_count

logger = logging.getLogger(__name__)

# Config entries with one value per decoder layer; kept in step with num_hidden_layers when layers are dropped.
PER_LAYER_CONFIG_KEYS = ("layer_types",)


# ---------------------------------------------------------------------------------------------------------------
# Model paths
# ---------------------------------------------------------------------------------------------------------------

MODEL_PATH_KEYS = ("target", "draft", "tokenizer")


def with_model_folders(cfg: ModelKeys) -> ModelKeys:
    """A copy of ``cfg`` whose .gguf target / draft / tokenizer name their converted folders (decode.inputs.gguf:
    converted on first use, by the main process while the others wait, then found in the cache by them). Raises
    ModelSetupError naming the key for a file that is not a loadable GGUF."""
    folders: dict[str, str] = {}
    problem: LoadError | None = None
    with PartialState().main_process_first():
        try:
            for key in MODEL_PATH_KEYS:
                path = getattr(cfg, key)
                if path is not None:  # any other path or hub id comes back unchanged
                    folders[key] = resolve_model_path(path, f"model.{key}")
        except LoadError as err:  # raised after the block, so the processes waiting on the main one are released
            problem = err
    if problem is not None:
        raise ModelSetupError(str(problem))
    return cfg.model_copy(update=folders)


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------------------

def _load(key: str, name: str, loader: Any, **kwargs: Any) -> Any:
    """loader.from_pretrained(name), turning "not found / no network" into a ModelSetupError naming the recipe key."""
    if name.startswith(("/", ".", "~")) and not Path(name).expanduser().exists():
        raise ModelSetupError(f"{key}: no such folder: {name}")
    try:
        return loader.from_pretrained(name, **kwargs)
    except (OSError, ValueError) as err:  # ValueError: a folder without a config.json (a training checkpoint)
        raise ModelSetupError(f"{key}: cannot load {name!r}: {load_failure(name, err)}") from None


def load_tokenizer(cfg: ModelKeys) -> PreTrainedTokenizerBase:
    """The tokenizer for training data and prompts: `model.tokenizer`, else the target's (exported unchanged)."""
    key = "model.tokenizer" if cfg.tokenizer else "model.target"
    return _load(key, cfg.tokenizer or cfg.target, AutoTokenizer, trust_remote_code=cfg.trust_remote_code)


def load_draft_tokenizer(cfg: ModelKeys) -> PreTrainedTokenizerBase | None:
    """The tokenizer saved with `model.draft`, or None (drafts built from the target share its tokenizer)."""
    if cfg.draft is None:
        return None
    try:
        return AutoTokenizer.from_pretrained(cfg.draft, trust_remote_code=cfg.trust_remote_code)
    except (OSError, ValueError) as err:
        logger.warning("draft %s has no loadable tokenizer (%s); assuming it uses the target's", cfg.draft, err)
        return None


# ---------------------------------------------------------------------------------------------------------------
# Pre-flight: configs and tokenizers only
# ---------------------------------------------------------------------------------------------------------------

def config_overrides(target_config: PretrainedConfig, overrides: dict[str, Any]) -> PretrainedConfig:
    """The target's config with `overrides` applied; head_dim and per-layer lists follow the new shape."""
    base = target_config.to_dict()
    unknown = [k for k in overrides if k not in base]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(base), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ModelSetupError(f"model.draft_config: {unknown[0]!r} is not a key of the target's "
                              f"{type(target_config).__name__}{hint}")
    values = {**base, **overrides}
    if "head_dim" in base and "head_dim" not in overrides and (
            {"hidden_size", "num_attention_heads"} & set(overrides)):
        # head_dim = hidden_size / num_attention_heads unless set explicitly
        values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
    if "num_hidden_layers" in overrides:
        for key in PER_LAYER_CONFIG_KEYS:
            if key in values and key not in overrides:
                values[key] = None  # the config class recomputes its default for the new depth
    try:
        return type(target_config).from_dict(values)
    except (ValueError, TypeError, StrictDataclassError) as err:  # transformers' config validation: shapes, types
        reason = [line.strip() for line in str(err).splitlines() if line.strip()][-1]
        raise ModelSetupError(f"model.draft_config: {reason}") from None


def _layer_config(target_config: PretrainedConfig, layers: list[int]) -> PretrainedConfig:
    """The target's config for a model made of `layers` of its decoder layers."""
    num_layers = target_config.num_hidden_layers
    if layers[-1] >= num_layers:
        raise ModelSetupError(f"model.draft_layers: layer {layers[-1]} does not exist; the target has "
                              f"{num_layers} layers (0..{num_layers - 1})")
    config = copy.deepcopy(target_config)
    config.num_hidden_layers = len(layers)
    for key in PER_LAYER_CONFIG_KEYS:
        per_layer = getattr(config, key, None)
        if isinstance(per_layer, list) and len(per_layer) == num_layers:
            setattr(config, key, [per_layer[i] for i in layers])
    return config


def draft_config(cfg: ModelKeys, target_config: PretrainedConfig) -> PretrainedConfig:
    """The config the draft will have (raises ModelSetupError for a bad layer list or config key)."""
    if cfg.draft is not None:
        return _load("model.draft", cfg.draft, AutoConfig, trust_remote_code=cfg.trust_remote_code)
    if cfg.draft_layers is not None:
        return _layer_config(target_config, cfg.draft_layers)
    return config_overrides(target_config, cfg.draft_config or {})


def planned_parameter_count(config: PretrainedConfig, trust_remote_code: bool = False) -> int:
    """Parameters of a model with this config, counted on the meta device (no memory, no weights)."""
    with torch.device("meta"), no_init_weights(), outside_zero3_init():
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return parameter_count(model)


def check_model_plan(cfg: ModelKeys, tokenizer: PreTrainedTokenizerBase, *,
                     hidden_state_cache: bool = False) -> None:
    """Everything that can be checked before loading weights (`hidden_state_cache`: the recipe sets
    distill.hidden_state_cache).

    The checks are the draft kind's (kinds/<kind>/__init__.py, check_plan): for a standalone draft its tokenizer and
    vocabulary, for a head its layer ids and draft vocabulary, ... Raises ModelSetupError and
    decode.inputs.vocab.TokenizerMismatchError (the draft's tokenizer differs from the target's).
    """
    target_config = _load("model.target", cfg.target, AutoConfig, trust_remote_code=cfg.trust_remote_code)
    cfg.kind.check_plan(cfg, target_config, tokenizer, hidden_state_cache)


# ---------------------------------------------------------------------------------------------------------------
# Loading weights
# ---------------------------------------------------------------------------------------------------------------

def load_kwargs(cfg: ModelKeys) -> dict[str, Any]:
    """from_pretrained / from_config keyword arguments of the recipe's model section (remote code, attention)."""
    kwargs: dict[str, Any] = {"trust_remote_code": cfg.trust_remote_code}
    if cfg.attn_implementation is not None:
        kwargs["attn_implementation"] = cfg.attn_implementation
    return kwargs


def freeze(model: PreTrainedModel) -> PreTrainedModel:
    """Eval mode and no gradients, in place; returns the model."""
    model.requires_grad_(False)
    return model.eval()


def load_target(cfg: ModelKeys) -> PreTrainedModel:
    """The frozen target in `model.target_dtype` ("auto" = the dtype of its checkpoint).

    Under DeepSpeed ZeRO-3 it is loaded partitioned and given inference hooks (`shard_for_inference`): each process
    holds 1/P of it, and every process must run each of its forward passes (they gather weights together).
    """
    dtype = DTYPES[cfg.target_dtype]  # "auto": the checkpoint's own dtype
    target = freeze(AutoModelForCausalLM.from_pretrained(cfg.target, dtype=dtype, **load_kwargs(cfg)))
    if zero3_enabled():
        shard_for_inference(target)
    return target


def decoder_layers_name(model: PreTrainedModel) -> str:
    """Qualified name of the ModuleList holding the decoder layers (e.g. 'model.layers', 'transformer.h')."""
    num_layers = model.config.get_text_config().num_hidden_layers
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == num_layers and name:
            return name
    raise ModelSetupError(f"cannot find the {num_layers} decoder layers of {type(model).__name__}")


def draft_from_layers(target: PreTrainedModel, layers: list[int], dtype: torch.dtype,
                      **load_kwargs: Any) -> PreTrainedModel:
    """A copy of the target keeping only `layers` (renumbered 0..len-1); embeddings, norm and lm_head copied.

    Raises ModelSetupError for a layer index the target does not have.
    """
    config = _layer_config(target.config, layers)
    draft = AutoModelForCausalLM.from_config(config, dtype=dtype, **load_kwargs)
    prefix = decoder_layers_name(target) + "."
    renumber = {old: new for new, old in enumerate(layers)}

    def draft_key(key: str) -> str | None:
        """The draft's name for the target's weight `key`; None for a dropped layer."""
        if not key.startswith(prefix):
            return key
        index, rest = key[len(prefix):].split(".", 1)
        return f"{prefix}{renumber[int(index)]}.{rest}" if int(index) in renumber else None

    if is_partitioned(target):  # ZeRO-3: copy one gathered weight at a time; rank 0's copy is re-partitioned
        import deepspeed
        draft_params = dict(draft.named_parameters())
        for key, source in target.named_parameters():
            name = draft_key(key)
            if name is None or name not in draft_params:
                continue
            with deepspeed.zero.GatheredParameters([source, draft_params[name]], modifier_rank=0):
                if torch.distributed.get_rank() == 0:
                    draft_params[name].data.copy_(source.data)
        return draft
    state = {draft_key(k): v for k, v in target.state_dict().items() if draft_key(k) is not None}
    draft.load_state_dict(state, strict=True)
    return draft


def load_draft(cfg: ModelKeys, target: PreTrainedModel, lora: LoraConfig | None = None) -> nn.Module:
    """The trainable draft in `model.draft_dtype`, in train mode: every weight trains, or with `lora.enabled` only
    the LoRA adapters (a peft PeftModel, see apply_lora); built by the draft's kind (kinds/<kind>/__init__.py,
    build): for model.draft_kind eagle3 an Eagle3Head on the target (kinds.eagle3.build).

    Raises ModelSetupError for LoRA under DeepSpeed ZeRO-3 (not supported: LoRA drafts fit ZeRO-2 or DDP) and for
    lora.target_modules / lora.modules_to_save naming no module of the draft.
    """
    if lora is not None and lora.enabled and zero3_enabled():
        raise ModelSetupError("lora.enabled: LoRA drafts are not supported under DeepSpeed ZeRO-3 (the adapters "
                              "are small: use DDP or ZeRO-2, recipes/accelerate/deepspeed_zero2.yaml)")
    return cfg.kind.build(cfg, target, DTYPES[cfg.draft_dtype], lora)


def load_models(cfg: ModelKeys, lora: LoraConfig, device: torch.device | str) -> tuple[PreTrainedModel, nn.Module]:
    """The load step of a run (specdistill.pipeline): the frozen target, then the trainable draft (built from it when
    `model.draft_layers` says so), then the target moved to `device`. Returns (target, draft).

    Under FSDP2 the target stays whole on the CPU until distill.models.fsdp.shard_for_inference shards it (after the
    tokenise step, which may run it on the main process alone), and the draft's layout is remembered for the
    whole copies made of it once accelerate has sharded it."""
    target = load_target(cfg)
    draft = load_draft(cfg, target, lora)  # lora.enabled: a peft model, only adapters train
    if fsdp_enabled():
        remember_layout(draft, keep_weights=is_lora(draft))  # LoRA: the frozen base, to merge checkpoints on rank 0
        return target, draft
    if zero3_enabled() and not isinstance(draft, PreTrainedModel):  # a head: its gathered copies follow this layout
        remember_layout(draft)
    return target.to(device), draft
