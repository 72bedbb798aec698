"""A PARD draft in a run (model.draft_kind pard): the standalone draft's plan and build (model.draft, draft_layers or
draft_config), plus its mask token, chosen and checked before any weight loads and written into the draft's config
as vLLM reads it (`pard_token`) with the gamma it is trained for (`pard_gamma`)."""
from __future__ import annotations

import torch
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from distill.utils import ModelSetupError
from kinds.dflash.model import mask_token_id_for, zero_mask_row
from kinds.standalone.build import build_standalone, check_standalone_plan


def pard_token_for(cfg, vocab_size: int, tokenizer: PreTrainedTokenizerBase) -> int:
    """model.pard_token, or the tokenizer's mask token, or the first embedding row past the tokenizer. Raises
    ModelSetupError naming model.pard_token when there is none or it is outside the draft's embedding."""
    token = cfg.pard_token
    if token is None:
        try:
            token = mask_token_id_for(tokenizer, vocab_size)
        except ValueError as err:
            raise ModelSetupError(f"model.pard_token: {err}") from None
    if token >= vocab_size:
        raise ModelSetupError(f"model.pard_token: got {token}; allowed: an id of the draft's embedding, 0.."
                              f"{vocab_size - 1}")
    return int(token)


def check_pard_plan(cfg, target_config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase) -> int:
    """The standalone draft's plan checks and the mask token (returned)."""
    from distill.models.load import draft_config

    check_standalone_plan(cfg, target_config, tokenizer)
    return pard_token_for(cfg, draft_config(cfg, target_config).get_text_config().vocab_size, tokenizer)


def build_pard(cfg, target: PreTrainedModel, dtype: torch.dtype, lora) -> torch.nn.Module:
    """The standalone draft with `pard_token` and `pard_gamma` in its config (and so in every checkpoint and the
    export)."""
    from distill.models.load import load_tokenizer

    draft = build_standalone(cfg, target, dtype, lora)
    config = draft.config
    config.pard_token = pard_token_for(cfg, config.get_text_config().vocab_size, load_tokenizer(cfg))
    config.pard_gamma = cfg.pard_gamma
    if problem := zero_mask_row(draft.get_input_embeddings().weight, config.pard_token):
        raise ModelSetupError(f"model.pard_token: {problem}")
    return draft
