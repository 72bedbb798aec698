"""The deployment checks of a P-EAGLE head folder next to its target, and the commands that serve it.

Checks: an EAGLE-3 head's (kinds/eagle3/deploy.py), a parallel draft's (kinds/parallel_drafting.py) and its own:
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
from kinds.eagle3.deploy import HEAD_CHECKS, check_head_deploy
from kinds.eagle3.model import aux_layer_ids, read_config
from kinds.p_eagle.options import KEYS
from kinds.parallel_drafting import gamma_problems, parallel_commands, token_problems

P_EAGLE_CHECKS = (*HEAD_CHECKS, "ptd_token", "mask_hidden", "gamma")


def mask_hidden_problems(config: dict, tensors: dict) -> dict[str, str]:
    """The mask_hidden check on the head's config.json (a dict) and its tensors' header."""
    want = len(aux_layer_ids(config)) * (config.get("target_hidden_size") or config.get("hidden_size") or 0)
    shape = tensors.get("mask_hidden", {}).get("shape")
    if shape is None:
        return {"mask_hidden": ("the weights have no mask_hidden (the hidden state of the mask slots): vLLM refuses a "
                                "parallel-drafting eagle3 head without it; train with model.draft_kind p_eagle")}
    if math.prod(shape) != want:
        return {"mask_hidden": (f"mask_hidden has shape {list(shape)}, {math.prod(shape)} values; the head reads "
                                f"{want} (3 aux hidden states of target_hidden_size)")}
    return {}


def p_eagle_problems(config: dict, tensors: dict, gamma: int | None) -> dict[str, str]:
    """The ptd_token, mask_hidden and gamma checks on the head's config.json (a dict), its tensors' header and its
    served gamma."""
    return {**token_problems(config, KEYS), **mask_hidden_problems(config, tensors),
            **gamma_problems(config, KEYS, gamma)}


def check_p_eagle_deploy(target: str, draft: str | Path, trust_remote_code: bool = False) -> DeployReport:
    """P_EAGLE_CHECKS of a P-EAGLE folder next to ``target``. Raises LoadError as check_head_deploy does."""
    report = check_head_deploy(target, draft, trust_remote_code)
    found = p_eagle_problems(read_config(draft), draft_tensors(Path(draft)), report.gamma)
    return replace(report, kind="p_eagle", checks=P_EAGLE_CHECKS, problems={**report.problems, **found})


def p_eagle_commands(report: DeployReport) -> str:
    """specdistill-eval and vLLM (eagle3 with parallel_drafting) at the folder's gamma."""
    return parallel_commands(report, "eagle3", "one head pass", DEFAULT_GAMMA)
