"""The deployment checks of a DFlash draft folder next to its target (decode/deploy/deploy_check.py runs them when the
folder's config names DFlashDraftModel), and the commands that serve it.

Checks (each failure is one line naming what was found and what to do):
- safetensors: the folder holds *.safetensors weights;
- hidden_size, vocab, target_layers, mask_token, block_size, attention: the config fits the target
  (kinds.dflash.model.fit_problems: the draft shares the target's embedding and lm_head and reads its hidden states
  at dflash_config.target_layer_ids, layer outputs, 0-based; vLLM adds 1 when it reads them);
- weights: exactly the tensors DFlashDraft names (no embedding or lm_head: vLLM shares the target's), with the
  config's shapes;
- dtype: the stored weights have the target's dtype;
- generation_config: num_assistant_tokens (the served gamma) set, at most block_size - 1.
"""
from __future__ import annotations

from pathlib import Path

from decode.deploy.deploy_check import (
    DEFAULT_GAMMA,
    DeployReport,
    check_dtype,
    check_generation_config,
    check_safetensors,
    draft_tensors,
    load_target_config,
)
from decode.deploy.serving_commands import eval_line, serve_alone_line, vllm_serve, vllm_speculative_config
from kinds.dflash.model import DEFAULT_BLOCK_SIZE, DFlashDraft, fit_problems, read_config

FIT_CHECKS = ("hidden_size", "vocab", "target_layers", "mask_token", "block_size", "attention")
DFLASH_CHECKS = ("safetensors", *FIT_CHECKS, "weights", "dtype", "generation_config")


def check_weights(config: dict, tensors: dict) -> str | None:
    """The stored tensors are those of a DFlashDraft with this config, with its shapes (built on the meta device)."""
    import torch
    from transformers import Qwen3Config

    if not tensors:
        return None  # the safetensors check's finding
    with torch.device("meta"):
        expected = {name: list(t.shape) for name, t in DFlashDraft(Qwen3Config.from_dict(config)).state_for_export()
                    .items()}
    missing = sorted(set(expected) - set(tensors))
    other = sorted(set(tensors) - set(expected))
    wrong = sorted(name for name in set(expected) & set(tensors) if list(tensors[name]["shape"]) != expected[name])
    if missing or other or wrong:
        parts = [f"lack {', '.join(missing[:3])}" if missing else "",
                 f"hold {', '.join(other[:3])} (the embedding and lm_head are the target's, not stored)" if other
                 else "", f"have other shapes for {', '.join(wrong[:3])}" if wrong else ""]
        return "the weights " + "; ".join(p for p in parts if p) + ": re-export with DFlashDraft.save_pretrained"
    return None


def check_dflash_deploy(target: str, draft: str | Path, trust_remote_code: bool = False) -> DeployReport:
    """DFLASH_CHECKS of a DFlash folder next to ``target``. Raises LoadError when the target's config cannot be
    read."""
    folder = Path(draft)
    target_config = load_target_config(target, trust_remote_code)
    config = read_config(folder)
    fit = fit_problems(config, target_config)
    tensors = draft_tensors(folder)
    generation_problem, generation_warning, gamma = check_generation_config(folder)
    block = config.get("block_size")
    if generation_problem is None and gamma is not None and isinstance(block, int) and gamma > block - 1:
        generation_problem = (f"generation_config.json drafts gamma={gamma}, but a block of {block} drafts at most "
                              f"{block - 1}: set num_assistant_tokens <= {block - 1}")
    found = {"safetensors": check_safetensors(folder, tensors), **{name: fit.get(name) for name in FIT_CHECKS},
             "weights": None if fit else check_weights(config, tensors), "dtype": check_dtype(target_config, tensors),
             "generation_config": generation_problem}
    return DeployReport(target=str(target), draft=str(folder), gamma=gamma, kind="dflash", checks=DFLASH_CHECKS,
                        problems={name: line for name, line in found.items() if line},
                        warnings={"generation_config": generation_warning} if generation_warning else {})


def dflash_commands(report: DeployReport) -> str:
    """specdistill-eval and vLLM (method dflash) at the folder's gamma."""
    gamma = report.gamma or DEFAULT_GAMMA
    spec = vllm_speculative_config("dflash", report.draft, gamma)
    return f"""# specdistill's own decoder (the same measurement as the trainer's)
{eval_line(report.target, report.draft, gamma)}

# vLLM
{serve_alone_line(report.draft)}{vllm_serve(report.target, spec)}"""


DFLASH_LAYER_KEYS = ("attention_bias", "attention_dropout", "head_dim", "hidden_act", "hidden_size",
                     "intermediate_size", "max_position_embeddings", "num_attention_heads", "num_key_value_heads",
                     "num_hidden_layers", "rms_norm_eps", "rope_parameters", "vocab_size", "bos_token_id",
                     "eos_token_id", "pad_token_id")


def speculators_fields(config: dict) -> dict:
    """The speculators keys of a DFlash draft (its config.json): dflash, the draft layers as a qwen3
    transformer_layer_config, and the target layers as speculators counts them, one more than dflash_config's
    target_layer_ids (vLLM reads aux_hidden_state_layer_ids - 1 back: vllm.transformers_utils.configs.speculators)."""
    options = config.get("dflash_config") or {}
    layer = {key: config[key] for key in DFLASH_LAYER_KEYS if key in config}
    layer.update(model_type="qwen3", tie_word_embeddings=False)
    return {"speculators_model_type": "dflash", "transformer_layer_config": layer,
            "draft_vocab_size": config["vocab_size"], "block_size": config.get("block_size", DEFAULT_BLOCK_SIZE),
            "target_hidden_size": config.get("target_hidden_size") or config["hidden_size"],
            "aux_hidden_state_layer_ids": [int(i) + 1 for i in options.get("target_layer_ids") or []],
            "mask_token_id": options.get("mask_token_id"), "sample_from_anchor": False}
