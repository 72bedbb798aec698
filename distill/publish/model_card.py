"""The model card of a trained draft, built from measured numbers with huggingface_hub's ModelCard.

    results, hardware = load_eval_results(Path("out/draft"), eval_json=None)    # or an eval_acceptance JSON
    card = build_model_card(Path("out/draft"), target="Qwen/Qwen2.5-7B-Instruct", recipe_text=recipe,
                            eval_results=results, hardware=hardware, repo_id="me/qwen-draft")   # README.md text

The card states the target, embeds the training recipe, tabulates acceptance and speedup exactly as measured (from
an eval_acceptance JSON, else the acceptance.jsonl rows of the exported checkpoint, else of the last one) with the
hardware they were measured on, acceptance by prompt category (``by_category``), the deployment check's verdict
(``deploy_check`` of OUTPUT_DIR/train_results.json), and how to use the draft with transformers and vLLM. Its metadata
(``ModelCardData``) holds a model-index with one ``EvalResult`` per measured number. Local paths are written
relative to the model folder (the run's folder).
"""
from __future__ import annotations

import json
from pathlib import Path

import yaml
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from decode.inputs.checks import read_text
from decode.measure.results import read_eval_json
from decode.measure.table import CARD_CATEGORY_COLUMNS, CARD_COLUMNS, CARD_HELD_IN_COLUMNS, format_table, markdown_table
from distill.outputs.acceptance_log import best_checkpoint, log_path, read_records
from distill.publish.card_text import CardText
from distill.publish.report import shown_path
from distill.utils import saved_parameter_count

CARD_TAGS = ["speculative-decoding", "draft-model", "specdistill"]
CARD_METRICS = ("acceptance_rate", "mean_accepted_tokens", "speedup", "predicted_speedup")  # in the model-index


# ---------------------------------------------------------------------------------------------------------------
# Inputs: measured results, target, draft
# ---------------------------------------------------------------------------------------------------------------

def check_repo_id(repo_id: str) -> None:
    """Raise ValueError unless ``repo_id`` has the form ``user/name`` with characters the Hub accepts."""
    if not isinstance(repo_id, str) or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ValueError(f"repo id {repo_id!r} must look like 'user/name' (or 'org/name')")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        reason = " ".join(str(exc).split())
        raise ValueError(f"repo id {repo_id!r} is not valid on the Hub: {reason}") from None


def is_hub_id(name: str) -> bool:
    """True when ``name`` reads as a Hub repo id (``org/name``) and is not a folder on this machine."""
    try:
        check_repo_id(name)
    except ValueError:
        return False
    return not Path(name).exists()


def load_eval_results(model_dir: Path, eval_json: Path | None = None, *,
                      step: int | None = None) -> tuple[list[dict], str]:
    """Measured results and the hardware they came from.

    From ``eval_json`` (an eval_acceptance JSON) when given; else the rows of ``model_dir/acceptance.jsonl`` at
    ``step`` (default: the exported checkpoint's step from train_results.json, else the last step logged);
    else ``([], "")``. Raises FileNotFoundError / ValueError on a missing or malformed file, or a ``step`` the
    log does not hold.
    """
    if eval_json is not None:
        payload = read_eval_json(Path(eval_json))
        return list(payload["results"]), describe_hardware(payload)
    rows = read_records(model_dir)
    if not rows:
        return [], ""
    steps = sorted({row["step"] for row in rows})
    exported = exported_step(model_dir) if step is None else None
    chosen = step if step is not None else exported if exported in steps else steps[-1]
    if chosen not in steps:
        raise ValueError(f"{log_path(model_dir)} has no rows for step {step}; steps logged: "
                         f"{', '.join(map(str, steps))}")
    picked = [row for row in rows if row["step"] == chosen]
    return picked, describe_hardware(picked[0]) or "not recorded in acceptance.jsonl (measured during training)"


def exported_step(model_dir: Path) -> int | None:
    """The step of the checkpoint the trainer exported to ``model_dir`` (train_results.json ``best.step``)."""
    path = Path(model_dir) / "train_results.json"
    if not path.is_file():
        return None
    best = json.loads(read_text(path)).get("best")
    step = best.get("step") if isinstance(best, dict) else None
    return step if isinstance(step, int) else None


def describe_hardware(record: dict) -> str:
    """``"cuda (NVIDIA H100), bfloat16, torch 2.13.0"`` from the device/dtype/torch_version keys present."""
    parts = [str(record["device"])] if record.get("device") else []
    if record.get("dtype"):
        parts.append(str(record["dtype"]))
    if record.get("torch_version"):
        parts.append(f"torch {record['torch_version']}")
    return ", ".join(parts)


def read_recipe(model_dir: Path) -> dict:
    """``model_dir/recipe.yaml`` as a mapping ({} when absent or not a mapping)."""
    recipe = Path(model_dir) / "recipe.yaml"
    parsed = yaml.safe_load(read_text(recipe)) if recipe.is_file() else None
    return parsed if isinstance(parsed, dict) else {}


def infer_target(model_dir: Path, eval_json: Path | None = None) -> str | None:
    """The target model id: the eval JSON's ``target``, else ``model.target`` of ``model_dir/recipe.yaml``."""
    if eval_json is not None:
        target = read_eval_json(Path(eval_json)).get("target")
        if target:
            return str(target)
    model_section = read_recipe(model_dir).get("model")
    if isinstance(model_section, dict) and model_section.get("target"):
        return str(model_section["target"])
    return None


def eval_prompts(model_dir: Path, eval_json: Path | None = None) -> str | None:
    """What the numbers were measured on: the eval JSON's ``prompts``, else ``data.eval_prompts`` of the recipe."""
    if eval_json is not None:
        prompts = read_eval_json(Path(eval_json)).get("prompts")
    else:
        data = read_recipe(model_dir).get("data")
        prompts = data.get("eval_prompts") if isinstance(data, dict) else None
    return str(prompts) if prompts else None


def describe_draft(model_dir: Path, card: CardText) -> str:
    """One line on the draft's architecture from config.json (its kind's CardText.describe) and its parameter count
    from the safetensors headers."""
    config_path = Path(model_dir) / "config.json"
    parts = card.describe(json.loads(read_text(config_path))) \
        if config_path.is_file() else []
    n_params = saved_parameter_count(model_dir)
    if n_params:
        parts.append(f"{human_count(n_params)} parameters")
    return ", ".join(parts)


def human_count(n: int) -> str:
    """1234 -> '1.2K', 494_032_768 -> '494.0M', 7_615_616_512 -> '7.6B'."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def best_gamma(results: list[dict]) -> int | None:
    """The gamma of distill.outputs.acceptance_log.best_checkpoint (cost-model speedup from measured acceptance, at the
    lowest temperature measured), or None when nothing was measured."""
    choice = best_checkpoint(results)
    return choice.gamma if choice else None


# ---------------------------------------------------------------------------------------------------------------
# The card
# ---------------------------------------------------------------------------------------------------------------

def sorted_results(results: list[dict]) -> list[dict]:
    """By temperature, then gamma (numbers before "auto")."""
    return sorted(results, key=lambda r: (r.get("temperature", 0.0), str(r.get("gamma", 0)).zfill(4)))


def results_section(results: list[dict], hardware: str) -> str:
    """'## Measured acceptance and speedup': the table of ``results`` and what its columns mean."""
    if not results:
        return ("## Measured acceptance and speedup\n\n"
                "No measurements are available for this model yet: no eval_acceptance JSON was given and no "
                "acceptance.jsonl was found next to the weights. Run `specdistill-eval` and push again with "
                "`--eval-json`.\n")
    steps = sorted({row["step"] for row in results if "step" in row})
    source = (f"Measured by the trainer at step {steps[-1]} (acceptance.jsonl)." if steps
              else "Measured with `specdistill-eval` (eval_acceptance JSON).")
    table = format_table(sorted_results(results), CARD_COLUMNS, style="markdown", missing="n/a")
    return (
        "## Measured acceptance and speedup\n\n"
        f"{source} Hardware: **{hardware or 'not recorded'}**. Speedups are wall-clock and hold for that "
        "hardware only.\n\n"
        f"{table}\n\n"
        "- `acceptance_rate`: per-token acceptance probability, the mean over verified positions of "
        "sum_x min(p(x), q(x)) (= 1 - total variation between target p and draft q).\n"
        "- `mean_accepted_tokens`: tokens produced per target verify pass, the bonus or resampled token "
        "included (block efficiency).\n"
        "- `speedup`: wall-clock tokens/s of speculative decoding over the target alone at the temperature shown; "
        "`predicted_speedup`: mean_accepted_tokens / (gamma * draft_cost_ratio + verify_cost_ratio) from measured "
        "step costs.\n")


def held_in_section(results: list[dict]) -> str:
    """'## Held-in and held-out acceptance': the trainer's records measure a sample of the draft's own training
    prompts beside the held-out ones (eval.held_in_prompts); '' when the results have no held-in numbers."""
    rows = [row for row in sorted_results(results) if row.get("held_in_acceptance_rate") is not None]
    if not rows:
        return ""
    return "\n".join([
        "## Held-in and held-out acceptance", "",
        "Acceptance on prompts the draft never saw (`acceptance_rate`, `mean_accepted_tokens`, as above) beside "
        "acceptance on a sample of its own training prompts (`held_in_*`). A draft that accepts far more of what it "
        "trained on than of new prompts fits its training rows; what users send is new prompts.", "",
        format_table(rows, CARD_HELD_IN_COLUMNS, style="markdown", missing="n/a")]) + "\n"


def category_section(results: list[dict]) -> str:
    """'## Acceptance by prompt category' with one row per (temperature, gamma, category); '' without categories."""
    rows = [{**c, "gamma": r.get("gamma"), "temperature": r.get("temperature"), "category": name}
            for r in results for name, c in sorted((r.get("by_category") or {}).items())]
    if not rows:
        return ""
    rows.sort(key=lambda row: (row["temperature"] or 0.0, str(row["gamma"] or 0).zfill(4), row["category"]))
    return "\n".join([
        "## Acceptance by prompt category", "",
        "The same measurement split by the category of each prompt (each row is over that category's prompts "
        "only; acceptance varies with the task).", "",
        format_table(rows, CARD_CATEGORY_COLUMNS, style="markdown", missing="n/a")]) + "\n"


def deploy_section(model_dir: Path) -> str:
    """'## Deployment check': the verdict of specdistill-check at export (train_results.json), or how to run it."""
    path = Path(model_dir) / "train_results.json"
    check = json.loads(read_text(path)).get("deploy_check") if path.is_file() else None
    if not isinstance(check, dict):
        return ("## Deployment check\n\nNot recorded with this model: run `specdistill-check --target TARGET "
                "--draft THIS_FOLDER` (tokenizer, vocab, context length, rope, dtype, gamma, safetensors).\n")
    problems = check.get("problems") or {}
    if check.get("passed"):
        return ("## Deployment check\n\n`specdistill-check` passed at export: same tokenizer and special tokens as "
                "the target, equal vocab / lm_head rows, context length at least the target's, its kind of rope "
                "scaling, the target's dtype, gamma in generation_config, safetensors weights.\n")
    lines = ["## Deployment check", "", "`specdistill-check` found problems at export; fix them before serving:", ""]
    lines += [f"- **{name}**: {problem}" for name, problem in problems.items()]
    return "\n".join(lines) + "\n"


def serving_section(model_dir: Path, results: list[dict]) -> str:
    """'## Measured in vLLM': vLLM's tau next to ours per gamma (train_results.json "serving", written when the run
    had eval.serving_engine: vllm); '' when not measured."""
    path = Path(model_dir) / "train_results.json"
    serving = json.loads(read_text(path)).get("serving") if path.is_file() else None
    if not isinstance(serving, dict):
        return ""
    if "error" in serving:
        return f"## Measured in vLLM\n\nvLLM could not measure this draft at export: {serving['error']}\n"
    ours = {(r.get("gamma"), r.get("temperature")): r.get("mean_accepted_tokens") for r in results}
    rows = [[r["gamma"], f"{r['temperature']:g}", fmt(ours.get((r["gamma"], r["temperature"]))),
             fmt(r["mean_accepted_tokens"]), fmt(r["greedy_match"])] for r in serving.get("results", [])]
    table = "\n".join(markdown_table(["gamma", "temperature", "tau (specdistill)", "tau (vLLM)",
                                      "vLLM greedy output = plain"], rows))
    return ("## Measured in vLLM\n\n"
            f"The exported folder loaded unchanged in vLLM {serving.get('vllm_version', '')} (offline `LLM`, "
            "`speculative_config` with this draft) on the same prompts; tau from vLLM's spec-decode counters "
            "(1 + accepted / drafts).\n\n" + table + "\n")


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def eval_results(results: list[dict], prompts: str | None) -> list[EvalResult]:
    """The model-index entries: one EvalResult per measured CARD_METRICS value of each (gamma, temperature)."""
    dataset = prompts or "eval prompts"
    return [EvalResult(task_type="text-generation", task_name="speculative decoding",
                       dataset_type=dataset if is_hub_id(dataset) else "local", dataset_name=dataset,
                       metric_type=metric, metric_name=metric, metric_value=row[metric],
                       metric_config=f"gamma={row.get('gamma')}, temperature={row.get('temperature', 0.0):g}")
            for row in sorted_results(results) for metric in CARD_METRICS if row.get(metric) is not None]


def card_metadata(target: str, repo_id: str, results: list[dict], prompts: str | None) -> ModelCardData:
    """Library, tags, base model (a Hub target only) and a model-index of the measured numbers."""
    measured = eval_results(results, prompts)
    return ModelCardData(library_name="transformers", tags=list(CARD_TAGS),
                         base_model=target if is_hub_id(target) else None, pipeline_tag="text-generation",
                         model_name=repo_id.split("/")[-1] if measured else None, eval_results=measured or None)


def build_model_card(model_dir: Path, *, target: str, recipe_text: str | None, eval_results: list[dict],
                     hardware: str, repo_id: str, card: CardText, prompts: str | None = None) -> str:
    """README.md text for the draft in ``model_dir``: metadata, target, measured table, usage (what ``card`` says
    of the draft's kind), recipe.

    A local ``target`` (or ``prompts``) path is written relative to ``model_dir``."""
    if not is_hub_id(target):
        target = shown_path(target, model_dir)
    if prompts is not None and not is_hub_id(prompts):
        prompts = shown_path(prompts, model_dir)
    target_ref = f"[`{target}`](https://huggingface.co/{target})" if is_hub_id(target) else f"`{target}`"
    draft_line = describe_draft(model_dir, card)
    text = card
    recipe = (f"```yaml\n{recipe_text.rstrip()}\n```\n" if recipe_text
              else "No recipe.yaml was saved with this model.\n")
    sections = [
        f"# {repo_id.split('/')[-1]}\n\n" + text.intro.format(target=target_ref)
        + "The draft proposes tokens that the target verifies in one forward pass, so generation follows the "
        "target's distribution and only its speed changes.\n\n"
        f"- **Target model:** `{target}`\n"
        + (f"- **Draft:** {draft_line}\n" if draft_line else ""),
        results_section(eval_results, hardware),
        *[section for section in (held_in_section(eval_results), category_section(eval_results),
                                  deploy_section(model_dir),
                                  serving_section(model_dir, eval_results)) if section],
        text.usage(target, repo_id, best_gamma(eval_results)),
        f"## Training recipe\n\n{recipe}",
    ]
    metadata = card_metadata(target, repo_id, eval_results, prompts)
    metadata.tags = [*metadata.tags, *text.tags]
    return str(ModelCard(f"---\n{metadata.to_yaml()}\n---\n\n" + "\n".join(sections)))
