"""Model-card sections beyond the main table: acceptance by prompt category, and the deployment check's verdict.

Both read what was measured or checked: ``by_category`` of the result dicts (decode.evaluate), and
``deploy_check`` of OUTPUT_DIR/train_results.json (written by scripts/train.py from decode.deploy_check).
"""
from __future__ import annotations

import json
from pathlib import Path


def _number(value, spec: str, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def category_section(results: list[dict]) -> str:
    """'## Acceptance by prompt category' with one row per (temperature, gamma, category); '' without categories."""
    rows = [(r, name, c) for r in results for name, c in sorted((r.get("by_category") or {}).items())]
    if not rows:
        return ""
    lines = ["## Acceptance by prompt category", "",
             "The same measurement split by the category of each prompt (each row is over that category's prompts "
             "only; acceptance varies with the task).", "",
             "| gamma | temperature | category | prompts | acceptance_rate | mean_accepted_tokens | speedup |",
             "|---:|---:|---|---:|---:|---:|---:|"]
    for result, name, c in sorted(rows, key=lambda x: (x[0].get("temperature", 0.0), x[0].get("gamma", 0), x[1])):
        lines.append(f"| {result.get('gamma', 'n/a')} | {_number(result.get('temperature'), 'g')} | {name} "
                     f"| {c.get('num_prompts', 'n/a')} | {_number(c.get('acceptance_rate'), '.3f')} "
                     f"| {_number(c.get('mean_accepted_tokens'), '.2f')} | {_number(c.get('speedup'), '.2f', 'x')} |")
    return "\n".join(lines) + "\n"


def deploy_section(model_dir: Path) -> str:
    """'## Deployment check': the verdict of specdistill-check at export (train_results.json), or how to run it."""
    path = Path(model_dir) / "train_results.json"
    check = json.loads(path.read_text()).get("deploy_check") if path.is_file() else None
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
