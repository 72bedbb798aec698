"""A DFlash draft in a run (model.draft_kind dflash): its config planned from the target's (and checked before any
weight loads), the draft built on the target's embedding and lm_head (its layers fresh, or copied from target
layers), and the draft read back from a Trainer checkpoint."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from distill.utils import ModelSetupError
from kinds.dflash.loss import BlockTraining
from kinds.dflash.model import DFlashDraft, dflash_config_for, mask_token_id_for, zero_mask_row

CHECKPOINT_PREFIX = "draft."  # BlockTraining's name for the draft in a Trainer checkpoint's model.safetensors
COPIED = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
          "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm")


def plan_dflash(cfg, target_config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase):
    """The draft's config from the target's and the recipe's dflash_* keys (configs only, no weights). Raises
    ModelSetupError naming the key: layer ids the target lacks, no mask token, init layers of another count."""
    from distill.models.distributed import zero3_enabled
    from distill.models.fsdp import fsdp_enabled

    if zero3_enabled() or fsdp_enabled():
        raise ModelSetupError("model.draft_kind: DFlash drafts share the target's embedding and lm_head, which ZeRO-3 "
                              "and FSDP2 shard; train them under DDP or ZeRO-1/2 (a few layers: they fit)")
    text = target_config.get_text_config()
    mask = cfg.dflash_mask_token_id
    if mask is None:
        try:
            mask = mask_token_id_for(tokenizer, text.vocab_size)
        except ValueError as err:
            raise ModelSetupError(f"model.dflash_mask_token_id: {err}") from None
    init = cfg.dflash_init_layers
    if init is not None and (len(init) != cfg.dflash_layers or max(init) >= text.num_hidden_layers):
        raise ModelSetupError(f"model.dflash_init_layers: got {init}; allowed: {cfg.dflash_layers} target layer ids "
                              f"(one per draft layer, model.dflash_layers) in 0..{text.num_hidden_layers - 1}")
    try:
        return dflash_config_for(target_config, mask_token_id=mask, num_layers=cfg.dflash_layers,
                                 block_size=cfg.dflash_block_size, target_layer_ids=cfg.dflash_target_layers)
    except ValueError as err:
        key = "model.dflash_target_layers" if "target_layer_ids" in str(err) else "model.dflash_mask_token_id"
        raise ModelSetupError(f"{key}: {err}") from None


def build_dflash(cfg, target: PreTrainedModel, dtype: torch.dtype) -> DFlashDraft:
    """The trainable draft on the target's embedding and lm_head (frozen, shared, never saved): fresh layers, or
    model.dflash_init_layers copied from the target (attention, MLP, norms; q_norm and k_norm at 1)."""
    from distill.models.load import load_tokenizer

    config = plan_dflash(cfg, target.config, load_tokenizer(cfg))
    if problem := zero_mask_row(target.get_input_embeddings().weight, config.dflash_config["mask_token_id"]):
        raise ModelSetupError(f"model.dflash_mask_token_id: {problem}")
    draft = DFlashDraft(config).to(dtype)
    if cfg.dflash_init_layers is not None:
        copy_target_layers(draft, target, cfg.dflash_init_layers)
    return draft.bind_target(target).requires_grad_(True).train()


def copy_target_layers(draft: DFlashDraft, target: PreTrainedModel, layers: list[int]) -> None:
    """Draft layer i starts as target layer layers[i] (the COPIED weights; the shapes are the target's)."""
    from distill.models.load import decoder_layers_name

    source = dict(target.named_parameters())
    prefix = decoder_layers_name(target)
    with torch.no_grad():
        for i, layer in enumerate(layers):
            for name, param in draft.layers[i].named_parameters():
                module = name.rsplit(".", 1)[0]
                if module in COPIED:
                    param.copy_(source[f"{prefix}.{layer}.{name}"].to(param.dtype))


def dflash_at_checkpoint(folder: Path, final) -> DFlashDraft | None:
    """The draft saved in a Trainer checkpoint folder (model.safetensors of BlockTraining), on `final`'s target
    embedding and lm_head and device, in eval mode; None when `final` is not a DFlash draft in training."""
    trained = final.draft if isinstance(final, BlockTraining) else final
    if not isinstance(trained, DFlashDraft):
        return None
    device = trained.fc.weight.device
    draft = DFlashDraft(trained.config).to(trained.fc.weight.dtype)
    state = load_file(str(Path(folder) / "model.safetensors"), device=str(device))
    draft.load_state_dict({k.removeprefix(CHECKPOINT_PREFIX): v for k, v in state.items()}, strict=True)
    draft._target = trained._target
    return draft.to(device).eval()
