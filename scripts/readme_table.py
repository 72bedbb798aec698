"""The README's headline table, written from the committed eval JSON of each drafter (docs/benchmarks/real_target/;
nothing is measured here):

    .venv/bin/python scripts/readme_table.py [--doc README.md]

prints the table of "On a real model" and, with --doc, writes it between the README's lines
`<!-- BEGIN readme_table (scripts/readme_table.py --doc) -->` and `<!-- END readme_table -->`. The README's other
quoted figures come from here too: plain decoding's tokens/s over the table's runs, and the quickstart's minutes and
its head's tau and speedup (tests/test_doc_numbers.py checks each against these JSONs).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file: the table formatter and the page markers are the project's
    sys.path.insert(0, str(ROOT))

from decode.inputs.checks import read_text
from decode.measure.table import render
from scripts.benchmark import write_doc
from scripts.plot_real_target import results

DOC_NAME = "readme_table"
REAL_TARGET = "docs/benchmarks/real_target.md"
# The best drafter of each kind, 16 held-out prompts, greedy: (the README's words, its eval JSON, gamma, the VM). The
# 90-minute recipe's head was measured on the Zen 4 bf16 VM, beside prompt lookup there; the rest on the Zen 5 VM.
ZEN4, ZEN5 = "Zen 4 bf16", "Zen 5"
ROWS = [
    (f"EAGLE-3 head of [the 90-minute recipe]({REAL_TARGET}#the-90-minute-recipe) "
     "(`recipes/smollm2/eagle3_90min.yaml`): 3840 prompts the target wrote and answered, 1920 steps",
     "head90all_heldout_zen4bf16.json", 2, ZEN4),
    ("the same head", "head90all_heldout_zen4bf16.json", 4, ZEN4),
    ("prompt lookup (no training), on the same VM", "lookup_heldout_zen4bf16.json", 2, ZEN4),
    ("prompt lookup", "lookup_heldout_zen4bf16.json", 4, ZEN4),
    (f"[standalone draft]({REAL_TARGET}#3840-rows-half-toward-the-held-out-categories) (2 of the target's layers, "
     "4096-token vocabulary), 3840 prompts, 1920 steps", "draft3840_g2_zen5.json", 2, ZEN5),
    ("[PARD draft](docs/benchmarks/parallel.md#3840-rows-and-a-draft-vocabulary) converted from it (one forward drafts "
     "all 4)", "pard3840_g4_zen5.json", 4, ZEN5),
    ("prompt lookup (no training), on the same VM", "lookup_heldout_g2_zen5.json", 2, ZEN5),
    ("prompt lookup", "lookup_heldout_g4_zen5.json", 4, ZEN5),
]
QUICKSTART = ("quickstart_head_epyc.json", 1)  # what `make quickstart` ended with on the AMD EPYC VM: the head, gamma 1
QUICKSTART_RUN = "quickstart_run_epyc.json"     # the same run's quickstart_run.json: its minutes
HEADERS = ["drafter", "machine", "gamma", "acceptance", "tau", "speedup over plain (same run)",
           "greedy output = plain"]


def result(name: str, gamma: int) -> dict:
    """The greedy result at `gamma` of one committed eval JSON."""
    (found,) = [r for r in results(name) if r["gamma"] == gamma and r.get("category") in (None, "all")]
    return found


def table() -> str:
    """The README's table: one row per drafter, every number its eval JSON's."""
    rows = []
    for label, name, gamma, machine in ROWS:
        r = result(name, gamma)
        rows.append([label, machine, str(r["gamma"]), f"{r['acceptance_rate']:.3f}", f"{r['mean_accepted_tokens']:.2f}",
                     f"{r['speedup']:.2f}x", f"{round(r['greedy_match'] * r['num_prompts'])}/{r['num_prompts']}"])
    text = [header in ("drafter", "machine") for header in HEADERS]  # the words columns, left-aligned
    return render(HEADERS, rows, "markdown", text) + "\n"


def plain_tokens_per_s() -> str:
    """Plain decoding's tokens/s over the table's runs, as the README quotes it: "42-48"."""
    speeds = [result(name, gamma)["target_tokens_per_s"] for _, name, gamma, _ in ROWS]
    return f"{min(speeds):.0f}-{max(speeds):.0f}"


def quickstart_figures() -> str:
    """The quickstart head's tau and speedup, as the README quotes them: "tau 1.36, 1.11x"."""
    r = result(*QUICKSTART)
    return f"tau {r['mean_accepted_tokens']:.2f}, {r['speedup']:.2f}x"


def quickstart_minutes() -> str:
    """How long that `make quickstart` took, as the README quotes it: "16.5 min"."""
    run = json.loads(read_text(ROOT / "docs" / "benchmarks" / "real_target" / QUICKSTART_RUN))
    return f"{run['minutes']:.1f} min"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--doc", type=Path, help="write the table into this page (README.md), between its markers")
    args = parser.parse_args(argv)
    text = table()
    print(text, end="")
    if args.doc:
        write_doc(args.doc, text, DOC_NAME)
    return text


if __name__ == "__main__":
    main()
