"""docs/benchmarks/head_objectives.md's blocks and plots from a record of scripts/bench_heads_objectives.py: the
table (one row per arm, seed and temperature, the gammas side by side) and the plot of each arm's tau gain over the
recipe on its own machine. Nothing here trains or measures."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from decode.measure.table import markdown_table

if TYPE_CHECKING:  # matplotlib is imported by plot() alone
    from matplotlib.figure import Figure


def machines_of(record: dict) -> dict[str, dict]:
    """{label: {"machine", "load_average"}}; a record of one machine is machine A."""
    return dict(record.get("machines") or {"A": {"machine": record["machine"], "load_average": record["load_average"]}})


def record_gammas(runs: list[dict], timed: bool = False) -> list[int]:
    """The gammas any run of the record was judged at (with ``timed``: judged with a speedup), in order."""
    return sorted({r["gamma"] for measured in runs for r in measured["results"] if not timed or r.get("speedup")})


def table_headers(record: dict) -> list[str]:
    """The table's columns: the row's labels, tau at each gamma of the record, the acceptance per position at the
    row's largest gamma, the speedup at each timed gamma, the training time."""
    return ["arm", *(["machine"] if "machines" in record else []), "seed", "T",
            *(["prompts"] if isinstance(record["num_prompts"], list) else []),
            *(f"tau, gamma {g}" for g in record_gammas(record["runs"])), "acceptance per position, largest gamma",
            *(f"speedup, gamma {g}" for g in record_gammas(record["runs"], timed=True)), "training s"]


def table_rows(runs: list[dict]) -> list[list[str]]:
    """One row per (arm, seed, temperature), in the order measured, its gammas side by side ("-" where the row was
    not judged at a gamma of the record); the machine after the arm when the record holds more than one, the
    held-out prompts after the temperature when its runs differ in them."""
    gammas, timed = record_gammas(runs), record_gammas(runs, timed=True)
    rows = []
    for measured in runs:
        seconds = measured["train_seconds"]
        at = {r["gamma"]: r for r in measured["results"]}
        largest = at[max(at)].get("per_position_acceptance") or []
        rows.append([measured["arm"], *([measured["machine"]] if "machine" in measured else []),
                     str(measured["seed"]), f"{measured['temperature']:g}",
                     *([str(measured["num_prompts"])] if "num_prompts" in measured else []),
                     *(f"{at[g]['mean_accepted_tokens']:.3f}" if g in at else "-" for g in gammas),
                     " / ".join(f"{a:.2f}" for a in largest),
                     *(f"{at[g]['speedup']:.2f}x" if at.get(g, {}).get("speedup") else "-" for g in timed),
                     f"{seconds:.0f}" if seconds else "-"])
    return rows


def doc_text(record: dict) -> str:
    """The page's block from the record alone: the machines, the budget and arms, one table row per arm, seed and
    temperature."""
    several, counts = "machines" in record, record["num_prompts"]
    changes = "; ".join(f"`{arm}`: " + (" ".join(f"`{o}`" for o in overrides) or "the recipe as it is")
                        for arm, overrides in record["arms"].items())
    machines = [f"Machine{f' {label}' if several else ''}: {m['machine']}; load average at the end "
                f"{m['load_average']}." for label, m in machines_of(record).items()]
    more = f" ({', '.join(record['more_seeds'])}: more seeds for the winners and the recipe)" \
        if record["more_seeds"] else ""
    overrides = f"; every arm also {' '.join(f'`{o}`' for o in record['overrides'])}" if record.get("overrides") \
        else ""
    base = f" with {' '.join(f'`{o}`' for o in record['base'])} (the recipe as these arms were measured; each arm's " \
        "changes after it)" if record.get("base") else ""
    lines = [*machines,
             f"Budget: `recipes/smollm2/{record['budget']}`{base} on the rows and hidden-state cache of "
             f"`{record['data']}/`; seeds {', '.join(map(str, record['seeds']))}"
             f"{more}; {prompt_counts(counts)} held-out chat "
             f"prompts x {record['max_new_tokens']} new tokens "
             f"{'(each answer ending at its EOS)' if record.get('stop_at_eos') else '(past any EOS)'}, eager, float32"
             f"{overrides}. Arms: {changes}.", "",
             *markdown_table(table_headers(record), table_rows(record["runs"]))]
    gammas = set(record_gammas(record["runs"]))
    dashes = [*(["not judged at that gamma"] if any({r["gamma"] for r in run["results"]} != gammas
                                                     for run in record["runs"]) else []),
              *(["judged on acceptance alone (`--acceptance-only`: the same tau and acceptance, nothing timed)"]
                if any(r.get("speedup") is None for run in record["runs"] for r in run["results"]) else [])]
    lines += ["", "tau and speedup at each gamma, the acceptance per position at the row's largest gamma"
              + (f"; -: {', or '.join(dashes)}" if dashes else "") + "."]
    return "\n".join(lines) + "\n"


def prompt_counts(counts: int | list[int]) -> str:
    """The record's held-out prompts in words: "32", or "32 or 96 (column `prompts`)"."""
    if isinstance(counts, int):
        return str(counts)
    return " or ".join(map(str, counts)) + " (column `prompts`)"


def group_of(measured: dict) -> str:
    """A run's bars in the plot: its arm, with its machine and held-out prompts when the record's runs differ in
    them, and its temperature when it is not greedy."""
    labels = [str(measured[k]) + (" prompts" if k == "num_prompts" else "") for k in ("machine", "num_prompts")
              if k in measured] + ([f"T={measured['temperature']:g}"] if measured["temperature"] else [])
    return f"{measured['arm']} ({', '.join(labels)})" if labels else measured["arm"]


def same_setting(a: dict, b: dict) -> bool:
    """Whether two runs were trained and judged alike but for their arm and seed: the same machine, held-out
    prompts and temperature."""
    return all(a.get(k) == b.get(k) for k in ("machine", "num_prompts", "temperature"))


def tau_at(measured: dict, gamma: int) -> float | None:
    return next((r["mean_accepted_tokens"] for r in measured["results"] if r["gamma"] == gamma), None)


def gains(runs: list[dict], baseline: str) -> dict[str, dict[int, list[float]]]:
    """Each group's tau minus its baseline's at each gamma, one value per seed: the baseline is the ``baseline``
    arm's mean over seeds in the same setting (machine, prompts, temperature), as CPUs train differently. A group
    whose setting has no baseline at a gamma has no value there; the baseline's own runs are not a group."""
    out: dict[str, dict[int, list[float]]] = {}
    for measured in runs:
        if measured["arm"] == baseline:
            continue
        for r in measured["results"]:
            base = [tau for other in runs if other["arm"] == baseline and same_setting(other, measured)
                    if (tau := tau_at(other, r["gamma"])) is not None]
            if base:
                out.setdefault(group_of(measured), {}).setdefault(r["gamma"], []).append(
                    r["mean_accepted_tokens"] - statistics.mean(base))
    return out


def baseline_of(record: dict) -> str:
    """The arm every other is drawn against: `recipe` where the record holds it, else its first arm (the 90-minute
    budget's `answers`)."""
    return "recipe" if "recipe" in record["arms"] else next(iter(record["arms"]))


def plot(path: Path, runs: list[dict], baseline: str) -> Figure | None:
    """What each arm gains over the ``baseline`` arm on its own machine: one panel per gamma measured, side by
    side, a bar per arm (the mean over its seeds, each seed a dot), the arms sorted by their gain at their largest
    gamma, best on top. Returns the figure; None, with one line, where no arm has a baseline to be drawn against."""
    per_group = gains(runs, baseline)
    if not per_group:
        print(f"--plot: nothing drawn: no arm beside `{baseline}` judged on the same machine, prompts and temperature")
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gammas = sorted({gamma for at in per_group.values() for gamma in at})

    def rank(group: str) -> float:
        at = per_group[group]
        return statistics.mean(at[max(at)])

    groups = sorted(per_group, key=rank, reverse=True)
    fig, axes = plt.subplots(1, len(gammas), sharey=True, squeeze=False,
                             figsize=(max(7.5, 2.0 + 3.2 * len(gammas)), 1.6 + 0.26 * len(groups)))
    for ax, gamma in zip(axes[0], gammas):
        means = [statistics.mean(per_group[g][gamma]) if gamma in per_group[g] else float("nan") for g in groups]
        ax.barh(range(len(groups)), means, color=["tab:green" if m > 0 else "tab:red" for m in means], alpha=0.7)
        for y, group in enumerate(groups):
            seeds = per_group[group].get(gamma, [])
            ax.plot(seeds, [y] * len(seeds), "k.", markersize=3)
        ax.axvline(0.0, color="black", linewidth=0.8)
        ax.set_xlabel(f"tau gain at gamma {gamma}")
        ax.grid(axis="x", alpha=0.3)
    axes[0, 0].set_yticks(range(len(groups)), groups)
    axes[0, 0].invert_yaxis()  # the best arm on top
    fig.suptitle(f"EAGLE-3 heads on SmolLM2-135M-Instruct, the same rows and steps\ntau over `{baseline}` on the "
                 "same machine (bars: mean over seeds; dots: seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return fig
