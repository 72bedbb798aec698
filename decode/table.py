"""A readable fixed-width table of evaluation results for the terminal."""
from __future__ import annotations

COLUMNS = [
    ("drafter", "{}"), ("category", "{}"), ("prompts", "{}"), ("gamma", "{}"), ("temp", "{:.2f}"),
    ("accept", "{:.3f}"), ("draft_acc", "{:.3f}"), ("tau", "{:.2f}"), ("speedup", "{:.2f}x"),
    ("predicted", "{:.2f}x"), ("plain tok/s", "{:.1f}"), ("spec tok/s", "{:.1f}"), ("hf tok/s", "{:.1f}"),
]
KEYS = {"drafter": "drafter", "category": "category", "prompts": "num_prompts", "gamma": "gamma",
        "temp": "temperature", "accept": "acceptance_rate", "draft_acc": "draft_acceptance_rate",
        "tau": "mean_accepted_tokens", "speedup": "speedup",
        "predicted": "predicted_speedup", "plain tok/s": "target_tokens_per_s",
        "spec tok/s": "speculative_tokens_per_s", "hf tok/s": "hf_assisted_tokens_per_s"}


def format_table(rows: list[dict]) -> str:
    """Rows are result dicts (optionally with a ``drafter`` name and a ``category``); absent columns are left out."""
    columns = [(name, fmt) for name, fmt in COLUMNS if any(r.get(KEYS[name]) is not None for r in rows)]
    cells = [[name for name, _ in columns]]
    for row in rows:
        value = lambda name, fmt: "-" if row.get(KEYS[name]) is None else fmt.format(row[KEYS[name]])  # noqa: E731
        cells.append([value(name, fmt) for name, fmt in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
