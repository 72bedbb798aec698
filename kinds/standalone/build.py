"""A standalone draft in a run: checked from configs, built (a folder, target layers or a config; LoRA adapters on
it), and a checkpoint to resume from checked against the recipe's shape."""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from decode.inputs.checks import check_json_files_text
from decode.inputs.vocab import check_tokenizers_compatible, lm_head_rows
from distill.models.load import (
    config_overrides,
    draft_config,
    draft_from_layers,
    load_draft_tokenizer,
    load_kwargs,
    planned_parameter_count,
)
from distill.models.lora import apply_lora
from distill.utils import ModelSetupError

logger = logging.getLogger(__name__)

SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size")


def check_standalone_plan(cfg, target_config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase) -> None:
    """The draft's tokenizer is the target's, its vocabulary covers the tokenizer; a warning when it has more
    parameters than the target. Raises ModelSetupError / decode.inputs.vocab.TokenizerMismatchError."""
    planned = draft_config(cfg, target_config)
    draft_tokenizer = load_draft_tokenizer(cfg)
    if draft_tokenizer is not None:
        check_tokenizers_compatible(tokenizer, draft_tokenizer)
    if planned.get_text_config().vocab_size < len(tokenizer):
        raise ModelSetupError(f"the draft's vocabulary ({planned.get_text_config().vocab_size} rows) is smaller "
                              f"than the tokenizer ({len(tokenizer)} tokens)")
    rows = min(len(tokenizer), target_config.get_text_config().vocab_size)
    if cfg.draft_vocab_size is not None and cfg.draft_vocab_size > rows:
        raise ModelSetupError(f"model.draft_vocab_size: got {cfg.draft_vocab_size}; allowed: at most the vocabulary's "
                              f"{rows} tokens (null = every row)")
    draft_params = planned_parameter_count(planned, cfg.trust_remote_code)
    target_params = planned_parameter_count(target_config, cfg.trust_remote_code)
    if draft_params > target_params:
        logger.warning("the draft has more parameters (%s) than the target (%s): it will not speed decoding up",
                       f"{draft_params:,}", f"{target_params:,}")


def build_standalone(cfg, target: PreTrainedModel, dtype: torch.dtype, lora) -> torch.nn.Module:
    """The trainable draft: model.draft loaded, model.draft_layers copied from the target, or model.draft_config
    built fresh; every weight trains, or with lora.enabled only the adapters (a peft PeftModel)."""
    if cfg.draft is not None:
        draft = AutoModelForCausalLM.from_pretrained(cfg.draft, dtype=dtype, **load_kwargs(cfg))
    elif cfg.draft_layers is not None:
        draft = draft_from_layers(target, cfg.draft_layers, dtype, **load_kwargs(cfg))
    else:
        config = config_overrides(target.config, cfg.draft_config or {})
        draft = AutoModelForCausalLM.from_config(config, dtype=dtype, **load_kwargs(cfg))
    draft.requires_grad_(True)
    if lora is not None and lora.enabled:
        draft = apply_lora(draft, lora)
    return draft.train()


def check_resume_shape(recipe, resume: str) -> None:
    """The checkpoint's config.json describes a draft of the recipe's shape (else loading it fails with a trace)."""
    if not (Path(resume) / "config.json").is_file():
        return
    check_json_files_text(resume, "train.resume_from_checkpoint")
    trust = recipe.model.trust_remote_code
    planned = draft_config(recipe.model, AutoConfig.from_pretrained(recipe.model.target, trust_remote_code=trust))
    saved = AutoConfig.from_pretrained(resume, trust_remote_code=trust)
    for key in SHAPE_KEYS:
        want, got = getattr(planned.get_text_config(), key, None), getattr(saved.get_text_config(), key, None)
        if want != got:
            raise ModelSetupError(f"train.resume_from_checkpoint: {resume} holds a draft with {key} {got!r}, the "
                                  f"recipe's draft has {want!r}; resume with the recipe that made it, or start a "
                                  "new run (train.overwrite_output_dir=true)")


def set_draft_vocabulary(draft: torch.nn.Module, rows, size: int) -> torch.Tensor:
    """The draft's vocabulary (kinds/draft_vocab.py): the ``size`` most frequent label tokens of ``rows``, kept on the
    model (``draft_vocab_ids``, under a LoRA wrapper on its base model, so a merged export keeps it) for the
    trainer's checks and the export's draft_vocab.json."""
    from kinds.draft_vocab import frequent_label_tokens

    base = draft.get_base_model() if hasattr(draft, "get_base_model") else draft
    ids = frequent_label_tokens(rows, lm_head_rows(base), size)
    base.draft_vocab_ids = ids
    return ids
