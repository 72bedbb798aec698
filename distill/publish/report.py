"""Present measured results (eval JSONs via decode.measure.results, acceptance.jsonl via
distill.outputs.acceptance_log) as a report.

    write_report(Path("report"), runs={"kl": Path("out/kl")}, evals={"kl-draft": Path("eval.json")},
                 machine="1x H100 80GB")
    write_report(Path("report"), runs=..., evals={"kd": {42: Path("kd.json"), 43: Path("kd@seed43.json")},
                 "ce": {42: ..., 43: ...}}, machine=..., margin=("kd", "ce", 4))   # mean and spread over seeds

``write_report`` writes report.md and three PNG plots (matplotlib, Agg via ``Figure``; no pyplot state):
acceptance_vs_step.png (acceptance_rate against training step, one line per run, at one gamma/temperature),
per_position_acceptance.png (grouped bars per drafter) and speedup_vs_gamma.png (measured speedup solid,
predicted dashed, one colour per drafter). A plot with nothing to draw is left out and the report says why.
Tables come from decode.measure.table; local paths are written relative to the run's folder (``shown_path``).
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from decode.inputs.writes import write_atomic
from decode.measure.results import read_eval_json
from decode.measure.table import CATEGORY_COLUMNS, REPORT_COLUMNS, format_table
from distill.outputs.acceptance_log import best_checkpoint, read_records
from distill.publish.seed_spread import SEED_COLUMNS, seed_rows, tau_margin

STEP_PLOT = "acceptance_vs_step.png"
POSITION_PLOT = "per_position_acceptance.png"
SPEEDUP_PLOT = "speedup_vs_gamma.png"


# ---------------------------------------------------------------------------------------------------------------
# Paths as the report shows them
# ---------------------------------------------------------------------------------------------------------------

def shown_path(name: str | Path, root: Path) -> str:
    """A local path relative to ``root`` (the run's folder), so that a report or card names no folder of the
    machine it was written on; anything else (a hub id, "prompt-lookup") as it is."""
    path = Path(name).expanduser()
    if not (path.is_absolute() or path.exists()):
        return str(name)
    return Path(os.path.relpath(path.resolve(), Path(root).resolve())).as_posix()


# ---------------------------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------------------------

def _new_figure(width: float = 7.0, height: float = 4.5) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("the report's plots need matplotlib: pip install 'specdistill[report]'") from exc
    return Figure(figsize=(width, height), dpi=100, layout="tight")


def choose_setting(runs: dict[str, list[dict]]) -> tuple[int, float] | None:
    """The (gamma, temperature) logged by the most runs; ties go to the larger gamma, then the lower temperature."""
    counts = Counter()
    for rows in runs.values():
        counts.update({(row["gamma"], row["temperature"]) for row in rows if "gamma" in row and "temperature" in row})
    if not counts:
        return None
    return max(counts, key=lambda s: (counts[s], s[0], -s[1]))


def plot_acceptance_vs_step(path: Path, runs: dict[str, dict[int | None, list[dict]]], gamma: int,
                            temperature: float) -> list[str]:
    """acceptance_rate against step at ``gamma``/``temperature``, one line per run: the mean over its seeds, with a
    band from the lowest to the highest seed when it has several; returns the runs drawn."""
    fig = _new_figure()
    ax = fig.add_subplot()
    drawn = []
    for colour, (name, by_seed) in zip((f"C{i}" for i in range(10_000)), runs.items()):
        at_step: dict[int, list[float]] = {}
        for rows in by_seed.values():
            for r in rows:
                if r.get("gamma") == gamma and r.get("temperature") == temperature \
                        and r.get("acceptance_rate") is not None:
                    at_step.setdefault(r["step"], []).append(r["acceptance_rate"])
        if not at_step:
            continue
        steps = sorted(at_step)
        means = [sum(at_step[s]) / len(at_step[s]) for s in steps]
        label = name if len(by_seed) == 1 else f"{name} (mean of {len(by_seed)} seeds)"
        ax.plot(steps, means, marker="o", color=colour, label=label)  # markers keep a single checkpoint visible
        if len(by_seed) > 1:  # band: min..max over seeds
            ax.fill_between(steps, [min(at_step[s]) for s in steps], [max(at_step[s]) for s in steps],
                            color=colour, alpha=0.2, linewidth=0)
        drawn.append(name)
    ax.set(xlabel="training step", ylabel="acceptance_rate", ylim=(0, 1.02),
           title=f"Acceptance during training (gamma={gamma}, temperature={temperature:g})")
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend()
        fig.savefig(path)
    return drawn


def per_position_rows(evals: dict[str, list[dict]]) -> dict[str, dict]:
    """Per drafter, the result with the longest per_position_acceptance (lowest temperature first); drafters
    without per-position data are left out."""
    chosen = {}
    for name, results in evals.items():
        with_data = [r for r in results if r.get("per_position_acceptance")]
        if with_data:
            chosen[name] = max(with_data, key=lambda r: (len(r["per_position_acceptance"]), -r.get("temperature", 0)))
    return chosen


def plot_per_position(path: Path, chosen: dict[str, dict]) -> None:
    """Grouped bars: P(draft token i accepted | tokens before it accepted) per position, one colour per drafter."""
    fig = _new_figure()
    ax = fig.add_subplot()
    width = 0.8 / max(len(chosen), 1)
    for k, (name, row) in enumerate(chosen.items()):
        rates = row["per_position_acceptance"]
        xs = [i + 1 - 0.4 + width * (k + 0.5) for i in range(len(rates))]
        ax.bar(xs, rates, width=width,
               label=f"{name} (gamma={row.get('gamma')}, T={row.get('temperature', 0):g})")
    n_positions = max(len(r["per_position_acceptance"]) for r in chosen.values())
    ax.set_xticks(range(1, n_positions + 1))
    ax.set(xlabel="draft position", ylabel="acceptance given earlier accepted", ylim=(0, 1.05),
           title="Per-position acceptance")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.savefig(path)


def spread_bars(rows: list[dict], key: str) -> list[list[float]] | None:
    """Error bars from the mean down to the lowest seed and up to the highest (``KEY_range`` of seed_spread rows);
    None for rows of a single measurement."""
    ranges = [(r[key], r.get(f"{key}_range")) for r in rows if r.get(key) is not None]
    if not any(bounds for _, bounds in ranges):
        return None
    return [[mean - (bounds or (mean, mean))[0] for mean, bounds in ranges],
            [(bounds or (mean, mean))[1] - mean for mean, bounds in ranges]]


def plot_speedup_vs_gamma(path: Path, evals: dict[str, list[dict]]) -> bool:
    """Measured speedup (solid) and predicted speedup (dashed) against gamma, one colour per drafter and
    temperature; measured speedups averaged over seeds (distill.publish.seed_spread) get min-max error bars (predicted
    ones none, to stay readable). Returns False when no result has a speedup."""
    fig = _new_figure()
    ax = fig.add_subplot()
    colours = iter(f"C{i}" for i in range(10_000))
    drawn, drawn_labels = False, []
    for name, results in evals.items():
        for temperature in sorted({r.get("temperature", 0.0) for r in results}):
            rows = sorted((r for r in results if r.get("temperature", 0.0) == temperature  # fixed gammas only
                           and isinstance(r.get("gamma"), int)), key=lambda r: r["gamma"])
            label = name if len({r.get("temperature", 0.0) for r in results}) == 1 else f"{name} (T={temperature:g})"
            colour = next(colours)
            measured = [(r["gamma"], r["speedup"]) for r in rows if r.get("speedup") is not None]
            predicted = [(r["gamma"], r["predicted_speedup"]) for r in rows if r.get("predicted_speedup") is not None]
            drawn_labels += [f"{label} measured", f"{label} predicted"]
            if measured:
                ax.errorbar(*zip(*measured), yerr=spread_bars(rows, "speedup"), marker="o", color=colour, capsize=3,
                            label=f"{label} measured")
                drawn = True
            if predicted:
                ax.plot(*zip(*predicted), marker="x", linestyle="--", color=colour, label=f"{label} predicted")
    if not drawn:
        return False
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # gamma is a whole number of tokens
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set(xlabel="gamma (draft tokens per step)", ylabel="speedup over target alone", title="Speedup vs gamma")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()  # error-bar entries come after lines: back to drawing order
    pairs = sorted(zip(labels, handles), key=lambda pair: drawn_labels.index(pair[0]))
    ax.legend([h for _, h in pairs], [label for label, _ in pairs], fontsize="small")
    fig.savefig(path)
    return True


# ---------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------

def category_lines(rows: list[dict], what: str) -> list[str]:
    """A 'by prompt category' table of ``by_category`` in result rows (each row has a ``drafter``); [] without."""
    flat = [{"drafter": row["drafter"], "category": name, **result} for row in rows
            for name, result in (row.get("by_category") or {}).items()]
    order = {name: i for i, name in enumerate(dict.fromkeys(row["drafter"] for row in rows))}
    # drafters side by side within each (gamma, temperature, category)
    flat.sort(key=lambda r: (r.get("gamma", 0), r.get("temperature", 0.0), r["category"], order[r["drafter"]]))
    if not flat:
        return []
    return ["", f"By prompt category ({what}; each row over that category's prompts only):", "", "```text",
            format_table(flat, CATEGORY_COLUMNS), "```"]


def _eval_section(out_dir: Path, evals: dict[str, dict[int | None, dict]], root: Path,
                  margin: tuple[str, str, int] | None) -> list[str]:
    if not evals:
        return ["## Evaluations", "", "No eval_acceptance JSON was given.", ""]
    lines = ["## Evaluations", ""]
    for name, by_seed in evals.items():
        for seed, payload in by_seed.items():
            draft, target = (shown_path(payload.get(key, "?"), root) for key in ("draft", "target"))
            lines.append(f"- **{seed_label(name, seed)}**: draft `{draft}`, target `{target}`, "
                         f"measured on {payload.get('device', 'unrecorded device')}, "
                         f"dtype {payload.get('dtype', '?')}, torch {payload.get('torch_version', '?')}")
    rows = [{"drafter": seed_label(name, seed), **r} for name, by_seed in evals.items()
            for seed, payload in by_seed.items() for r in payload["results"]]
    results = {name: [r for payload in by_seed.values() for r in payload["results"]] for name, by_seed in evals.items()}
    if any(len(by_seed) > 1 for by_seed in evals.values()):
        means = seed_rows({name: {seed: payload["results"] for seed, payload in by_seed.items()}
                           for name, by_seed in evals.items()})
        results = {name: [r for r in means if r["drafter"] == name] for name in evals}
        lines += ["", "Mean over the seeds each drafter was trained at; spread = max - min over those seeds. Only a "
                  "difference larger than the spread is a claim:", "", "```text", format_table(means, SEED_COLUMNS),
                  "```"]
        if margin is not None:
            lines += ["", f"**Headline**: {tau_margin(means, *margin).sentence()}"]
        lines += ["", "Each seed:"]
    lines += ["", "```text", format_table(rows, REPORT_COLUMNS), "```"]
    lines += category_lines(rows, "the evaluations above") + [""]
    if plot_speedup_vs_gamma(out_dir / SPEEDUP_PLOT, results):
        lines += [f"![speedup vs gamma]({SPEEDUP_PLOT})", "",
                  "Solid: measured wall-clock speedup; dashed: predicted from mean_accepted_tokens and measured "
                  "step costs (means over seeds; bars: the lowest to the highest seed). Below the dotted line "
                  "speculative decoding is slower than the target alone.", ""]
    else:
        lines += ["No speedup was measured, so there is no speedup plot.", ""]
    chosen = per_position_rows(results)
    if chosen:
        plot_per_position(out_dir / POSITION_PLOT, chosen)
        lines += [f"![per-position acceptance]({POSITION_PLOT})", ""]
    missing = [name for name in evals if name not in chosen]
    if missing:
        lines += [f"No per-position acceptance data for: {', '.join(missing)}.", ""]
    return lines


def seed_label(name: str, seed: int | None) -> str:
    """A drafter's name in per-seed rows: "draft_kd seed 43", or the name alone for a drafter with no seed."""
    return name if seed is None else f"{name} seed {seed}"


def _run_section(out_dir: Path, grouped: dict[str, dict[int | None, list[dict]]], gamma: int | None,
                 temperature: float | None) -> list[str]:
    if not grouped:
        return ["## Training runs", "", "No training run was given.", ""]
    lines = ["## Training runs", ""]
    runs = {seed_label(name, seed): rows for name, by_seed in grouped.items() for seed, rows in by_seed.items()}
    setting = choose_setting(runs)
    if setting is None:
        return lines + ["The acceptance logs hold no rows yet.", ""]
    gamma = setting[0] if gamma is None else gamma
    temperature = setting[1] if temperature is None else temperature
    drawn = plot_acceptance_vs_step(out_dir / STEP_PLOT, grouped, gamma, temperature)
    table = []
    for name, rows in runs.items():
        picked = sorted((r for r in rows if r.get("gamma") == gamma and r.get("temperature") == temperature),
                        key=lambda r: r["step"])
        if picked:
            table.append({"drafter": f"{name} @ step {picked[-1]['step']}", **picked[-1]})
        choice = best_checkpoint(rows, temperature)
        best = (f"; best (cost-model speedup, the one exported): step {choice.step}, gamma {choice.gamma}"
                + (f", predicted {choice.cost_model_speedup:.2f}x" if choice.cost_model_speedup is not None else "")
                if choice else "")
        lines.append(f"- **{name}**: {len({r['step'] for r in rows})} checkpoint(s) logged"
                     + ("" if picked else f"; none at gamma={gamma}, temperature={temperature:g}") + best)
    if table:
        measured = "; ".join(f"{row['drafter']}: {row.get('num_prompts', '?')} prompts, "
                             f"{row.get('new_tokens', '?')} new tokens in all" for row in table)
        lines += ["", f"Last checkpoint of each run at gamma={gamma}, temperature={temperature:g}, as the trainer "
                  f"measured it on its own eval prompts ({measured}); these can differ from the evaluations above, "
                  "which may use other prompts and lengths:", "", "```text", format_table(table, REPORT_COLUMNS), "```"]
        lines += category_lines(table, "last checkpoint of each run")
    if drawn:
        lines += ["", f"![acceptance vs step]({STEP_PLOT})"]
    return lines + [""]


def by_seed(paths: Path | Mapping[int, Path]) -> list[tuple[int | None, Path]]:
    """(seed, path) pairs of one drafter: its {seed: path}, or [(None, path)] for a single path."""
    return list(paths.items()) if isinstance(paths, Mapping) else [(None, Path(paths))]


def write_report(out_dir: Path, *, runs: Mapping[str, Path | Mapping[int, Path]],
                 evals: Mapping[str, Path | Mapping[int, Path]],
                 machine: str, gamma: int | None = None, temperature: float | None = None, root: Path | None = None,
                 margin: tuple[str, str, int] | None = None) -> Path:
    """Write ``out_dir/report.md`` and its PNG plots; return the report path.

    ``runs`` maps a name to a training OUTPUT_DIR holding acceptance.jsonl, or to {seed: OUTPUT_DIR} (the plot then
    draws the mean over seeds with a min-max band); ``evals`` maps a drafter name to an
    eval_acceptance JSON, or to {seed: eval JSON} for a drafter trained at several seeds (the report then shows the
    mean and spread over seeds, distill.publish.seed_spread, and plots the means); ``machine`` says where the numbers
    were measured. ``margin`` = (better, baseline, gamma) adds a line saying whether better's mean tau margin over
    baseline at gamma, greedy, is larger than the seed spread. ``gamma``/``temperature`` pick the setting of the
    acceptance-vs-step plot (default: the one logged by the most runs). Local model paths are written relative to
    ``root``, the run's folder (default: the parent of ``out_dir``). Raises FileNotFoundError / ValueError for
    missing or malformed inputs (and a margin drafter without that gamma), ImportError without matplotlib.
    """
    out_dir = Path(out_dir)
    run_rows = {name: {seed: read_records(folder, required=True) for seed, folder in by_seed(folders)}
                for name, folders in runs.items()}
    eval_payloads = {name: {seed: read_eval_json(Path(path)) for seed, path in by_seed(paths)}
                     for name, paths in evals.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = ["# specdistill report", "", f"Machine: **{machine}**", ""]
    lines += _eval_section(out_dir, eval_payloads, out_dir.parent if root is None else Path(root), margin)
    lines += _run_section(out_dir, run_rows, gamma, temperature)
    report = out_dir / "report.md"
    write_atomic(report, "\n".join(lines).rstrip() + "\n")
    return report
