"""The real model's benchmark (docs/benchmarks/real_target.md): SmolLM2-135M-Instruct and its drafters, measured by
specdistill-eval on the held-out chat prompts (recipes/prompts/chat_eval.jsonl), each eval's JSON kept in --out.

    python scripts/bench_real_target.py --drafter head=outputs/head draft_lk=outputs/draft prompt_lookup \
        --curve 128=runs/curve128 256=runs/curve256 512=runs/curve512 1024=runs/curve1024 \
        --out bench_real_out --doc docs/benchmarks/real_target.md [--vllm]

Sections (each a table; every number comes from one specdistill-eval run, plain and speculative in the same run):
  gammas     every --drafter at --gammas (2..6), greedy, eager, --prompts prompts (tau, acceptance, c, verify cost v,
             measured and predicted speedup), and vLLM's tau at gamma 4 with --vllm (`--engine both`)
  sampled    every --drafter at gamma 4, temperature 1, eager
  compiled   every --drafter at gamma 4, greedy, the static-cache compiled decoder
  curve      each --curve head (NAME=FOLDER, NAME the number of training prompts) at gamma 4, greedy: tau against data
Every eval is reused from --out when its JSON is there (delete it to measure again); --out also gets the record
bench_real_target.json (the machine, the load average at the end, each table's eval JSONs by name), from which

    python scripts/bench_real_target.py --from-json docs/benchmarks/real_target/bench_real_target.json \
        --doc docs/benchmarks/real_target.md

writes the tables again without measuring (the record and its eval JSONs are committed beside the page).
--doc writes the tables into a new file, or into a page between its lines `<!-- BEGIN bench_real_target
(scripts/bench_real_target.py --doc) -->` and `<!-- END bench_real_target -->` (docs/benchmarks/real_target.md has
them); a page without them stops the script before it measures anything.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from decode.measure.table import markdown_table
from scripts.benchmark import check_doc, load_average, machine, write_doc

PROMPTS = ROOT / "recipes" / "prompts" / "chat_eval.jsonl"
SECTIONS = ("gammas", "sampled", "compiled", "curve")
RECORD = "bench_real_target.json"  # in --out, beside the eval JSONs it names: what the page's block shows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default=None, help="default: the SmolLM2 GGUF that `make install` brings")
    p.add_argument("--drafter", nargs="+", default=["prompt_lookup"], metavar="NAME=FOLDER|prompt_lookup")
    p.add_argument("--curve", nargs="*", default=[], metavar="PROMPTS=FOLDER")
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument("--prompts", type=int, default=96, help="held-out prompts of the gammas section (of 96)")
    p.add_argument("--gammas", nargs="+", default=["2", "3", "4", "5", "6"], help="gammas of the gammas section")
    p.add_argument("--short-prompts", type=int, default=16,
                   help="held-out prompts of the sampled, compiled and curve sections (two per category)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--vllm", action="store_true", help="vLLM's tau beside ours in the gammas section")
    p.add_argument("--out", type=Path, default=ROOT / "bench_real_out")
    p.add_argument("--doc", type=Path, default=None,
                   help="write the tables here: a new file, or a page between its BEGIN / END bench_real_target "
                        "markers")
    p.add_argument("--from-json", type=Path, default=None,
                   help=f"measure nothing: the tables of this record ({RECORD}) and the eval JSONs it names beside it")
    return p.parse_args(argv)


def drafters_of(specs: list[str]) -> dict[str, str]:
    """NAME=FOLDER (or prompt_lookup) -> {name: the --draft value}."""
    return {spec.split("=", 1)[0]: (spec.split("=", 1)[1] if "=" in spec else "prompt-lookup") for spec in specs}


def evaluate(args: argparse.Namespace, name: str, draft: str, *extra: str, prompts: int) -> str:
    """One specdistill-eval run, its JSON kept in --out as NAME.json (reused when there): that file's name."""
    from specdistill.cli.eval import main as eval_main

    result = args.out / f"{name}.json"
    if not result.is_file():
        args.out.mkdir(parents=True, exist_ok=True)
        eval_main(["--target", args.target, "--draft", draft, "--prompts", str(PROMPTS), "--chat-template", "on",
                   "--num-prompts", str(prompts), "--max-new-tokens", str(args.max_new_tokens), "--stop-at-eos",
                   "--quiet", "--output", str(result), *extra])
    return result.name


def measure(args: argparse.Namespace, chosen: dict[str, str]) -> list[dict]:
    """Every section's eval JSONs in --out, measured when missing: the record's sections, each
    {"section": NAME, "drafters": {drafter: {"eval": FILE, "vllm": FILE (gammas with --vllm)}}}."""
    sections = []
    for section in args.sections:
        drafters: dict[str, dict[str, str]] = {}
        if section == "gammas":
            for name, draft in chosen.items():
                drafters[name] = {"eval": evaluate(args, f"{name}_gammas", draft, "--gamma", *args.gammas,
                                                   prompts=args.prompts)}
                if args.vllm:
                    drafters[name]["vllm"] = evaluate(args, f"{name}_vllm", draft, "--gamma", "4", "--engine", "both",
                                                      prompts=args.prompts)
        elif section == "curve":
            for size, folder in sorted(drafters_of(args.curve).items(), key=lambda kv: int(kv[0])):
                drafters[size] = {"eval": evaluate(args, f"curve_{size}", folder, "--gamma", "4",
                                                   prompts=args.short_prompts)}
        else:
            for name, draft in chosen.items():
                drafters[name] = {"eval": evaluate(args, f"{name}_{section}", draft, "--gamma", "4",
                                                   *SINGLE[section][1], prompts=args.short_prompts)}
        if drafters:
            sections.append({"section": section, "drafters": drafters})
    return sections


# ---- the page's block, from the record and the eval JSONs it names (nothing measured) -----------------------------

def overall(report: dict, key: str = "results") -> list[dict]:
    return [r for r in report.get(key, []) if r.get("category") in (None, "all")]


def row_cells(name: str, r: dict, vllm_tau: float | None | bool = False) -> list[str]:
    """One table row; vllm_tau False: no vLLM column, None: "-" in it."""
    cells = [name, str(r["num_prompts"]), str(r["gamma"]), f"{r['temperature']:g}", f"{r['acceptance_rate']:.3f}",
             f"{r['mean_accepted_tokens']:.2f}", f"{r['draft_cost_ratio']:.3f}", f"{r['verify_cost_ratio']:.2f}",
             f"{r['target_tokens_per_s']:.1f}", f"{r['speculative_tokens_per_s']:.1f}", f"{r['speedup']:.2f}x",
             f"{r['predicted_speedup']:.2f}x"]
    return cells + ([f"{vllm_tau:.2f}" if vllm_tau is not None else "-"] if vllm_tau is not False else [])


def prompts_of(results: list[dict]) -> str:
    """The prompt counts of a table's rows, as its title gives them."""
    return ", ".join(sorted({str(r["num_prompts"]) for r in results}, key=int))


HEADERS = ["drafter", "prompts", "gamma", "T", "acceptance", "tau", "c", "v", "plain tok/s", "spec tok/s", "speedup",
           "predicted"]
SINGLE = {  # section -> (its table's title, the eval's flags besides --gamma 4)
    "sampled": ("Temperature 1, gamma 4, eager", ["--temperature", "1.0"]),
    "compiled": ("Compiled (static cache), gamma 4, greedy", ["--compile"]),
}


def gammas_table(drafters: dict[str, dict], read: Callable[[str], dict]) -> list[str]:
    with_vllm = any("vllm" in files for files in drafters.values())
    rows, results = [], []
    for name, files in drafters.items():
        taus = ({r["gamma"]: r["mean_accepted_tokens"] for r in overall(read(files["vllm"]), "vllm_results")}
                if "vllm" in files else {})
        own = overall(read(files["eval"]))
        results += own
        rows += [row_cells(name, r, taus.get(r["gamma"]) if with_vllm else False) for r in own]
    gammas = ", ".join(dict.fromkeys(str(r["gamma"]) for r in results))
    return [f"### Gamma {gammas}, greedy, eager ({prompts_of(results)} prompts)", "",
            *markdown_table(HEADERS + (["tau (vLLM)"] if with_vllm else []), rows), ""]


def single_table(section: str, drafters: dict[str, dict], read: Callable[[str], dict]) -> list[str]:
    results = {name: overall(read(files["eval"])) for name, files in drafters.items()}
    rows = [row_cells(name, r) for name, own in results.items() for r in own]
    return [f"### {SINGLE[section][0]} ({prompts_of([r for own in results.values() for r in own])} prompts)", "",
            *markdown_table(HEADERS, rows), ""]


def curve_table(drafters: dict[str, dict], read: Callable[[str], dict]) -> list[str]:
    results = {size: overall(read(files["eval"])) for size, files in drafters.items()}
    rows = [[size, f"{r['acceptance_rate']:.3f}", f"{r['mean_accepted_tokens']:.2f}",
             " / ".join(f"{a:.2f}" for a in r["per_position_acceptance"]), f"{r['speedup']:.2f}x"]
            for size, own in results.items() for r in own]
    return [f"### tau against training prompts (gamma 4, greedy, "
            f"{prompts_of([r for own in results.values() for r in own])} prompts)", "",
            *markdown_table(["training prompts", "acceptance", "tau", "per-position acceptance", "speedup"], rows), ""]


def doc_text(record: dict, folder: Path) -> str:
    """The page's block: each section's table from the eval JSONs the record names (in `folder`), then the machine
    they ran on."""
    def read(name: str) -> dict:
        return json.loads((folder / name).read_text(encoding="utf-8"))

    lines = []
    for section in record["sections"]:
        kind, drafters = section["section"], section["drafters"]
        if kind == "gammas":
            lines += gammas_table(drafters, read)
        elif kind == "curve":
            lines += curve_table(drafters, read)
        else:
            lines += single_table(kind, drafters, read)
    lines += [f"Machine: {record['machine']}; load average at the end {record['load_average']}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.doc:
        check_doc(args.doc, "bench_real_target")

    # ---- the record: measured into --out, or read back (--from-json) ----
    if args.from_json:
        record, folder = json.loads(args.from_json.read_text(encoding="utf-8")), args.from_json.parent
    else:
        if args.target is None:
            from decode.inputs.gguf import smollm2_gguf

            args.target = str(smollm2_gguf())
        sections = measure(args, drafters_of(args.drafter))
        record = {"machine": machine("cpu"), "load_average": load_average(), "sections": sections}
        folder = args.out
        folder.mkdir(parents=True, exist_ok=True)
        (folder / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    # ---- the tables ----
    text = doc_text(record, folder)
    print(text)
    if args.doc:
        write_doc(args.doc, text, "bench_real_target")


if __name__ == "__main__":
    main()
