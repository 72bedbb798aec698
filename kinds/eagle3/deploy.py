"""The deployment checks of an EAGLE-3 head folder (kinds/eagle3/model.py), next to its target
(decode/deploy/deploy_check.py runs them when the draft folder's config names the head's architecture), and the commands
that serve it.

Checks (each failure is one line naming what was found and what to do):
- safetensors: the folder holds *.safetensors weights;
- aux_layers: exactly 3 distinct ascending target layer ids, all among the target's layers (vLLM's fc reads 3
  hidden states, one per distinct id, in layer order);
- hidden_size: the head's hidden_size and target_hidden_size are the target's (shared embedding, its hidden states);
- vocab: the head's vocab_size is the target's;
- lm_head: lm_head.weight has draft_vocab_size rows of hidden_size;
- d2t: a head over part of the vocabulary stores d2t [draft_vocab_size] mapping every draft id to a distinct target
  id (i + d2t[i]) inside the vocabulary; a whole-vocabulary head stores none (vLLM refuses it there);
- dtype: the stored weights have the target's dtype;
- generation_config: num_assistant_tokens (the served gamma) set, constant schedule, threshold 0.
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from decode.deploy.deploy_check import (
    DEFAULT_GAMMA,
    DeployReport,
    check_dtype,
    check_generation_config,
    check_safetensors,
    draft_tensors,
    load_target_config,
)
from decode.deploy.serving_commands import (
    eval_line,
    serve_alone_line,
    sglang_launch,
    vllm_serve,
    vllm_speculative_config,
)
from kinds.eagle3.model import WEIGHTS_FILE, aux_layer_ids, fit_problems, read_config

HEAD_CHECKS = ("safetensors", "aux_layers", "hidden_size", "vocab", "lm_head", "d2t", "dtype", "generation_config")
VLLM_AUX_LAYERS = 3


def check_aux_layers(config: dict, target_config) -> str | None:
    layers = aux_layer_ids(config)
    if len(layers) != VLLM_AUX_LAYERS or layers != sorted(set(layers)):
        return (f"eagle_config.eagle_aux_hidden_state_layer_ids is {layers}: vLLM and SGLang read exactly "
                f"{VLLM_AUX_LAYERS} distinct target layers, ascending; train the head with 3 model.aux_layers")
    return fit_problems(config, target_config).get("aux_layers")


def check_lm_head(config: dict, tensors: dict) -> str | None:
    rows, hidden = config.get("draft_vocab_size") or config.get("vocab_size"), config.get("hidden_size")
    shape = tensors.get("lm_head.weight", {}).get("shape")
    if shape is None:
        return "the head's weights have no lm_head.weight: export the head with Eagle3Head.save_pretrained"
    if list(shape) != [rows, hidden]:
        return (f"lm_head.weight is {list(shape)} but the config says draft_vocab_size={rows}, hidden_size={hidden}: "
                "the config and the weights come from different heads")
    return None


def check_d2t(config: dict, folder: Path, tensors: dict) -> str | None:
    vocab = config.get("vocab_size")
    draft_vocab = config.get("draft_vocab_size") or vocab
    if draft_vocab >= vocab:  # the whole vocabulary (a larger one is the vocab check's finding)
        if "d2t" in tensors:
            return ("a whole-vocabulary head stores d2t: vLLM has no parameter for it there and refuses the folder; "
                    "re-export it with Eagle3Head.save_pretrained")
        return None
    if "d2t" not in tensors:
        return (f"draft_vocab_size={draft_vocab} < vocab_size={vocab} but the weights have no d2t (draft id -> "
                "target id offsets): vLLM would read draft ids as target ids")
    d2t = load_file(folder / WEIGHTS_FILE)["d2t"].long()  # the head's weights (its header: decode.inputs.checks)
    if d2t.shape != (draft_vocab,):
        return f"d2t has shape {list(d2t.shape)} but draft_vocab_size is {draft_vocab}"
    target_ids = torch.arange(draft_vocab) + d2t  # target id of draft id i = i + d2t[i]
    if target_ids.min() < 0 or target_ids.max() >= vocab or target_ids.unique().numel() != draft_vocab:
        return (f"d2t maps draft ids to target ids {int(target_ids.min())}..{int(target_ids.max())} "
                f"({target_ids.unique().numel()} distinct of {draft_vocab}): they must be distinct ids in "
                f"0..{vocab - 1}")
    return None


def check_head(folder: Path, target_config, tensors: dict) -> dict[str, str | None]:
    """The head-specific checks of the module docstring ({check: problem or None}); deploy_check adds safetensors,
    dtype and generation_config, which drafts of every kind share."""
    config = read_config(folder)
    fit = fit_problems(config, target_config)
    return {
        "aux_layers": check_aux_layers(config, target_config),
        "hidden_size": fit.get("hidden_size"),
        "vocab": fit.get("vocab"),
        "lm_head": check_lm_head(config, tensors),
        "d2t": check_d2t(config, folder, tensors) if tensors else None,
    }


def head_serving_commands(target: str, draft: str, gamma: int, layers: int = 1) -> str:
    """vLLM and SGLang commands serving ``draft`` (an EAGLE-3 head folder of ``layers`` decoder layers) next to
    ``target`` with ``gamma``; a folder in the speculators format (decode.deploy.speculators) is also served by `vllm
    serve DRAFT` alone. SGLang's EAGLE3 serves one-layer heads only (it refuses others): a deeper head gets that line
    in place of its command."""
    spec = vllm_speculative_config("eagle3", draft, gamma)
    alone = serve_alone_line(draft)
    sglang = (sglang_launch(target, draft, "EAGLE3", gamma) if layers == 1 else
              f"# not served: SGLang's EAGLE3 runs one-layer heads only, this head has {layers} (serve it with vLLM)")
    return f"""# specdistill's own decoder (the same measurement as the trainer's)
{eval_line(target, draft, gamma)}

# vLLM
{alone}{vllm_serve(target, spec)}

# SGLang
{sglang}"""


def check_head_deploy(target: str, draft: str | Path, trust_remote_code: bool = False) -> DeployReport:
    """HEAD_CHECKS of an EAGLE-3 head folder (this module) next to ``target``. Raises LoadError
    when the target's config cannot be read."""
    draft_dir = Path(draft)
    target_config = load_target_config(target, trust_remote_code)
    tensors = draft_tensors(draft_dir)
    generation_problem, generation_warning, gamma = check_generation_config(draft_dir)
    found = {"safetensors": check_safetensors(draft_dir, tensors), **check_head(draft_dir, target_config, tensors),
             "dtype": check_dtype(target_config, tensors), "generation_config": generation_problem}
    return DeployReport(target=str(target), draft=str(draft_dir), gamma=gamma, kind="eagle3", checks=HEAD_CHECKS,
                        problems={name: line for name, line in found.items() if line},
                        warnings={"generation_config": generation_warning} if generation_warning else {})


def head_commands(report: DeployReport) -> str:
    """An EAGLE-3 head's commands (head_serving_commands) at the folder's gamma."""
    layers = read_config(report.draft).get("num_hidden_layers") or 1
    return head_serving_commands(report.target, report.draft, report.gamma or DEFAULT_GAMMA, layers)
