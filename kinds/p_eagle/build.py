"""A P-EAGLE head in a run (model.draft_kind p_eagle): an EAGLE-3 head's plan and build (kinds/eagle3/build.py) plus
its mask token, chosen and checked before any weight loads and written into the head's config as vLLM reads it
(`ptd_token_id`) with the gamma it is trained for (`ptd_gamma`), and its learned mask hidden state."""
from __future__ import annotations

import torch
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from distill.utils import ModelSetupError
from kinds.dflash.model import mask_token_id_for, zero_mask_row
from kinds.eagle3.build import build_head, plan_head
from kinds.eagle3.model import Eagle3Head

MASK_HIDDEN_STD = 0.02  # the start of mask_hidden: small random aux hidden states (fc and the norms rescale them)


def ptd_token_for(cfg, vocab_size: int, tokenizer: PreTrainedTokenizerBase) -> int:
    """model.ptd_token_id, or the tokenizer's mask token, or the first embedding row past the tokenizer. Raises
    ModelSetupError naming model.ptd_token_id when there is none or it is outside the target's embedding (the head
    embeds it with the target's)."""
    token = cfg.ptd_token_id
    if token is None:
        try:
            token = mask_token_id_for(tokenizer, vocab_size)
        except ValueError as err:
            raise ModelSetupError(f"model.ptd_token_id: {str(err).replace('pass mask_token_id', 'name one')}") \
                from None
    if token >= vocab_size:
        raise ModelSetupError(f"model.ptd_token_id: got {token}; allowed: an id of the target's embedding, 0.."
                              f"{vocab_size - 1}")
    return int(token)


def plan_p_eagle(cfg, target_config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    """The EAGLE-3 head's plan with ptd_token_id and ptd_gamma (configs only, no weights)."""
    config = plan_head(cfg, target_config)
    config.ptd_token_id = ptd_token_for(cfg, target_config.get_text_config().vocab_size, tokenizer)
    config.ptd_gamma = cfg.ptd_gamma
    return config


def build_p_eagle(cfg, target: PreTrainedModel, dtype: torch.dtype) -> Eagle3Head:
    """A fresh, trainable P-EAGLE head on `target`: mask_hidden drawn from N(0, MASK_HIDDEN_STD^2) with the torch
    seed the run has set."""
    from distill.models.load import load_tokenizer

    config = plan_p_eagle(cfg, target.config, load_tokenizer(cfg))
    if problem := zero_mask_row(target.get_input_embeddings().weight, config.ptd_token_id):
        raise ModelSetupError(f"model.ptd_token_id: {problem}")
    head = build_head(cfg, target, dtype, config)
    with torch.no_grad():
        head.mask_hidden.normal_(0.0, MASK_HIDDEN_STD)
    return head
