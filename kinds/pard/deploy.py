"""The deployment checks of a PARD draft folder next to its target, and the commands that serve it.

Checks: a standalone draft's (kinds/standalone/deploy.py: safetensors, tokenizer, vocab, context, rope, dtype,
generation config), and
- pard_token: config.json names the mask token as vLLM reads it (`pard_token`, an id of the draft's embedding);
- gamma: the served gamma (generation_config.num_assistant_tokens) is at most the gamma it was trained for
  (`pard_gamma`): slots past it were never trained.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from decode.deploy.deploy_check import DEFAULT_GAMMA, DeployReport
from decode.deploy.serving_commands import vllm_serve, vllm_speculative_config
from decode.inputs.checks import read_text
from kinds.standalone.deploy import CHECKS, check_model_deploy

PARD_CHECKS = (*CHECKS, "pard_token", "gamma")
VLLM_OPTIONS = {"parallel_drafting": True}  # vLLM's draft_model proposer drafting all gamma tokens in one forward


def pard_problems(config: dict, gamma: int | None) -> dict[str, str]:
    """The pard_token and gamma checks on the draft's config.json (a dict) and served gamma."""
    problems = {}
    token, vocab = config.get("pard_token"), config.get("vocab_size")
    if not isinstance(token, int) or (isinstance(vocab, int) and not 0 <= token < vocab):
        problems["pard_token"] = (f"config.json has pard_token={token!r}; vLLM's parallel drafting needs the mask "
                                  f"token's id there (0..{vocab - 1 if isinstance(vocab, int) else 'vocab_size - 1'})"
                                  ": re-export with specdistill-train or add it")
    trained = config.get("pard_gamma")
    if isinstance(trained, int) and gamma is not None and gamma > trained:
        problems["gamma"] = (f"generation_config.json drafts gamma={gamma}, but the draft was trained for at most "
                             f"{trained} tokens per forward: set num_assistant_tokens <= {trained}")
    return problems


def check_pard_deploy(target: str, draft: str | Path, trust_remote_code: bool = False) -> DeployReport:
    """PARD_CHECKS of a PARD folder next to ``target``. Raises LoadError as check_model_deploy does."""
    report = check_model_deploy(target, draft, trust_remote_code)
    config = json.loads(read_text(Path(draft) / "config.json"))
    return replace(report, kind="pard", checks=PARD_CHECKS,
                   problems={**report.problems, **pard_problems(config, report.gamma)})


def pard_commands(report: DeployReport) -> str:
    """specdistill-eval and vLLM (draft_model with parallel_drafting) at the folder's gamma."""
    gamma = report.gamma or DEFAULT_GAMMA
    spec = vllm_speculative_config("draft_model", report.draft, gamma, VLLM_OPTIONS)
    return f"""# specdistill's own decoder (the same measurement as the trainer's)
specdistill-eval --target {report.target} --draft {report.draft} --prompts PROMPTS --gamma {gamma}

# vLLM (one draft forward per step)
{vllm_serve(report.target, spec)}"""
