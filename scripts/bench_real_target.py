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
Every eval is reused from --out when its JSON is there (delete it to measure again). --doc writes the tables into a
new file, or into a page between its lines `<!-- BEGIN bench_real_target (scripts/bench_real_target.py --doc) -->` and
`<!-- END bench_real_target -->` (docs/benchmarks/real_target.md has them); a page without them stops the script
before it measures anything.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from decode.measure.table import markdown_table
from scripts.benchmark import check_doc, load_average, machine, write_doc

PROMPTS = ROOT / "recipes" / "prompts" / "chat_eval.jsonl"
SECTIONS = ("gammas", "sampled", "compiled", "curve")


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
    return p.parse_args(argv)


def drafters(specs: list[str]) -> dict[str, str]:
    """NAME=FOLDER (or prompt_lookup) -> {name: the --draft value}."""
    return {spec.split("=", 1)[0]: (spec.split("=", 1)[1] if "=" in spec else "prompt-lookup") for spec in specs}


def evaluate(args: argparse.Namespace, name: str, draft: str, *extra: str, prompts: int) -> dict:
    """One specdistill-eval run (reused from --out): its report."""
    from specdistill.cli.eval import main as eval_main

    result = args.out / f"{name}.json"
    if not result.is_file():
        args.out.mkdir(parents=True, exist_ok=True)
        eval_main(["--target", args.target, "--draft", draft, "--prompts", str(PROMPTS), "--chat-template", "on",
                   "--num-prompts", str(prompts), "--max-new-tokens", str(args.max_new_tokens), "--stop-at-eos",
                   "--quiet", "--output", str(result), *extra])
    return json.loads(result.read_text())


def overall(report: dict, key: str = "results") -> list[dict]:
    return [r for r in report.get(key, []) if r.get("category") in (None, "all")]


def row_cells(name: str, r: dict, vllm_tau: float | None = None) -> list[str]:
    cells = [name, str(r["num_prompts"]), str(r["gamma"]), f"{r['temperature']:g}", f"{r['acceptance_rate']:.3f}",
             f"{r['mean_accepted_tokens']:.2f}", f"{r['draft_cost_ratio']:.3f}", f"{r['verify_cost_ratio']:.2f}",
             f"{r['target_tokens_per_s']:.1f}", f"{r['speculative_tokens_per_s']:.1f}", f"{r['speedup']:.2f}x",
             f"{r['predicted_speedup']:.2f}x"]
    return cells + ([f"{vllm_tau:.2f}" if vllm_tau is not None else "-"] if vllm_tau is not False else [])


HEADERS = ["drafter", "prompts", "gamma", "T", "acceptance", "tau", "c", "v", "plain tok/s", "spec tok/s", "speedup",
           "predicted"]


def gammas_section(args: argparse.Namespace, chosen: dict[str, str]) -> list[str]:
    rows = []
    for name, draft in chosen.items():
        report = evaluate(args, f"{name}_gammas", draft, "--gamma", *args.gammas, prompts=args.prompts)
        vllm = {}
        if args.vllm:
            both = evaluate(args, f"{name}_vllm", draft, "--gamma", "4", "--engine", "both", prompts=args.prompts)
            vllm = {r["gamma"]: r["mean_accepted_tokens"] for r in overall(both, "vllm_results")}
        rows += [row_cells(name, r, vllm.get(r["gamma"]) if args.vllm else False) for r in overall(report)]
    headers = HEADERS + (["tau (vLLM)"] if args.vllm else [])
    return [f"### Gamma {', '.join(args.gammas)}, greedy, eager ({args.prompts} prompts)", "",
            *markdown_table(headers, rows), ""]


def single_section(args: argparse.Namespace, chosen: dict[str, str], section: str) -> list[str]:
    extra = {"sampled": ["--temperature", "1.0"], "compiled": ["--compile"]}[section]
    title = {"sampled": "Temperature 1, gamma 4, eager", "compiled": "Compiled (static cache), gamma 4, greedy"}
    rows = [row_cells(name, r, False) for name, draft in chosen.items()
            for r in overall(evaluate(args, f"{name}_{section}", draft, "--gamma", "4", *extra,
                                      prompts=args.short_prompts))]
    return [f"### {title[section]} ({args.short_prompts} prompts)", "", *markdown_table(HEADERS, rows), ""]


def curve_section(args: argparse.Namespace, heads: dict[str, str]) -> list[str]:
    rows = []
    for size, folder in sorted(heads.items(), key=lambda kv: int(kv[0])):
        (r,) = [r for r in overall(evaluate(args, f"curve_{size}", folder, "--gamma", "4",
                                            prompts=args.short_prompts))]
        rows.append([size, f"{r['acceptance_rate']:.3f}", f"{r['mean_accepted_tokens']:.2f}",
                     " / ".join(f"{a:.2f}" for a in r["per_position_acceptance"]), f"{r['speedup']:.2f}x"])
    return [f"### tau against training prompts (gamma 4, greedy, {args.short_prompts} prompts)", "",
            *markdown_table(["training prompts", "acceptance", "tau", "per-position acceptance", "speedup"], rows), ""]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.doc:
        check_doc(args.doc, "bench_real_target")
    if args.target is None:
        from decode.inputs.gguf import smollm2_gguf

        args.target = str(smollm2_gguf())
    chosen = drafters(args.drafter)
    lines = []
    for section in args.sections:
        if section == "gammas":
            lines += gammas_section(args, chosen)
        elif section == "curve" and args.curve:
            lines += curve_section(args, drafters(args.curve))
        elif section in ("sampled", "compiled"):
            lines += single_section(args, chosen, section)
    lines += [f"Machine: {machine('cpu')}; load average at the end {load_average()}.", ""]
    text = "\n".join(lines)
    print(text)
    if args.doc:
        write_doc(args.doc, text, "bench_real_target")


if __name__ == "__main__":
    main()
