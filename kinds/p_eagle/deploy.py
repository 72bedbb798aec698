"""The deployment checks of a P-EAGLE head folder next to its target, and the commands that serve it.

Checks: an EAGLE-3 head's (kinds/eagle3/deploy.py), and
- ptd_token: config.json names the mask token as vLLM reads it (`ptd_token_id`, an id of the target's embedding);
- mask_hidden: the weights hold `mask_hidden` of k * target_hidden_size values (vLLM refuses a parallel-drafting
  eagle3 head without it);
- gamma: the served gamma (generation_config.num_assistant_tokens) is at most the gamma it was trained for
  (`ptd_gamma`): slots past it were never trained.
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from decode.deploy.deploy_check import DEFAULT_GAMMA, DeployReport, draft_tensors
from decode.deploy.serving_commands import vllm_serve, vllm_speculative_config
from kinds.eagle3.deploy import HEAD_CHECKS, check_head_deploy
from kinds.eagle3.model import aux_layer_ids, read_config

P_EAGLE_CHECKS = (*HEAD_CHECKS, "ptd_token", "mask_hidden", "gamma")
VLLM_OPTIONS = {"parallel_drafting": True}  # vLLM's eagle3 proposer drafting all gamma tokens in one pass


def p_eagle_problems(config: dict, tensors: dict, gamma: int | None) -> dict[str, str]:
    """The ptd_token, mask_hidden and gamma checks on the head's config.json (a dict), its tensors' header and its
    served gamma."""
    problems = {}
    token, vocab = config.get("ptd_token_id"), config.get("vocab_size")
    if not isinstance(token, int) or (isinstance(vocab, int) and not 0 <= token < vocab):
        problems["ptd_token"] = (f"config.json has ptd_token_id={token!r}; vLLM's parallel drafting needs the mask "
                                 f"token's id there (0..{vocab - 1 if isinstance(vocab, int) else 'vocab_size - 1'})"
                                 ": re-export with specdistill-train or add it")
    want = len(aux_layer_ids(config)) * (config.get("target_hidden_size") or config.get("hidden_size") or 0)
    shape = tensors.get("mask_hidden", {}).get("shape")
    if shape is None:
        problems["mask_hidden"] = ("the weights have no mask_hidden (the hidden state of the mask slots): vLLM "
                                   "refuses a parallel-drafting eagle3 head without it; train with model.draft_kind "
                                   "p_eagle")
    elif math.prod(shape) != want:
        problems["mask_hidden"] = (f"mask_hidden has shape {list(shape)}, {math.prod(shape)} values; the head reads "
                                   f"{want} (3 aux hidden states of target_hidden_size)")
    trained = config.get("ptd_gamma")
    if isinstance(trained, int) and gamma is not None and gamma > trained:
        problems["gamma"] = (f"generation_config.json drafts gamma={gamma}, but the head was trained for at most "
                             f"{trained} tokens per pass: set num_assistant_tokens <= {trained}")
    return problems


def check_p_eagle_deploy(target: str, draft: str | Path, trust_remote_code: bool = False) -> DeployReport:
    """P_EAGLE_CHECKS of a P-EAGLE folder next to ``target``. Raises LoadError as check_head_deploy does."""
    report = check_head_deploy(target, draft, trust_remote_code)
    found = p_eagle_problems(read_config(draft), draft_tensors(Path(draft)), report.gamma)
    return replace(report, kind="p_eagle", checks=P_EAGLE_CHECKS, problems={**report.problems, **found})


def p_eagle_commands(report: DeployReport) -> str:
    """specdistill-eval and vLLM (eagle3 with parallel_drafting) at the folder's gamma."""
    gamma = report.gamma or DEFAULT_GAMMA
    spec = vllm_speculative_config("eagle3", report.draft, gamma, VLLM_OPTIONS)
    return f"""# specdistill's own decoder (the same measurement as the trainer's)
specdistill-eval --target {report.target} --draft {report.draft} --prompts PROMPTS --gamma {gamma}

# vLLM (one head pass per step)
{vllm_serve(report.target, spec)}"""
