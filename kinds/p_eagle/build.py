"""A P-EAGLE head in a run (model.draft_kind p_eagle): an EAGLE-3 head's plan and build (kinds/eagle3/build.py) plus
its mask token, chosen and checked before any weight loads (kinds.parallel_drafting.mask_token_for) and written into
the head's config as vLLM reads it (`ptd_token_id`) with the gamma it is trained for (`ptd_gamma`), and its learned
mask hidden state."""
from __future__ import annotations

import torch
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from kinds.eagle3.build import build_head, plan_head
from kinds.eagle3.model import Eagle3Head
from kinds.p_eagle.options import KEYS
from kinds.parallel_drafting import check_mask_row, mask_token_for

MASK_HIDDEN_STD = 0.02  # the start of mask_hidden: small random aux hidden states (fc and the norms rescale them)


def plan_p_eagle(cfg, target_config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    """The EAGLE-3 head's plan with ptd_token_id and ptd_gamma (configs only, no weights)."""
    config = plan_head(cfg, target_config)
    config.ptd_token_id = mask_token_for(cfg, KEYS, target_config.get_text_config().vocab_size, tokenizer)
    config.ptd_gamma = cfg.ptd_gamma
    return config


def build_p_eagle(cfg, target: PreTrainedModel, dtype: torch.dtype) -> Eagle3Head:
    """A fresh, trainable P-EAGLE head on `target`: mask_hidden drawn from N(0, MASK_HIDDEN_STD^2) with the torch
    seed the run has set."""
    from distill.models.load import load_tokenizer

    config = plan_p_eagle(cfg, target.config, load_tokenizer(cfg))
    check_mask_row(target.get_input_embeddings().weight, config.ptd_token_id, KEYS)
    head = build_head(cfg, target, dtype, config)
    with torch.no_grad():
        head.mask_hidden.normal_(0.0, MASK_HIDDEN_STD)
    return head
