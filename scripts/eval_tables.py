"""The benchmark pages' tables of `specdistill eval` results (and gpu.md's of scripts/bench_decode.py), written from
the JSON committed under docs/benchmarks/ (nothing is measured here):

    .venv/bin/python scripts/eval_tables.py [--doc docs/benchmarks/real_target.md]

prints every table and, with --doc, writes each of that page's tables between its lines
`<!-- BEGIN NAME (scripts/eval_tables.py --doc) -->` and `<!-- END NAME -->` (NAME: a key of TABLES). Each table is
declared below: its page, the headers of the words each row brings (what was run), the measured columns (keys of
COLUMNS) and its rows, each one eval JSON's result at a gamma and temperature. A page other than a table's own (a
copy, a scratch file) gets the tables whose markers it holds. tests/test_doc_numbers.py writes every block again.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file: the table formatter and the page markers are the project's
    sys.path.insert(0, str(ROOT))

from decode.inputs.checks import read_text
from decode.measure.table import render
from scripts.benchmark import check_doc, doc_markers, write_doc

BENCHMARKS = ROOT / "docs" / "benchmarks"
SCRIPT = "eval_tables"
CATEGORIES = ("advice", "coding", "extraction", "math", "qa", "reasoning", "summarization", "writing")


@dataclass(frozen=True)
class Row:
    """One row: its own words (`{prompts}` in a word is the result's number of prompts) and the result it shows."""
    words: tuple[str, ...]
    json: str                   # the eval JSON, in its table's folder
    gamma: int
    temperature: float = 0.0
    bold: tuple[str, ...] = ()  # the measured columns shown in bold
    compiled: bool | None = None  # the eager (False) or compiled (True) result, where the JSON holds both


@dataclass(frozen=True)
class Table:
    page: str                   # under docs/benchmarks/
    words: tuple[str, ...]      # the headers of the rows' own words
    columns: tuple[str, ...]    # the measured columns: keys of COLUMNS, as the page heads them
    rows: tuple[Row, ...]
    folder: str = "real_target"  # where the rows' JSON lie, under docs/benchmarks/
    headers: tuple[str, ...] = ()  # the page's headers of the columns where they are not the keys of COLUMNS


@dataclass(frozen=True)
class Run:
    """One row's numbers: the whole eval JSON and its result at the row's gamma and temperature (and path)."""
    report: dict
    gamma: int
    temperature: float
    compiled: bool | None = None

    def pick(self, key: str) -> dict:
        """The one entry of the JSON's list `key` (results, vllm_results, parity) at this gamma and temperature (and
        path, where a JSON holds both)."""
        (found,) = [r for r in self.report[key] if r["gamma"] == self.gamma and r["temperature"] == self.temperature
                    and r.get("category") in (None, "all") and on_path(r, self.compiled)]
        return found

    @property
    def ours(self) -> dict:
        return self.pick("results")

    @property
    def vllm(self) -> dict:
        return self.pick("vllm_results")


def on_path(result: dict, compiled: bool | None) -> bool:
    """Whether `result` ran on the path a row asks for: any (None), eager or compiled (its "compiled" key; a JSON of
    scripts/bench_decode.py --compile holds an eager and a compiled result at each gamma)."""
    return compiled is None or bool(result.get("compiled")) == compiled


# ---- formats ------------------------------------------------------------------------------------------------------

def number(value: float | None, spec: str, suffix: str = "") -> str:
    """`value` with `spec` and `suffix`; an exact zero is "0" (a draft position never accepted), a missing value
    empty."""
    if value is None:
        return ""
    return "0" if value == 0 else f"{value:{spec}}{suffix}"


def positions(result: dict) -> str:
    return " / ".join(number(p, ".2f") for p in result["per_position_acceptance"])


def tokens_per_s(result: dict) -> str:
    return f"{result['target_tokens_per_s']:.1f} / {result['speculative_tokens_per_s']:.1f}"


def speedup(result: dict) -> str:
    return number(result["speedup"], ".2f", "x")


def greedy(*results: dict) -> str:
    """Prompts whose greedy output equals plain decoding's (in every result given), of all; empty when sampled."""
    matches = [r.get("greedy_match") for r in results]
    if None in matches:
        return ""
    prompts = results[0]["num_prompts"]
    return f"{round(min(matches) * prompts)}/{prompts}"


def greedy_match(result: dict) -> str:
    """greedy(), or "(sampling)" for a sampled result (gpu.md's tables)."""
    return greedy(result) or "(sampling)"


def path(result: dict) -> str:
    return "compiled" if result.get("compiled") else "eager"


def over_assisted(result: dict) -> str:
    """Speculative decoding's tokens/s over transformers' assisted generation's (scripts/bench_decode.py's JSON)."""
    return number(result["speculative_tokens_per_s"] / result["hf_assisted_tokens_per_s"], ".2f", "x")


def category_tau(category: str) -> Callable[[Run], str]:
    return lambda run: number(run.ours["by_category"][category]["mean_accepted_tokens"], ".2f")


COLUMNS: dict[str, Callable[[Run], str]] = {
    "gamma": lambda run: str(run.gamma),
    "acceptance": lambda run: number(run.ours["acceptance_rate"], ".3f"),
    "tau": lambda run: number(run.ours["mean_accepted_tokens"], ".2f"),
    "per-position acceptance": lambda run: positions(run.ours),
    "c": lambda run: number(run.ours["draft_cost_ratio"], ".3f"),
    "gamma * c": lambda run: number(run.gamma * run.ours["draft_cost_ratio"], ".2f"),
    "v": lambda run: number(run.ours["verify_cost_ratio"], ".2f"),
    "plain / spec tok/s": lambda run: tokens_per_s(run.ours),
    "speedup": lambda run: speedup(run.ours),
    "speedup over plain": lambda run: speedup(run.ours),
    "predicted": lambda run: number(run.ours["predicted_speedup"], ".2f", "x"),
    "greedy = plain": lambda run: greedy(run.ours),
    # --engine both: ours and vLLM's, tau counted on vLLM's basis (the JSON's parity)
    "tau ours": lambda run: number(run.pick("parity")["tau_specdistill"], ".3f"),
    "tau vLLM": lambda run: number(run.pick("parity")["tau_vllm"], ".3f"),
    "ours: plain / spec tok/s": lambda run: tokens_per_s(run.ours),
    "ours speedup": lambda run: speedup(run.ours),
    "vLLM: plain / spec tok/s": lambda run: tokens_per_s(run.vllm),
    "vLLM speedup": lambda run: speedup(run.vllm),
    "ours / vLLM speedup": lambda run: number(run.ours["speedup"] / run.vllm["speedup"], ".2f"),
    "greedy = plain (both)": lambda run: greedy(run.ours, run.vllm),
    # gpu.md: the path, the temperature and each tokens/s on its own (bench_decode.py's JSON: c to 0.01, HF's tok/s)
    "path": lambda run: path(run.ours),
    "T": lambda run: number(run.temperature, ".1f"),
    "plain tok/s": lambda run: number(run.ours["target_tokens_per_s"], ".1f"),
    "spec tok/s": lambda run: number(run.ours["speculative_tokens_per_s"], ".1f"),
    "hf assisted tok/s": lambda run: number(run.ours["hf_assisted_tokens_per_s"], ".1f"),
    "c to 0.01": lambda run: number(run.ours["draft_cost_ratio"], ".2f"),
    "spec / hf": lambda run: over_assisted(run.ours),
    "greedy match": lambda run: greedy_match(run.ours),
    "measured / predicted": lambda run: number(run.ours["speedup"] / run.ours["predicted_speedup"], ".2f"),
    # tau per held-out category
    **{category: category_tau(category) for category in CATEGORIES},
    "all": lambda run: number(run.ours["mean_accepted_tokens"], ".2f"),
}

FULL = ("gamma", "acceptance", "tau", "per-position acceptance", "c", "v", "plain / spec tok/s", "speedup",
        "predicted", "greedy = plain")
PARALLEL = ("gamma", "acceptance", "tau", "per-position acceptance", "c", "gamma * c", "v", "plain / spec tok/s",
            "speedup", "predicted", "greedy = plain")
NO_SPEED = tuple(c for c in PARALLEL if c != "plain / spec tok/s")  # runs whose tokens/s the page leaves out
HELD_OUT, ALL_HELD_OUT = "held-out, {prompts}", "held-out, all {prompts}"  # the prompts column of a row
HALF = "**half toward the categories**"
NINETY, T1 = "**the 90-minute recipe**", 1.0
ANSWERS = "the same rows and steps, answers alone (`data.loss_tokens: assistant`)"
ZEN4, ZEN5 = "Zen 4 bf16", "Zen 5"
BOTH = ("gamma", "tau ours", "tau vLLM", "ours: plain / spec tok/s", "ours speedup", "vLLM: plain / spec tok/s",
        "vLLM speedup", "ours / vLLM speedup", "greedy = plain (both)")

GPU_DECODE = ("path", "gamma", "acceptance", "tau", "c to 0.01", "v", "plain tok/s", "spec tok/s", "hf assisted tok/s",
              "speedup", "predicted", "spec / hf")
GPU_DECODE_HEADERS = ("path", "gamma", "acceptance_rate", "tau", "c", "v", "plain tok/s", "speculative tok/s",
                      "hf assisted tok/s", "speedup", "predicted", "spec / hf")  # bench_decode.py's own
CPU_DECODE = (*GPU_DECODE, "measured / predicted")  # decode.md: bench_decode.py on a CPU
CPU_DECODE_HEADERS = (*GPU_DECODE_HEADERS, "measured / predicted")
GPU_EVAL = ("path", "gamma", "T", "acceptance", "tau", "c", "v", "plain tok/s", "spec tok/s", "speedup", "greedy match")


def bench_decode(json: str = "decode.json", gammas: tuple[int, ...] = (2, 4),
                 paths: tuple[bool, ...] = (False, True)) -> tuple[Row, ...]:
    """The rows of a JSON of scripts/bench_decode.py (with --compile: an eager and a compiled result at each gamma):
    each path of `paths` (False: eager, True: compiled) at every gamma."""
    return tuple(Row((), json, g, compiled=compiled) for compiled in paths for g in gammas)


def series(words: str, name: str, gammas: tuple[int, ...], best: int = 0, temperature: float = 0.0) -> list[Row]:
    """One drafter's rows, one per gamma of one JSON; the speedup at gamma `best` in bold."""
    return [Row((words,), name, g, temperature, ("speedup",) if g == best else ()) for g in gammas]


TABLES: dict[str, Table] = {
    # ---- real_target.md ----
    "real_target_lookup": Table("real_target.md", ("drafter",), FULL, (
        Row(("prompt lookup",), "lookup_heldout_g2_zen5.json", 2),
        Row(("prompt lookup",), "lookup_heldout_g4_zen5.json", 4))),
    "real_target_steered": Table("real_target.md", ("head (3840 rows)", "steps", "prompts"), FULL, (
        Row(("Magpie only", "1920", HELD_OUT), "head3840x1920_heldout_g4_zen5.json", 4),
        Row(("Magpie only", "3840", HELD_OUT), "head3840x3840_heldout_g4_zen5.json", 4),
        Row((HALF, "1920", HELD_OUT), "mix1920_heldout_g2_zen5.json", 2),
        Row((HALF, "1920", HELD_OUT), "mix1920_heldout_g4_zen5.json", 4, bold=("tau", "speedup")),
        Row(("Magpie only", "1920", ALL_HELD_OUT), "head3840x1920_heldout96_g4_zen5.json", 4),
        Row((HALF, "1920", ALL_HELD_OUT), "mix1920_heldout96_g4_zen5.json", 4, bold=("tau", "speedup")),
        Row(("Magpie only", "1920", "Magpie, never trained on, {prompts}"), "head3840x1920_unseen_g4_zen5.json", 4),
        Row((HALF, "1920", "Magpie, never trained on, {prompts}"), "mix1920_unseen_g4_zen5.json", 4),
        Row(("Magpie only", "3840", "Magpie, never trained on, {prompts}"), "head3840x3840_unseen_g4_zen5.json", 4,
            bold=("speedup",)),
        Row(("Magpie only", "1920", "Magpie, training prompts, {prompts}"), "head3840x1920_train_g4_zen5.json", 4))),
    "real_target_categories": Table("real_target.md", ("category",), (*CATEGORIES, "all"), (
        Row(("Magpie only",), "head3840x1920_heldout96_g4_zen5.json", 4),
        Row(("half toward the categories",), "mix1920_heldout96_g4_zen5.json", 4, bold=("math", "all")),
        Row(("all toward the categories",), "head90_heldout96_g4_zen5.json", 4,
            bold=("math", "all")))),
    "real_target_90min": Table("real_target.md", ("drafter", "machine", "prompts"), FULL, (
        Row((NINETY + " (every token trained)", ZEN4, HELD_OUT), "head90all_heldout_zen4bf16.json", 2),
        Row((NINETY, ZEN4, HELD_OUT), "head90all_heldout_zen4bf16.json", 4, bold=("tau",)),
        Row((NINETY, ZEN4, ALL_HELD_OUT), "head90all_heldout96_g4_zen4bf16.json", 4, bold=("tau",)),
        Row(("the 90-minute recipe, T=1", ZEN4, HELD_OUT), "head90all_heldout_T1_zen4bf16.json", 2, T1, ("speedup",)),
        Row(("the 90-minute recipe, T=1", ZEN4, HELD_OUT), "head90all_heldout_T1_zen4bf16.json", 4, T1),
        Row((ANSWERS, ZEN4, HELD_OUT), "head90_heldout_zen4bf16.json", 2),
        Row((ANSWERS, ZEN4, HELD_OUT), "head90_heldout_zen4bf16.json", 4),
        Row((ANSWERS, ZEN4, ALL_HELD_OUT), "head90_heldout96_g4_zen4bf16.json", 4),
        Row(("prompt lookup (no training)", ZEN4, HELD_OUT), "lookup_heldout_zen4bf16.json", 2),
        Row(("prompt lookup (no training)", ZEN4, HELD_OUT), "lookup_heldout_zen4bf16.json", 4),
        Row(("answers alone, on rows written on that VM", ZEN5, HELD_OUT), "head90_heldout_g2_zen5.json", 2),
        Row(("answers alone", ZEN5, HELD_OUT), "head90_heldout_g4_zen5.json", 4),
        Row(("answers alone", ZEN5, ALL_HELD_OUT), "head90_heldout96_g4_zen5.json", 4),
        Row(("answers alone, T=1", ZEN5, HELD_OUT), "head90_heldout_g2_T1_zen5.json", 2, T1),
        Row(("answers alone, T=1", ZEN5, HELD_OUT), "head90_heldout_g4_T1_zen5.json", 4, T1))),
    "real_target_draft": Table("real_target.md", ("draft (3840 rows)", "steps"), FULL, (
        Row(("2 target layers, `ce`, 4096-token vocabulary", "1920"), "draft3840_g1_zen5.json", 1),
        Row(("the same", "1920"), "draft3840_g2_zen5.json", 2, bold=("tau", "speedup")),
        Row(("the same, one more epoch", "2400"), "draft3840plus480_g1_zen5.json", 1),
        Row(("the same, one more epoch", "2400"), "draft3840plus480_g2_zen5.json", 2),
        Row(("the same (1920 steps), all {prompts} held-out prompts", "1920"), "draft3840_heldout96_g2_zen5.json", 2))),
    "real_target_both": Table("real_target.md", ("drafter",), BOTH, (
        *series("head, 3840 prompts (half steered), 1920 steps", "both_mix1920_zen5.json", (2, 4)),
        *series("head, 3840 prompts (all steered), 1920 steps, answers alone", "both_head90_zen5.json", (2, 4)),
        Row(("head of [the 90-minute recipe](#the-90-minute-recipe), **Zen 4 bf16 VM**",),
            "both_head90all_zen4bf16.json", 2),
        Row(("the same, **Zen 4 bf16 VM**",), "both_head90all_zen4bf16.json", 4),
        Row(("[the quickstart's head](#the-quickstarts-head-gamma-1-and-training-for-it), **AMD EPYC VM**",),
            "both_qshead_epyc.json", 1),
        Row(("the same, **AMD EPYC VM**",), "both_qshead_epyc.json", 2),
        *series("standalone draft, 2 layers, 3840 rows", "both_draft3840_zen5.json", (1, 2)),
        *series("prompt lookup", "both_lookup_zen5.json", (2, 4)))),
    "real_target_quickstart": Table("real_target.md", ("drafter",), (
            "gamma", "acceptance", "tau", "c", "v", "speedup over plain", "predicted", "plain / spec tok/s"), (
        Row(("head (256 prompts, 8 epochs, no training-time test, its first layer from the target's last)",),
            "quickstart_head_epyc.json", 1, bold=("speedup over plain",)),
        Row(("standalone draft (2 target layers, `ce` 4 epochs, 4096-token vocabulary)",),
            "quickstart_draft_epyc.json", 1),
        Row(("prompt lookup",), "quickstart_prompt_lookup_epyc.json", 4))),
    # ---- parallel.md ----
    "parallel_512": Table("parallel.md", ("draft",), NO_SPEED, (
        *series("sequential", "sd_lk_chat.json", (2, 4), best=2),
        *series("PARD from layers", "pard_from_layers.json", (2, 4, 6), best=4),
        *series("PARD converted", "pard_converted.json", (2, 4, 6), best=4))),
    "parallel_3840": Table("parallel.md", ("draft",), PARALLEL, (
        Row(("sequential",), "draft3840_g1_zen5.json", 1),
        Row(("sequential",), "draft3840_g2_zen5.json", 2, bold=("speedup",)),
        Row(("sequential, one more epoch",), "draft3840plus480_g1_zen5.json", 1),
        Row(("sequential, one more epoch",), "draft3840plus480_g2_zen5.json", 2, bold=("speedup",)),
        Row(("PARD converted",), "pard3840_g2_zen5.json", 2),
        Row(("PARD converted",), "pard3840_g4_zen5.json", 4, bold=("speedup",)),
        Row(("PARD converted",), "pard3840_g6_zen5.json", 6),
        Row(("PARD converted, every row read out (`--draft-vocab full`)",), "pard3840_g4_full_zen5.json", 4),
        Row(("sequential, all {prompts} held-out prompts",), "draft3840_heldout96_g2_zen5.json", 2),
        Row(("PARD converted, all {prompts} held-out prompts",), "pard3840_heldout96_g4_zen5.json", 4),
        Row(("sequential, T=1",), "draft3840_g2_T1_zen5.json", 2, T1),
        Row(("PARD converted, T=1",), "pard3840_g4_T1_zen5.json", 4, T1))),
    "parallel_epochs": Table("parallel.md", ("PARD converted",), PARALLEL, (
        Row(("one epoch (480 steps, the table above)",), "pard3840_g4_zen5.json", 4),
        Row(("three epochs, checkpoint at step 480",), "pard3840x3_step480_g4_zen5.json", 4),
        Row(("three epochs, checkpoint at step 960",), "pard3840x3_step960_g4_zen5.json", 4),
        Row(("three epochs (1440 steps)",), "pard3840x3_g2_zen5.json", 2),
        Row(("three epochs",), "pard3840x3_g4_zen5.json", 4, bold=("tau", "speedup")),
        Row(("three epochs",), "pard3840x3_g6_zen5.json", 6),
        Row(("three epochs, all {prompts} held-out prompts",), "pard3840x3_heldout96_g4_zen5.json", 4),
        Row(("three epochs, T=1",), "pard3840x3_g4_T1_zen5.json", 4, T1),
        Row(("*budget control*: the sequential draft plus three more epochs of its own recipe (1440 steps, 1436 s)",),
            "draft3840plus1440_g1_zen5.json", 1, bold=("speedup",)),
        Row(("*budget control*",), "draft3840plus1440_g2_zen5.json", 2))),
    "parallel_p_eagle": Table("parallel.md", ("drafter",), NO_SPEED, (
        *series("EAGLE-3 head (sequential)", "head512_g246.json", (2, 4, 6), best=2),
        *series("P-EAGLE head", "p_eagle512.json", (2, 4, 6), best=4),
        *series("DFlash (1 layer)", "dflash512_l3.json", (2, 4, 6), best=4))),
    "parallel_sampled": Table("parallel.md", ("drafter",), ("gamma", "acceptance", "tau", "per-position acceptance"), (
        *series("EAGLE-3 head (sequential)", "head512_T1.json", (2, 4, 6), temperature=T1),
        *series("P-EAGLE head", "p_eagle512_T1.json", (2, 4, 6), temperature=T1),
        *series("PARD converted", "pard_converted_T1.json", (2, 4, 6), temperature=T1))),
    # ---- heads.md ----
    "heads_dflash": Table("heads.md", ("drafter",), tuple(c for c in NO_SPEED if c != "gamma * c"), (
        *series("EAGLE-3 head", "head512_g246.json", (2, 4), best=2),
        *series("DFlash, reading layers (1, 14, 26)", "dflash512_l3.json", (2, 4), best=4),
        *series("DFlash, the same, hard-label CE", "dflash512_ce.json", (4,), best=4))),
    "heads_small_pair": Table("heads.md", ("drafter",), NO_SPEED, (
        *series("EAGLE-3 head (sequential, TTT 4)", "head_ttt_T0.json", (2, 4, 6)),
        *series("distilled draft (sequential)", "distilled_T0.json", (2, 3, 4)),
        *series("PARD, from scratch", "pard_T0.json", (2, 4, 8)),
        *series("P-EAGLE head", "p_eagle_T0.json", (2, 3, 4, 8)),
        *series("DFlash (1 layer)", "dflash_T0.json", (2, 4, 8))), folder="small_pair"),
    # ---- gpu.md ----
    "gpu_h200_decode": Table("gpu.md", (), GPU_DECODE, bench_decode(), "gpu/h200", GPU_DECODE_HEADERS),
    "gpu_h200_head512": Table("gpu.md", ("draft",), GPU_EVAL, (
        Row(("EAGLE-3 head",), "head_greedy.json", 2),
        Row(("EAGLE-3 head",), "head_greedy.json", 4),
        Row(("EAGLE-3 head",), "head_t1.json", 4, T1),
        Row(("EAGLE-3 head",), "head_compiled.json", 4),
        Row(("prompt lookup",), "lookup_greedy.json", 4)), "gpu/h200/head512"),
    "gpu_h100_decode": Table("gpu.md", (), GPU_DECODE, bench_decode(), "gpu/h100", GPU_DECODE_HEADERS),
    # ---- decode.md: scripts/bench_decode.py on this CPU ----
    "decode_pair3_compiled": Table("decode.md", (), CPU_DECODE, bench_decode("pair3_compiled.json"), "decode",
                                   CPU_DECODE_HEADERS),
    **{f"decode_pair{n}": Table("decode.md", (), CPU_DECODE, bench_decode(f"pair{n}.json", (2, 3, 4), (False,)),
                                "decode", CPU_DECODE_HEADERS) for n in (1, 2, 3)},
}


# ---- the tables ---------------------------------------------------------------------------------------------------

def run_of(table: Table, row: Row) -> Run:
    report = json.loads(read_text(BENCHMARKS / table.folder / row.json))
    return Run(report, row.gamma, row.temperature, row.compiled)


def cells(table: Table, row: Row) -> list[str]:
    """The row as the page shows it: its words, then each measured column (bold where the row says)."""
    run = run_of(table, row)
    words = [w.replace("{prompts}", str(run.ours["num_prompts"])) for w in row.words]
    shown = [COLUMNS[c](run) for c in table.columns]
    return words + [f"**{s}**" if c in row.bold and s else s for c, s in zip(table.columns, shown)]


NUMBER = re.compile(r"^\**[\d./]+x?\**$")  # a single number (or a count "16/16"): right-aligned


def table_text(name: str) -> str:
    """Table `name` in markdown: a column is right-aligned when every cell of it is a number, the first never."""
    table = TABLES[name]
    rows = [cells(table, row) for row in table.rows]
    headers = [*table.words, *(table.headers or table.columns)]
    left = [i == 0 or not all(NUMBER.match(r[i]) for r in rows if r[i]) for i in range(len(headers))]
    return render(headers, rows, "markdown", left) + "\n"


def names_for(page: Path) -> list[str]:
    """The tables --doc writes into `page`: all of its own when it is a table's page (each must have its markers),
    else those whose markers it holds."""
    own = [n for n, t in TABLES.items() if (BENCHMARKS / t.page).resolve() == page.resolve()]
    if own:
        return own
    held = read_text(page) if page.is_file() else ""
    found = [n for n in TABLES if doc_markers(n, SCRIPT)[0] in held]
    if not found:
        sys.exit(f"{SCRIPT}: --doc {page} holds none of the markers <!-- BEGIN NAME (scripts/{SCRIPT}.py --doc) --> "
                 f"for NAME in {', '.join(TABLES)}")
    return found


def main(argv: list[str] | None = None) -> dict[str, str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--doc", type=Path, help="write this page's tables between their markers")
    args = parser.parse_args(argv)
    names = names_for(args.doc) if args.doc else list(TABLES)
    if args.doc:
        for name in names:
            check_doc(args.doc, name, SCRIPT)  # every block's markers there before any block is written
    written = {name: table_text(name) for name in names}
    for name, text in written.items():
        if args.doc:
            write_doc(args.doc, text, name, SCRIPT)
        else:
            print(f"{name} ({TABLES[name].page}):\n\n{text}")
    return written


if __name__ == "__main__":
    main()
