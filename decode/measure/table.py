"""The one table formatter of the project: result rows (decode.measure.evaluate results, acceptance.jsonl rows) or ready
cells, as a terminal table or a markdown table, built on ``tabulate``.

    print(format_table(rows))                                    # specdistill-eval's terminal table
    format_table(rows, REPORT_COLUMNS)                           # report.md (keys as headers)
    format_table(results, CARD_COLUMNS, style="markdown")        # the model card
    markdown_table(["mode", "tokens/s"], [["online", "812"]])    # benchmarks: cells already formatted

Text columns (drafter, category) are left-aligned, numbers right-aligned; a missing value is shown as ``missing``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tabulate import tabulate

STYLES = {"terminal": "simple", "markdown": "pipe"}
TEXT_KEYS = ("drafter", "category")


@dataclass(frozen=True)
class Column:
    key: str          # the row key read
    header: str       # what the table shows
    spec: str = ""    # format spec of a number ("" = as written)
    suffix: str = ""  # e.g. "x" after a speedup


# specdistill-eval's terminal table: short headers; a column no row has is left out
DECODE_COLUMNS = (
    Column("drafter", "drafter"), Column("category", "category"), Column("num_prompts", "prompts"),
    Column("concurrency", "concurrency"), Column("gamma", "gamma"), Column("temperature", "temp", ".2f"),
    Column("acceptance_rate", "accept", ".3f"), Column("draft_acceptance_rate", "draft_acc", ".3f"),
    Column("mean_accepted_tokens", "tau", ".2f"),
    Column("speedup", "speedup", ".2f", "x"), Column("predicted_speedup", "predicted", ".2f", "x"),
    Column("target_tokens_per_s", "plain tok/s", ".1f"), Column("speculative_tokens_per_s", "spec tok/s", ".1f"),
    Column("hf_assisted_tokens_per_s", "hf tok/s", ".1f"),
)

# the report and the model card: the result keys themselves as headers
_KEYED = {"num_prompts": "", "gamma": "", "temperature": "g", "acceptance_rate": ".3f",
          "mean_accepted_tokens": ".2f", "speedup": ".2f", "predicted_speedup": ".2f",
          "held_in_acceptance_rate": ".3f", "held_in_mean_accepted_tokens": ".2f"}


def keyed_columns(*keys: str) -> tuple[Column, ...]:
    """Columns headed by their result key, with the report's number formats (speedups end in 'x')."""
    return tuple(Column(key, key, _KEYED.get(key, ""), "x" if key.endswith("speedup") else "") for key in keys)


REPORT_COLUMNS = keyed_columns("drafter", "gamma", "temperature", "acceptance_rate", "mean_accepted_tokens",
                               "speedup", "predicted_speedup")
CATEGORY_COLUMNS = keyed_columns("drafter", "category", "num_prompts", "gamma", "temperature", "acceptance_rate",
                                 "mean_accepted_tokens", "speedup")
CARD_COLUMNS = REPORT_COLUMNS[1:]  # one drafter: the card's own
CARD_CATEGORY_COLUMNS = keyed_columns("gamma", "temperature", "category", "num_prompts", "acceptance_rate",
                                      "mean_accepted_tokens", "speedup")
# the card's held-out acceptance beside the acceptance on the draft's own training prompts (the trainer's records)
CARD_HELD_IN_COLUMNS = keyed_columns("gamma", "temperature", "acceptance_rate", "held_in_acceptance_rate",
                                     "mean_accepted_tokens", "held_in_mean_accepted_tokens")


def cell(row: Mapping[str, Any], column: Column, missing: str = "-") -> str:
    """One value as text: ``missing`` when absent or None, text as is, a number with the column's format."""
    value = row.get(column.key)
    if value is None:
        return missing
    if isinstance(value, str) or not column.spec:
        return str(value)
    return f"{value:{column.spec}}{column.suffix}"


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column] = DECODE_COLUMNS, *,
                 style: str = "terminal", missing: str = "-", drop_empty: bool | None = None) -> str:
    """A table of ``columns`` over result ``rows`` (``style``: "terminal" or "markdown").

    ``drop_empty`` leaves out the columns no row has a value for (default: only for DECODE_COLUMNS)."""
    if drop_empty is None:
        drop_empty = columns is DECODE_COLUMNS
    if drop_empty:
        columns = [c for c in columns if any(row.get(c.key) is not None for row in rows)]
    cells = [[cell(row, c, missing) for c in columns] for row in rows]
    return render([c.header for c in columns], cells, style, [c.key in TEXT_KEYS for c in columns])


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A markdown table of cells already formatted (benchmarks): header line, rule, one line per row."""
    text = [i == 0 for i in range(len(headers))]  # the first column names the row
    return render(headers, [[str(c) for c in row] for row in rows], "markdown", text).splitlines()


def render(headers: Sequence[str], cells: Sequence[Sequence[str]], style: str = "terminal",
           text: Sequence[bool] | None = None) -> str:
    """``cells`` under ``headers`` with tabulate; column i is left-aligned where ``text[i]``, else right-aligned
    (default: all right-aligned). Raises ValueError for an unknown ``style``."""
    if style not in STYLES:
        raise ValueError(f"table style must be one of {', '.join(STYLES)}, got {style!r}")
    text = list(text) if text is not None else [False] * len(headers)
    align = ["left" if is_text else "right" for is_text in text]
    return tabulate(cells, headers=list(headers), tablefmt=STYLES[style], disable_numparse=True,
                    colalign=align or None)
