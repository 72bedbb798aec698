"""The plots of docs/benchmarks/real_target.md (concurrency.png: serving.md), drawn from the committed JSON beside
it (nothing is measured here):

    .venv/bin/python scripts/plot_real_target.py [--out docs/benchmarks/real_target] \
        [--doc docs/benchmarks/real_target.md]

writes data_curve.png, gamma.png, concurrency.png, categories.png and per_position.png into --out. --doc also writes
the data curve's table (from data_curve.json, the plot's numbers) into the page between its lines
`<!-- BEGIN plot_real_target (scripts/plot_real_target.py --doc) -->` and `<!-- END plot_real_target -->`.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # after the backend is chosen

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file: the table formatter and the page markers are the project's
    sys.path.insert(0, str(ROOT))
JSON_DIR = ROOT / "docs" / "benchmarks" / "real_target"

# The best drafter of each kind on the Zen 5 VM, 16 held-out prompts, greedy: label -> its eval JSON, one per gamma
DRAFTERS = {
    "EAGLE-3 head (3840 steered rows, answers alone)": ["head90_heldout_g2_zen5.json", "head90_heldout_g4_zen5.json"],
    "standalone draft (2 layers, 3840 rows)": ["draft3840_g1_zen5.json", "draft3840_g2_zen5.json"],
    "PARD draft converted from it": ["pard3840_g2_zen5.json", "pard3840_g4_zen5.json", "pard3840_g6_zen5.json"],
    "prompt lookup": ["lookup_heldout_g2_zen5.json", "lookup_heldout_g4_zen5.json"],
}
# Each drafter at its largest measured gamma, for the acceptance of each draft position
PER_POSITION = {
    "EAGLE-3 head (3840 steered rows, answers alone)": "head90_heldout_g4_zen5.json",
    "EAGLE-3 head (2048 prompts, 960 steps)": "head2048_gammas_xeon.json",
    "standalone draft (2 layers, 3840 rows)": "draft3840_g2_zen5.json",
    "PARD draft converted from it": "pard3840_g6_zen5.json",
    "prompt lookup": "lookup_heldout_g4_zen5.json",
}
# Heads on the same 3840-row budget (1920 steps), all 96 held-out prompts, gamma 4
CATEGORY_HEADS = {
    "Magpie rows only": "head3840x1920_heldout96_g4_zen5.json",
    "half toward the categories": "mix1920_heldout96_g4_zen5.json",
    "all toward the categories": "head90_heldout96_g4_zen5.json",
}
CURVE_HEADERS = ["training prompts", "prompts written", "steps", "epochs", "precision", "trained on", "acceptance",
                 "tau (gamma 4)", "tau (gamma 2)", "per-position acceptance (gamma 4)"]
DOC_NAME = "plot_real_target"


def read(name: str) -> dict:
    return json.loads((JSON_DIR / name).read_text(encoding="utf-8"))


def results(name: str) -> list[dict]:
    """The greedy results of one eval JSON (ours, not vLLM's), in gamma order."""
    return sorted((r for r in read(name)["results"] if r["temperature"] == 0), key=lambda r: r["gamma"])


def curve_rows() -> list[dict]:
    return read("data_curve.json")["rows"]


def curve_table() -> str:
    """The data curve's markdown table: every row of data_curve.json as the page shows it."""
    from decode.measure.table import markdown_table

    def cells(row: dict) -> list[str]:
        written = row["data"] + (f"; head {row['head']}" if "head" in row else "")
        steps = f"{row['steps']} of {row['schedule_steps']}" if "schedule_steps" in row else str(row["steps"])
        tau2 = "" if row["tau_gamma2"] is None else f"{row['tau_gamma2']:.2f}"
        positions = " / ".join(f"{p:.2f}" for p in row["per_position_gamma4"])
        return [str(row["prompts"]), written, steps, str(row["epochs"]), row["precision"], row["machine"],
                f"{row['acceptance']:.3f}", f"{row['tau_gamma4']:.2f}", tau2, positions]

    return "\n".join(markdown_table(CURVE_HEADERS, [cells(row) for row in curve_rows()])) + "\n"


# ---- one function per plot ---------------------------------------------------------------------------------------

def plot_data_curve(path: Path) -> None:
    """tau at gamma 4 against training steps (one line per training set) and against training prompts (one line per
    number of steps); the checkpoint row and the wider head are left out of the lines."""
    rows = [r for r in curve_rows() if "schedule_steps" not in r and "head" not in r]
    fig = Figure(figsize=(11, 4.2), dpi=100, layout="constrained")
    by_steps, by_prompts = fig.subplots(1, 2, sharey=True)
    sets: dict[str, list[dict]] = {}
    for r in rows:
        precision = "" if r["precision"] == "float32" else ", bf16"
        sets.setdefault(f"{r['prompts']} prompts, {r['data']}{precision}", []).append(r)
    for label, points in sets.items():
        points.sort(key=lambda r: r["steps"])
        by_steps.plot([r["steps"] for r in points], [r["tau_gamma4"] for r in points], "o-", label=label)
    by_steps.set(xscale="log", xlabel="training steps (batch 8)", ylabel="tau at gamma 4 (16 held-out prompts)",
                 title="tau against training steps")
    by_steps.set_xticks([240, 480, 960, 1920, 3840], labels=["240", "480", "960", "1920", "3840"])
    by_steps.legend(fontsize=7, loc="lower right")
    steps_lines: dict[int, list[dict]] = {}
    for r in rows:
        if r["data"].startswith("Magpie") and r["precision"] == "float32":
            steps_lines.setdefault(r["steps"], []).append(r)
    for steps, points in sorted(steps_lines.items()):
        points.sort(key=lambda r: r["prompts"])
        by_prompts.plot([r["prompts"] for r in points], [r["tau_gamma4"] for r in points], "o-",
                        label=f"{steps} steps")
    by_prompts.set(xscale="log", xlabel="training prompts (the target's own, Magpie; float32)",
                   title="tau against training prompts")
    by_prompts.set_xticks([256, 512, 1024, 2048, 3840], labels=["256", "512", "1024", "2048", "3840"])
    by_prompts.legend(fontsize=7)
    for ax in (by_steps, by_prompts):
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    fig.savefig(path)


def plot_gamma(path: Path) -> None:
    """tau and the measured speedup over plain decoding against gamma, one line per drafter."""
    fig = Figure(figsize=(11, 4.2), dpi=100, layout="constrained")
    tau_ax, speed_ax = fig.subplots(1, 2)
    for label, names in DRAFTERS.items():
        points = [r for name in names for r in results(name)]
        gammas = [r["gamma"] for r in points]
        tau_ax.plot(gammas, [r["mean_accepted_tokens"] for r in points], "o-", label=label)
        speed_ax.plot(gammas, [r["speedup"] for r in points], "o-", label=label)
    speed_ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    tau_ax.set(xlabel="gamma", ylabel="tau (tokens per target pass)", title="tau against gamma")
    speed_ax.set(xlabel="gamma", ylabel="speedup over plain decoding (same run)", title="speedup against gamma")
    for ax in (tau_ax, speed_ax):
        ax.set_xticks(range(1, 7))
        ax.grid(alpha=0.3)
    tau_ax.legend(fontsize=8)
    fig.savefig(path)


def plot_concurrency(path: Path) -> None:
    """vLLM with N sequences at once, prompt lookup at gamma 4: plain and speculative throughput, and their ratio."""
    points = sorted(read("conc_lookup.json")["results"], key=lambda r: r["concurrency"])
    levels = [r["concurrency"] for r in points]
    fig = Figure(figsize=(11, 4.2), dpi=100, layout="constrained")
    tput_ax, ratio_ax = fig.subplots(1, 2)
    tput_ax.plot(levels, [r["target_tokens_per_s"] for r in points], "o-", label="plain decoding")
    tput_ax.plot(levels, [r["speculative_tokens_per_s"] for r in points], "o-", label="prompt lookup, gamma 4")
    tput_ax.set(ylabel="generated tokens/s (one call, 32 prompts)", title="throughput against concurrency")
    tput_ax.legend(fontsize=8)
    ratio_ax.plot(levels, [r["speedup"] for r in points], "o-")
    ratio_ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    ratio_ax.set(ylabel="speculative / plain throughput", title="speedup against concurrency")
    for ax in (tput_ax, ratio_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, labels=[str(n) for n in levels])
        ax.minorticks_off()
        ax.set_xlabel("concurrent sequences (vLLM max_num_seqs)")
        ax.grid(alpha=0.3)
    fig.savefig(path)


def plot_categories(path: Path) -> None:
    """Acceptance and tau per held-out category, grouped bars, one bar per head."""
    heads = {label: results(name)[0]["by_category"] for label, name in CATEGORY_HEADS.items()}
    categories = sorted(next(iter(heads.values())))
    width = 0.8 / len(heads)
    fig = Figure(figsize=(11, 6.5), dpi=100, layout="constrained")
    acc_ax, tau_ax = fig.subplots(2, 1, sharex=True)
    for i, (label, by_category) in enumerate(heads.items()):
        xs = [c + (i - (len(heads) - 1) / 2) * width for c in range(len(categories))]
        acc_ax.bar(xs, [by_category[c]["acceptance_rate"] for c in categories], width, label=label)
        tau_ax.bar(xs, [by_category[c]["mean_accepted_tokens"] for c in categories], width, label=label)
    acc_ax.set(ylabel="acceptance", title="per category: 3840 rows, 1920 steps, all 96 held-out prompts, gamma 4")
    tau_ax.set(ylabel="tau", ylim=(1, None))
    tau_ax.set_xticks(range(len(categories)), labels=categories)
    acc_ax.legend(fontsize=8)
    for ax in (acc_ax, tau_ax):
        ax.grid(axis="y", alpha=0.3)
    fig.savefig(path)


def plot_per_position(path: Path) -> None:
    """P(draft token i accepted | the ones before it were), one line per drafter at its largest measured gamma."""
    fig = Figure(figsize=(7.5, 4.2), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    for label, name in PER_POSITION.items():
        result = results(name)[-1]
        accepted = result["per_position_acceptance"]
        ax.plot(range(1, len(accepted) + 1), accepted, "o-", label=f"{label}, gamma {result['gamma']}")
    ax.set(xlabel="draft position", ylabel="acceptance given the positions before were accepted", ylim=(0, 1),
           title="per-position acceptance, 16 held-out prompts, greedy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.savefig(path)


PLOTS: dict[str, Callable[[Path], None]] = {
    "data_curve.png": plot_data_curve,
    "gamma.png": plot_gamma,
    "concurrency.png": plot_concurrency,
    "categories.png": plot_categories,
    "per_position.png": plot_per_position,
}


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=JSON_DIR, help="folder the PNGs are written to")
    parser.add_argument("--doc", type=Path, help="write the data curve's table into this page, between its markers")
    args = parser.parse_args(argv)

    # ---- the plots ----
    args.out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, plot in PLOTS.items():
        plot(args.out / name)
        written.append(args.out / name)
        print(args.out / name)

    # ---- the data curve's table ----
    if args.doc:
        from scripts.benchmark import write_doc

        write_doc(args.doc, curve_table(), DOC_NAME)
    return written


if __name__ == "__main__":
    main()
