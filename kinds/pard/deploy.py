"""The deployment checks of a PARD draft folder next to its target, and the commands that serve it.

Checks: a standalone draft's (kinds/standalone/deploy.py: safetensors, tokenizer, vocab, context, rope, dtype,
generation config), and a parallel draft's (kinds/parallel_drafting.py):
- pard_token: config.json names the mask token as vLLM reads it (`pard_token`, an id of the draft's embedding);
- gamma: the served gamma (generation_config.num_assistant_tokens) is at most the gamma it was trained for
  (`pard_gamma`): slots past it were never trained.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from decode.deploy.deploy_check import DEFAULT_GAMMA, DeployReport
from decode.inputs.checks import read_text
from kinds.parallel_drafting import gamma_problems, parallel_commands, token_problems
from kinds.pard.options import KEYS
from kinds.standalone.deploy import CHECKS, check_model_deploy

PARD_CHECKS = (*CHECKS, "pard_token", "gamma")


def pard_problems(config: dict, gamma: int | None) -> dict[str, str]:
    """The pard_token and gamma checks on the draft's config.json (a dict) and served gamma."""
    return {**token_problems(config, KEYS), **gamma_problems(config, KEYS, gamma)}


def check_pard_deploy(target: str, draft: str | Path, trust_remote_code: bool = False) -> DeployReport:
    """PARD_CHECKS of a PARD folder next to ``target``. Raises LoadError as check_model_deploy does."""
    report = check_model_deploy(target, draft, trust_remote_code)
    config = json.loads(read_text(Path(draft) / "config.json"))
    return replace(report, kind="pard", checks=PARD_CHECKS,
                   problems={**report.problems, **pard_problems(config, report.gamma)})


def pard_commands(report: DeployReport) -> str:
    """specdistill-eval and vLLM (draft_model with parallel_drafting) at the folder's gamma."""
    return parallel_commands(report, "draft_model", "one draft forward", DEFAULT_GAMMA)
