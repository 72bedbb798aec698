"""Model-card sections beyond the main table: acceptance by prompt category, and the deployment check's verdict.

Both read what was measured or checked: ``by_category`` of the result dicts (decode.evaluate), and
``deploy_check`` of OUTPUT_DIR/train_results.json (written by scripts/train.py from decode.deploy_check).
"""
from __future__ import annotations

import json
from pathlib import Path

from decode.table import CARD_CATEGORY_COLUMNS, format_table


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
