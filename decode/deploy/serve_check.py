"""The `serve` check of a deployment (`specdistill-check --serve`): vLLM loads the checked pair and its speculative
greedy output equals its plain output, at the gamma the folder names (decode.deploy.deploy_check.DEFAULT_GAMMA when
it names none)."""
from __future__ import annotations

from pathlib import Path

from decode.deploy.deploy_check import DEFAULT_GAMMA, DeployReport
from decode.inputs.loading import load_tokenizer
from decode.inputs.prompts import PromptRow, encode_prompt_rows
from decode.measure.settings import EvalSettings
from decode.serving.vllm_engine import ServingError, ServingKind, evaluate_in_vllm

SERVE_PROMPTS = ("def fibonacci(n):", "The three most common sorting algorithms are",
                 "Explain what a hash table is to a new programmer.")


def check_serve(report: DeployReport, python: Path, kind: ServingKind, max_new_tokens: int = 64,
                prompts: tuple[str, ...] = SERVE_PROMPTS, dtype: str = "float32") -> DeployReport:
    """Load the pair (the draft of ``kind``) in vLLM (decode.serving.vllm_engine) at the report's gamma
    (DEFAULT_GAMMA when the folder names none), greedy, in ``dtype``: a 'serve' problem when vLLM fails or its
    speculative output differs from its plain one.
    ``report.serve`` gets vLLM's result. Raises ServingError when there is no vLLM interpreter."""
    tokenizer = load_tokenizer(report.target)
    prompt_ids = encode_prompt_rows(tokenizer, [PromptRow(text=p) for p in prompts], "auto")
    settings = EvalSettings(gammas=[report.gamma or DEFAULT_GAMMA], max_new_tokens=max_new_tokens)
    try:
        [result], response = evaluate_in_vllm(python, report.target, report.draft, prompt_ids, settings, kind,
                                              dtype=dtype)
    except ServingError as err:
        report.problems["serve"] = f"vLLM could not serve the pair: {err}"
        return report
    report.serve = {"vllm_version": response["vllm_version"], **result}
    if result["greedy_match"] != 1.0:
        report.problems["serve"] = (f"vLLM's speculative greedy output differs from its plain output on "
                                    f"{1 - result['greedy_match']:.0%} of the prompts: the draft loads wrong")
    return report
