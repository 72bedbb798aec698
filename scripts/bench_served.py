"""Served over HTTP (docs/benchmarks/served.md): SmolLM2-135M-Instruct behind `vllm serve`, alone and with each drafter,
loaded by GuideLLM at concurrency levels; one `specdistill bench-serve` run per drafter, its JSON and plot kept beside
the page, the page's table written from those JSONs.

    python scripts/bench_served.py --head quickstart_out/head --concurrency 1 2 4 --requests 8 \
        --out docs/benchmarks/served --doc docs/benchmarks/served.md

Each drafter's run is reused from --out when its JSON is there (delete it to measure again: the run adds the machine
and the load average at its end to it); --doc writes the table, all of it from those JSONs, between the page's
lines `<!-- BEGIN bench_served (scripts/bench_served.py --doc) -->` and `<!-- END bench_served -->`.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from decode.inputs.gguf import smollm2_gguf
from decode.measure.table import markdown_table
from scripts.benchmark import check_doc, load_average, machine, write_doc
from specdistill.cli import bench_serve

PROMPTS = ROOT / "recipes" / "prompts" / "chat_eval.jsonl"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default=None, help="default: the SmolLM2 GGUF that `make install` brings")
    p.add_argument("--head", type=Path, default=ROOT / "quickstart_out" / "head", help="an EAGLE-3 head folder")
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--requests", type=int, default=8, help="requests per level")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "served")
    p.add_argument("--doc", type=Path, default=None)
    return p.parse_args(argv)


def measure(args: argparse.Namespace, name: str, draft: str) -> dict:
    """bench-serve for one drafter (reused when its JSON exists), with the machine it ran on and the load average at
    its end added to its JSON."""
    out = args.out / f"{name}.json"
    if not out.is_file():
        bench_serve.main(["--target", args.target, "--draft", draft, "--prompts", str(PROMPTS), "--chat-template", "on",
                          "--num-prompts", str(args.num_prompts), "--max-tokens", str(args.max_tokens),
                          "--concurrency", *map(str, args.concurrency), "--requests", str(args.requests),
                          "--output", str(out), "--plot", str(args.out / f"{name}.png"),
                          "--log-dir", str(ROOT / "bench_served_logs" / name)])
        report = json.loads(out.read_text())
        report.update(machine=machine("cpu"), load_average=load_average())
        out.write_text(json.dumps(report, indent=2) + "\n")
    return json.loads(out.read_text())


def rows(reports: dict[str, dict]) -> list[list[str]]:
    table = []
    for name, report in reports.items():
        for level in report["levels"]:
            table.append([name, str(report["gamma"]), str(level["streams"]),
                          f"{level['plain_output_tokens_per_s']:.1f}",
                          f"{level['speculative_output_tokens_per_s']:.1f}",
                          f"{level['ratio']:.2f}x",
                          f"{level['plain_ttft_ms_p50']:.0f} / {level['speculative_ttft_ms_p50']:.0f}",
                          f"{level['plain_itl_ms_p50']:.1f} / {level['speculative_itl_ms_p50']:.1f}",
                          f"{level['plain_itl_ms_p99']:.1f} / {level['speculative_itl_ms_p99']:.1f}",
                          f"{report['tau']:.3f}" if report["tau"] else "-",
                          f"{report['greedy_equal']}/{report['greedy_checked']}"])
    return table


def main(argv: list[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through the blocks that stop the servers
    args = parse_args(argv)
    if args.doc:
        check_doc(args.doc, "bench_served")
    args.target = args.target or str(smollm2_gguf())
    args.out.mkdir(parents=True, exist_ok=True)
    reports = {"EAGLE-3 head": measure(args, "head", str(args.head)),
               "prompt lookup": measure(args, "lookup", "prompt-lookup")}
    first, last = next(iter(reports.values())), list(reports.values())[-1]
    headers = ["drafter", "gamma", "requests in flight", "plain tok/s", "spec tok/s", "spec / plain",
               "TTFT p50 plain / spec (ms)", "ITL p50 plain / spec (ms)", "ITL p99 plain / spec (ms)", "tau (server)",
               "greedy = plain"]
    text = "\n".join([
        f"Machine: {first['machine']}; load average at the end {last['load_average']}.",
        f"`vllm serve` ({' '.join(first['server_args'])}); {first['num_prompts']} held-out chat prompts "
        f"(`recipes/prompts/chat_eval.jsonl`, chat template), {first['max_tokens']} tokens per request "
        f"(ignore_eos), {first['requests_per_level']} requests per level, temperature "
        f"{first.get('temperature', 0.0):g} (greedy, as `specdistill eval`), GuideLLM over /v1/completions.", "",
        *markdown_table(headers, rows(reports))]) + "\n"
    print(text)
    if args.doc:
        write_doc(args.doc, text, "bench_served")


if __name__ == "__main__":
    main()
