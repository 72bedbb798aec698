"""A draft of any kind, its kind found here, once: the library's entry points for a draft in memory or a --draft
value, each finding the kind in the registry (kinds) and handing it to decode/ or distill/, which never look it up.

    out = speculative_generate(target, draft, prompt_ids, max_new_tokens=64, gamma=4)   # any draft in memory
    report = check_deploy("Qwen/Qwen2.5-7B-Instruct", "outputs/head")                   # any exported folder
    print(serving_commands(report))
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from decode.deploy.deploy_check import DeployReport
from decode.deploy.deploy_check import check_deploy as check_deploy_of
from decode.deploy.serve_check import check_serve as check_serve_of
from decode.loop.speculative import GenerateOutput
from decode.loop.speculative import speculative_generate as generate_with
from decode.measure.cost_model import measure_cost_ratios as cost_ratios_with
from decode.measure.evaluate import evaluate_acceptance as evaluate_with
from distill.publish.card_text import CardText
from distill.publish.hub import push_to_hub as push_with
from distill.publish.hub import write_card as write_card_with
from distill.publish.model_card import build_model_card as build_card_with
from kinds import kind_named, kind_of, kind_of_source


def speculative_generate(target: Any, draft: object, input_ids: Any, **kwargs: Any) -> GenerateOutput:
    """decode.loop.speculative.speculative_generate for a draft of any kind in memory (a model, a head, a drafter)."""
    return generate_with(target, draft, input_ids, kind=kind_of(draft), **kwargs)


def evaluate_acceptance(target: Any, draft: object, prompts: Any, settings: Any, **kwargs: Any) -> list[dict]:
    """decode.measure.evaluate.evaluate_acceptance for a draft of any kind in memory."""
    return evaluate_with(target, draft, prompts, settings, kind=kind_of(draft), **kwargs)


def vllm_method(draft: str) -> str:
    """vLLM's speculative method for a --draft value: its kind's ('ngram' for prompt lookup, 'eagle3' for an
    EAGLE-3 head folder, 'draft_model' for a model, ...)."""
    return kind_of_source(draft).vllm_method


def check_deploy(target: str, draft: str | Path, trust_remote_code: bool = False) -> DeployReport:
    """decode.deploy.deploy_check.check_deploy with the checks of the folder's kind."""
    return check_deploy_of(target, draft, kind_of_source(str(draft)), trust_remote_code)


def check_serve(report: DeployReport, python: Path, **kwargs: Any) -> DeployReport:
    """decode.deploy.serve_check.check_serve for the kind the report names."""
    return check_serve_of(report, python, kind_named(report.kind), **kwargs)


def serving_commands(report: DeployReport) -> str:
    """Copy-paste commands serving the checked pair, those of the kind the report names: for a standalone draft
    transformers (assistant_model), vLLM (draft_model) and SGLang; for a head specdistill-eval, vLLM (eagle3) and
    SGLang (EAGLE3); ... With no gamma in the folder they use $GAMMA, set first."""
    return kind_named(report.kind).serving_commands(report)


def card_of(model_dir: str | Path) -> CardText:
    """What a model card says of the kind of the draft in ``model_dir``."""
    return kind_of_source(str(model_dir)).card


def build_model_card(model_dir: Path, **kwargs: Any) -> str:
    """distill.publish.model_card.build_model_card with the text of the folder's kind."""
    return build_card_with(Path(model_dir), card=card_of(model_dir), **kwargs)


def write_card(model_dir: Path, **kwargs: Any) -> Path:
    """distill.publish.hub.write_card with the text of the folder's kind."""
    return write_card_with(Path(model_dir), card=card_of(model_dir), **kwargs)


def push_to_hub(model_dir: Path, **kwargs: Any) -> Any:
    """distill.publish.hub.push_to_hub with the card text of the folder's kind."""
    return push_with(Path(model_dir), card=card_of(model_dir), **kwargs)


def measure_cost_ratios(target: Any, draft: object, prompt: Any, gamma: int, **kwargs: Any) -> Any:
    """decode.measure.cost_model.measure_cost_ratios for a draft of any kind in memory."""
    return cost_ratios_with(target, draft, prompt, gamma, kind=kind_of(draft), **kwargs)
