"""This checkout's decoder against an earlier git revision's: the same target, drafters and prompts, one run.

    .venv/bin/python scripts/bench_revisions.py --before main      # SmolLM2, the quickstart's head and prompt lookup,
                                                                   # 8 prompts at gamma 2 and 4: ~16 min on 2 cores
    .venv/bin/python scripts/bench_revisions.py --before HEAD~3 --drafter head=outputs/run/best \
        --drafter prompt-lookup --gammas 2 4 --num-prompts 96 --json revisions.json

`git archive` writes the revision's files into --out/<sha>; each revision's own `specdistill-eval` (the module its
pyproject names) then measures every drafter on the same prompts, greedy, in alternating order (before, after; then
after, before; ...: --rounds) so that drift of the machine's speed falls on both alike. Per drafter and gamma the
table holds both revisions' tau (equal unless the change altered what is decoded), their speculative tokens/s and
speedup over plain decoding (medians over the rounds), and after / before: > 1 is faster now. Greedy output equal to
plain decoding is checked by both. --json keeps the record, --doc writes the block between a page's
`bench_revisions` markers, --from-json writes it again from a record, measuring nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python scripts/bench_revisions.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decode.inputs.gguf import smollm2_gguf
from scripts.benchmark import ROOT, block_options, load_average, machine, markdown_table, record_block

SCRIPT = "bench_revisions"

EVAL_ENTRY = re.compile(r'^specdistill-eval\s*=\s*"([\w.]+):(\w+)"', re.MULTILINE)


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout.strip()


def revision_tree(revision: str, out: Path) -> tuple[str, Path]:
    """(the revision's full sha, a folder holding its files): `git archive` into out/<sha>, kept for a next run.
    Stops with one line when git does not know the revision."""
    try:
        sha = git("rev-parse", "--verify", f"{revision}^{{commit}}")
    except subprocess.CalledProcessError:
        sys.exit(f"{SCRIPT}: git knows no revision {revision!r} in {ROOT} (a shallow clone lacks older ones: "
                 "git fetch --unshallow)")
    tree = out / sha
    if not (tree / "pyproject.toml").is_file():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return sha, tree


def eval_command(tree: Path) -> list[str]:
    """The python command that runs `tree`'s own specdistill-eval (its pyproject's entry point)."""
    entry = EVAL_ENTRY.search((tree / "pyproject.toml").read_text(encoding="utf-8"))
    if entry is None:
        sys.exit(f"{SCRIPT}: {tree / 'pyproject.toml'} names no specdistill-eval entry point")
    module, function = entry.groups()
    return [sys.executable, "-c", f"import sys; sys.argv[0] = 'specdistill-eval'; from {module} import {function}; "
                                  f"sys.exit({function}())"]


def drafters(specs: list[str]) -> dict[str, str]:
    """--drafter NAME=DRAFT (or a bare DRAFT, named by itself) -> {name: draft}: a folder that exists as its absolute
    path (each revision's eval runs from its own folder), anything else (prompt-lookup, a hub id) as given, for
    specdistill-eval to read or refuse."""
    named = {}
    for spec in specs:
        name, _, draft = spec.partition("=") if "=" in spec else (Path(spec).name, "", spec)
        named[name] = str(Path(draft).resolve()) if Path(draft).exists() else draft
    return named


def evaluate(tree: Path, drafter: str, args, output: Path) -> dict:
    """One revision's specdistill-eval JSON for one drafter at every gamma (run with the revision's files first on
    the path, from its folder)."""
    command = eval_command(tree) + [
        "--target", args.target, "--draft", drafter, "--prompts", args.prompts, "--chat-template", args.chat_template,
        "--num-prompts", str(args.num_prompts), "--max-new-tokens", str(args.max_new_tokens),
        "--gamma", *map(str, args.gammas), "--output", str(output)]
    environment = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(command, cwd=tree, env=environment, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(output.read_text(encoding="utf-8"))


def measure(args) -> dict:
    """The record: both revisions, the drafters, and per (drafter, revision) every round's results per gamma."""
    out = Path(args.out).resolve()
    trees = {"before": revision_tree(args.before, out), "after": (git("rev-parse", "HEAD"), ROOT)}
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    runs: dict[str, dict[str, list]] = {name: {"before": [], "after": []} for name in args.drafters}
    for round_ in range(args.rounds):
        order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
        for name, drafter in args.drafters.items():
            for side in order:
                sha, tree = trees[side]
                result = evaluate(tree, drafter, args, out / f"{side}_{name}_{round_}.json")
                runs[name][side].append([{key: row[key] for key in (
                    "gamma", "mean_accepted_tokens", "acceptance_rate", "target_tokens_per_s",
                    "speculative_tokens_per_s", "speedup", "greedy_match")} for row in result["results"]])
                print(f"{side} ({sha[:10]}) {name} round {round_}: " + ", ".join(
                    f"gamma {row['gamma']} {row['speedup']:.2f}x" for row in result["results"]), flush=True)
    return {"before": {"revision": args.before, "sha": trees["before"][0]},
            "after": {"revision": "HEAD" + (" with uncommitted changes" if dirty else ""), "sha": trees["after"][0]},
            "target": Path(args.target).name, "prompts": Path(args.prompts).name, "num_prompts": args.num_prompts,
            "max_new_tokens": args.max_new_tokens, "rounds": args.rounds, "drafters": list(args.drafters),
            "machine": machine("cpu"), "load_average": load_average(), "runs": runs}


def median_row(rounds: list[list[dict]], gamma: int) -> dict:
    """One revision's results at `gamma`, medians over the rounds (tau and greedy match are deterministic)."""
    rows = [row for results in rounds for row in results if row["gamma"] == gamma]
    middle = {key: statistics.median(row[key] for row in rows)
              for key in ("target_tokens_per_s", "speculative_tokens_per_s", "speedup")}
    return {**middle, "tau": rows[0]["mean_accepted_tokens"], "greedy": min(row["greedy_match"] for row in rows)}


def render(record: dict) -> str:
    """The block: what was compared, on what, and one row per (drafter, gamma)."""
    rows = []
    for name in record["drafters"]:
        sides = record["runs"][name]
        for gamma in sorted({row["gamma"] for results in sides["after"] for row in results}):
            before, after = median_row(sides["before"], gamma), median_row(sides["after"], gamma)
            rows.append([name, gamma, f"{before['tau']:.3f}", f"{after['tau']:.3f}",
                         f"{before['speculative_tokens_per_s']:.1f} / {after['speculative_tokens_per_s']:.1f}",
                         f"{after['speculative_tokens_per_s'] / before['speculative_tokens_per_s']:.2f}x",
                         f"{before['speedup']:.2f}x / {after['speedup']:.2f}x",
                         "yes" if before["greedy"] == after["greedy"] == 1.0 else "NO"])
    before, after = record["before"], record["after"]
    return "\n".join([
        f"Before: `{before['revision']}` ({before['sha'][:10]}); after: {after['revision']} ({after['sha'][:10]}). "
        f"Target {record['target']}, the first {record['num_prompts']} prompts of {record['prompts']} x "
        f"{record['max_new_tokens']} new tokens, greedy, eager; medians of {record['rounds']} rounds in alternating "
        "order.", "",
        f"Machine: {record['machine']}; load average at the end {record['load_average']}.", "",
        *markdown_table(["drafter", "gamma", "tau before", "tau after", "spec tok/s before / after", "after / before",
                        "speedup before / after", "greedy = plain"], rows),
        "", "spec tok/s: speculative tokens/s; speedup: over plain decoding measured in the same eval; "
            "after / before > 1: faster now.", ""])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="HEAD", help="the git revision to compare this checkout's decoder with")
    parser.add_argument("--target", default=None, help="target model (default: SmolLM2-135M-Instruct's GGUF)")
    parser.add_argument("--drafter", action="append", default=None,
                        help="NAME=PATH of a draft or head folder, or prompt-lookup; repeat for several "
                             "(default: head=quickstart_out/head and prompt-lookup)")
    parser.add_argument("--prompts", default=str(ROOT / "recipes/prompts/chat_eval.jsonl"))
    parser.add_argument("--chat-template", choices=["auto", "on", "off"], default="on")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gammas", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=2, help="each revision measured this many times, alternating")
    parser.add_argument("--out", type=Path, default=Path("bench_revisions_out"),
                        help="the revisions' files and every eval's JSON")
    block_options(parser, SCRIPT)
    args = parser.parse_args(argv)
    if not args.from_json:
        args.target = str(Path(args.target).resolve()) if args.target else str(smollm2_gguf())
        args.prompts = str(Path(args.prompts).resolve())
        args.drafters = drafters(args.drafter or [f"head={ROOT / 'quickstart_out/head'}", "prompt-lookup"])
    record_block(args, lambda: measure(args), render, SCRIPT)


if __name__ == "__main__":
    main()
