"""LoRA drafts (peft): adapters on the draft's linear layers, checked against the draft's module names.

With `lora.enabled` the draft is wrapped by peft (`apply_lora`): only the adapters train, and
distill.models.distributed.plain_copy merges them into a plain transformers model for measuring and export.
"""
from __future__ import annotations

import difflib
import logging

from torch import nn
from transformers import PreTrainedModel

from distill.recipe.sections import LORA_ALL_LINEAR, LoraConfig
from distill.utils import ModelSetupError, parameter_count

logger = logging.getLogger(__name__)


def _check_module_names(draft: nn.Module, key: str, names: list[str], linear_only: bool) -> None:
    """ModelSetupError naming `key` for an entry of `names` that matches no module (by name or dotted suffix)."""
    from transformers.pytorch_utils import Conv1D  # GPT-2's linear layers

    linear = (nn.Linear, Conv1D)
    modules = [(n, m) for n, m in draft.named_modules() if n and (not linear_only or isinstance(m, linear))]
    for wanted in names:
        if not any(n == wanted or n.endswith("." + wanted) for n, _ in modules):
            choices = sorted({n.rsplit(".", 1)[-1] for n, _ in modules})
            close = difflib.get_close_matches(wanted, choices, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            kind = "linear layer" if linear_only else "module"
            raise ModelSetupError(f"{key}: {wanted!r} names no {kind} of the draft ({type(draft).__name__}); "
                                  f"{hint}its {kind}s are named: {', '.join(choices)}")


def apply_lora(draft: PreTrainedModel, cfg: LoraConfig) -> nn.Module:
    """`draft` wrapped by peft.get_peft_model with LoRA adapters (changed in place): W x + (alpha / r) B A x on each
    target module, B = 0 at the start so the draft's function is unchanged. Only the adapters and
    `cfg.modules_to_save` require gradients. Raises ModelSetupError for a target or saved module the draft lacks.
    """
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    if cfg.target_modules != LORA_ALL_LINEAR:
        _check_module_names(draft, "lora.target_modules", list(cfg.target_modules), linear_only=True)
    if cfg.modules_to_save:
        _check_module_names(draft, "lora.modules_to_save", cfg.modules_to_save, linear_only=False)
    peft_config = PeftLoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, bias="none", task_type="CAUSAL_LM",
        target_modules=cfg.target_modules if isinstance(cfg.target_modules, str) else list(cfg.target_modules),
        modules_to_save=list(cfg.modules_to_save) if cfg.modules_to_save else None)
    model = get_peft_model(draft, peft_config)
    trainable = parameter_count(model, trainable_only=True)
    logger.info("LoRA draft: %s of %s parameters train (r %d, alpha %g)", f"{trainable:,}",
                f"{parameter_count(model):,}", cfg.r, cfg.alpha)
    return model


def is_lora(model: nn.Module) -> bool:
    """True for a peft model (LoRA adapters on a base model)."""
    return hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")
