"""A PARD draft in a run (model.draft_kind pard): the standalone draft's plan and build (model.draft, draft_layers or
draft_config), plus its mask token, chosen and checked before any weight loads (kinds.parallel_drafting
.mask_token_for) and written into the draft's config as vLLM reads it (`pard_token`) with the gamma it is trained for
(`pard_gamma`)."""
from __future__ import annotations

import torch
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from kinds.parallel_drafting import check_mask_row, mask_token_for
from kinds.pard.options import KEYS
from kinds.standalone.build import build_standalone, check_standalone_plan


def check_pard_plan(cfg, target_config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase) -> int:
    """The standalone draft's plan checks and the mask token (returned)."""
    from distill.models.load import draft_config

    check_standalone_plan(cfg, target_config, tokenizer)
    return mask_token_for(cfg, KEYS, draft_config(cfg, target_config).get_text_config().vocab_size, tokenizer)


def build_pard(cfg, target: PreTrainedModel, dtype: torch.dtype, lora) -> torch.nn.Module:
    """The standalone draft with `pard_token` and `pard_gamma` in its config (and so in every checkpoint and the
    export)."""
    from distill.models.load import load_tokenizer

    draft = build_standalone(cfg, target, dtype, lora)
    config = draft.config
    config.pard_token = mask_token_for(cfg, KEYS, config.get_text_config().vocab_size, load_tokenizer(cfg))
    config.pard_gamma = cfg.pard_gamma
    check_mask_row(draft.get_input_embeddings().weight, config.pard_token, KEYS)
    return draft
