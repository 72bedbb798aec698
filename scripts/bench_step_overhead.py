"""Benchmark: the decoder's own work in a speculative round, on a pair where nothing else can hide it.

    .venv/bin/python scripts/bench_step_overhead.py                                  # CPU, eager and compiled
    .venv/bin/python scripts/bench_step_overhead.py --device cuda --dtype bfloat16   # a GPU (CUDA graphs compiled)
    .venv/bin/python scripts/bench_step_overhead.py --json docs/benchmarks/step_overhead/cpu.json \
        --doc docs/benchmarks/decode.md --plot docs/benchmarks/step_overhead/cpu.png   # the page's table and plot

The pair is host-bound on purpose: a random Llama (2 layers, width 64, a 4096-token vocabulary) drafting for itself,
greedy, so every draft token is accepted (tau = gamma + 1) and a (gamma + 1)-token verify pass costs about what a
1-token step costs. A round is then gamma + 1 forwards for gamma + 1 tokens, as many as plain decoding needs, and a
decoder with no work of its own runs 1.0x: whatever a row falls short of that is the decoder's (or the machine's, when
a longer pass costs more than a 1-token one: the split says which).

Eager on a CPU, the linear layers multiply by oneDNN-packed weights as ``specdistill-eval --cpu-linear auto`` does
(decode.loop.packed_linear). Per path (eager, compiled) it prints, from one run:
  * speculative / plain tokens/s from the project's eval (decode.measure.evaluate: side by side, per-prompt medians),
    c and v (decode.measure.cost_model) and host reads per verify pass (decode.loop.stats.SpecStats.host_reads);
  * one round's time split (decode.loop.timing.StepClock.split, medians over every full round of --repeats clocked
    generations per prompt, each beside plain generations of that prompt) into drafting, the verify pass and the
    decoder's own work, each in plain decoding steps, the speedup of those same runs, and the speedup a decoder with
    no own work would reach with these forwards: tau / (drafting + verify pass).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python scripts/bench_step_overhead.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from decode.inputs.command_line import CPU_LINEAR_MODES
from decode.inputs.loading import resolve_device, resolve_dtype
from decode.loop.packed_linear import pack_linears, tune_plain_rows
from decode.loop.speculative import autoregressive_generate
from decode.loop.static import cached_lm
from decode.loop.timing import StepClock, timed_call
from decode.measure.settings import EvalSettings
from scripts import benchmark
from specdistill.drafts import evaluate_acceptance, speculative_generate

SCRIPT = "bench_step_overhead"
CODE = ["decode/loop/speculative.py", "decode/loop/cache.py", "decode/loop/static.py",
        "kinds/standalone/drafter.py"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=48)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=5, help="timed runs per prompt, alternating speculative / plain")
    p.add_argument("--paths", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    p.add_argument("--cpu-linear", default="auto", choices=CPU_LINEAR_MODES,
                   help="eager on CPU, as specdistill-eval: oneDNN-packed weights (tuned per token count with auto)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--json", type=Path, help="write the raw results here")
    p.add_argument("--doc", type=Path, help="write the table into this page between the script's markers")
    p.add_argument("--from-json", type=Path, help="measure nothing: the table (and plot) of this JSON")
    p.add_argument("--plot", type=Path, help="write the round split as a PNG here (matplotlib)")
    return p.parse_args(argv)


def host_bound_pair(args: argparse.Namespace, device: torch.device, dtype: torch.dtype):
    """The random Llama (it drafts for itself) and the prompts: random ids, fixed seeds."""
    model = benchmark.random_llama(args.hidden, args.layers, seed=0, vocab=args.vocab).eval().to(device, dtype)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, args.vocab, (args.prompt_len,), generator=g) for _ in range(args.num_prompts)]
    return model, prompts


def round_split(model, prompts: list[torch.Tensor], gamma: int, new_tokens: int, compile: bool,
                repeats: int) -> dict:
    """One round's drafting, verify pass and own work in plain decoding steps (medians over every full round), from
    ``repeats`` clocked speculative generations per prompt, each beside plain generations of the same prompt (of
    ``new_tokens`` and of 1 token: a plain step is their difference per token, the prefill cancels). Also the
    speedup of those same runs (summed plain seconds / summed speculative seconds) and the one a decoder without own
    work would reach: tau / (draft + verify)."""
    device = next(model.parameters()).device
    rounds, per_token, tau, spec_s, plain_s = [], [], [], 0.0, 0.0
    for _ in range(repeats):
        for prompt in prompts:
            prompt = prompt.view(1, -1).to(device)
            clock = StepClock(device)
            out, seconds = timed_call(lambda: speculative_generate(model, model, prompt, max_new_tokens=new_tokens,
                                                                   gamma=gamma, clock=clock, compile=compile),
                                      device)
            spec_s += seconds
            rounds += clock.split(gamma)
            tau.append(out.stats.mean_accepted_tokens)
            _, seconds = timed_call(lambda: autoregressive_generate(model, prompt, max_new_tokens=new_tokens,
                                                                    compile=compile), device)
            plain_s += seconds
            _, first = timed_call(lambda: autoregressive_generate(model, prompt, max_new_tokens=1, compile=compile),
                                  device)
            per_token.append((seconds - first) / (new_tokens - 1))  # the prefill and the first token cancel
    step = statistics.median(per_token)
    draft, verify, own = (statistics.median(r[i] for r in rounds) / step for i in range(3))
    tau = statistics.mean(tau)
    return {"rounds": len(rounds), "plain_step_s": step, "draft_steps": draft, "verify_steps": verify,
            "own_steps": own, "tau": tau, "speedup": plain_s / spec_s, "without_own_work": tau / (draft + verify),
            "from_split": tau / (draft + verify + own)}


@torch.inference_mode()
def forward_costs(model, prompt: torch.Tensor, gamma: int, compile: bool, repeats: int = 200) -> dict[int, float]:
    """What a forward of T tokens costs, in 1-token forwards, for T = 1 (a plain or draft step), 2 (a drafter's
    catch-up after a round that kept every draft) and gamma + 1 (the verify pass): medians of ``repeats`` forwards
    of the decoder's own cache (decode.loop.static.cached_lm) after the prompt, each rolled back, all logits read
    out as the verify pass does. These bound any decoder: a round of accepted drafts costs at least
    (gamma - 1) + cost(2) + cost(gamma + 1) 1-token forwards for its gamma + 1 tokens."""
    device = next(model.parameters()).device
    sizes = sorted({1, 2, gamma + 1})
    lm = cached_lm(model, compile, "target", prompt.numel() + gamma + 2, tuple(sizes))
    lm.forward(prompt.view(1, -1).to(device), last_only=True)
    medians = {}
    for size in sizes:
        tokens = prompt[:size].view(1, -1).to(device)
        times = []
        for _ in range(repeats):
            times.append(timed_call(lambda: lm.forward(tokens), device)[1])  # noqa: B023 (called at once)
            lm.rollback(size)
        medians[size] = statistics.median(times)
    return {size: medians[size] / medians[1] for size in sizes}


def forward_bound(costs: dict[int, float], gamma: int, tau: float) -> float:
    """The speedup of an eager decoder with no work of its own whose every draft is accepted, from the forwards alone:
    tau / ((gamma - 1) + cost(2) + cost(gamma + 1)) (a plain step costs one 1-token forward)."""
    return tau / ((gamma - 1) + costs[2] + costs[gamma + 1])


def measure(args: argparse.Namespace) -> dict:
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    model, prompts = host_bound_pair(args, device, dtype)
    linear = "plain"
    if device.type == "cpu" and args.cpu_linear != "plain" and pack_linears(model):  # as specdistill-eval does
        plain_rows = tune_plain_rows(model, range(1, args.gamma + 2)) if args.cpu_linear == "auto" else ()
        linear = f"packed (F.linear at {sorted(plain_rows)} tokens)" if plain_rows else "packed"
    rows = []
    for path in args.paths:
        compile = path == "compiled"
        settings = EvalSettings(gammas=[args.gamma], max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                                compile=compile)
        [result] = evaluate_acceptance(model, model, prompts, settings, progress=False)
        split = round_split(model, prompts, args.gamma, args.max_new_tokens, compile, args.repeats)
        costs = forward_costs(model, prompts[0], args.gamma, compile)
        split["forward_costs"] = {str(size): cost for size, cost in costs.items()}
        split["forward_bound"] = forward_bound(costs, args.gamma, split["tau"])
        rows.append({"path": path, "result": result, "split": split})
        print(f"{path}: speculative/plain {result['speedup']:.3f}x, tau {result['mean_accepted_tokens']:.2f}, "
              f"host reads per step {result['host_reads_per_step']:.2f}; clocked runs {split['speedup']:.3f}x, round = "
              f"draft {split['draft_steps']:.2f} + verify {split['verify_steps']:.2f} + own work "
              f"{split['own_steps']:.2f} plain steps; without own work {split['without_own_work']:.3f}x; forwards of "
              f"{', '.join(split['forward_costs'])} tokens cost {', '.join(f'{c:.2f}' for c in costs.values())} "
              f"1-token forwards: at most {split['forward_bound']:.3f}x", flush=True)
    pair = (f"random Llama {args.hidden}x{args.layers} (vocab {args.vocab}) drafting for itself, "
            f"{args.num_prompts} prompts of {args.prompt_len} tokens, {args.max_new_tokens} new, greedy")
    return {"pair": pair, "machine": benchmark.machine(device.type), "dtype": str(dtype).replace("torch.", ""),
            "cpu_linear": linear,
            "gamma": args.gamma, "command": benchmark.command_line(__file__), "rows": rows}


def table(report: dict) -> str:
    """The page's block: what ran where, and one row per path."""
    headers = ["path", "gamma", "tau", "host reads / step", "plain tok/s", "speculative tok/s", "speedup", "c", "v",
               "clocked runs", "draft", "verify", "own work", "without own work",
               f"2 / {report['gamma'] + 1}-token forward", "forwards alone"]
    body = []
    for row in report["rows"]:
        r, s = row["result"], row["split"]
        body.append([row["path"], r["gamma"], f"{r['mean_accepted_tokens']:.2f}", f"{r['host_reads_per_step']:.2f}",
                     f"{r['target_tokens_per_s']:.0f}", f"{r['speculative_tokens_per_s']:.0f}",
                     f"**{r['speedup']:.2f}x**", f"{r['draft_cost_ratio']:.2f}", f"{r['verify_cost_ratio']:.2f}",
                     f"{s['speedup']:.2f}x", f"{s['draft_steps']:.2f}", f"{s['verify_steps']:.2f}",
                     f"{s['own_steps']:.2f}", f"{s['without_own_work']:.2f}x",
                     *forward_cells(s, report["gamma"], row["path"])])
    lines = [f"Pair: {report['pair']}; {report['dtype']}; eager linear layers {report['cpu_linear']}.", "",
             f"Machine: {report['machine']}.", "",
             f"Command: `{report['command']}`", "", *benchmark.markdown_table(headers, body), "",
             "speedup, c, v: the project's eval (decode.measure.evaluate); clocked runs: the speedup of the runs the "
             "split comes from; draft, verify and own work: one full round's drafting, verify pass and the decoder's "
             "own work, in plain decoding steps (medians); without own work: tau / (draft + verify); "
             f"2 / {report['gamma'] + 1}-token forward: what a drafter's 2-token catch-up and the verify pass cost "
             "alone, in 1-token forwards; forwards alone: "
             "the most an eager decoder reaches with these forwards, tau / ((gamma - 1) + both).", ""]
    return "\n".join(lines)


def forward_cells(split: dict, gamma: int, path: str) -> list[str]:
    """The 2-token and (gamma + 1)-token forward costs and, eager, the forward-only bound ("-" for a record without
    them; compiled greedy rounds chain their draft steps into one call, which the bound does not count)."""
    costs = split.get("forward_costs")
    if not costs:
        return ["-", "-"]
    bound = f"{split['forward_bound']:.2f}x" if path == "eager" else "-"
    return [f"{costs['2']:.2f} / {costs[str(gamma + 1)]:.2f}", bound]


def plot(report: dict, path: Path) -> None:
    """One stacked bar per path: a round's drafting, verify pass and own work in plain decoding steps, beside the
    tau plain steps the round's tokens cost plain decoding (the bar a 1.0x decoder matches)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.0), dpi=100, layout="tight")
    ax = fig.add_subplot()
    names = [row["path"] for row in report["rows"]]
    bottom = [0.0] * len(names)
    for part, colour in (("draft_steps", "#4c72b0"), ("verify_steps", "#dd8452"), ("own_steps", "#c44e52")):
        heights = [row["split"][part] for row in report["rows"]]
        ax.bar(names, heights, bottom=bottom, width=0.5, color=colour, label=part.replace("_steps", "").replace(
            "own", "decoder's own work").replace("verify", "verify pass").replace("draft", "drafting"))
        bottom = [b + h for b, h in zip(bottom, heights)]
    for x, row in enumerate(report["rows"]):
        tau = row["split"]["tau"]
        ax.hlines(tau, x - 0.35, x + 0.35, colors="black", linestyles="dashed")
        ax.text(x, bottom[x] + 0.05, f"{row['split']['speedup']:.2f}x plain", ha="center", va="bottom")
    ax.set(ylabel="plain decoding steps per round", title=f"A round at gamma {report['gamma']}; dashed: tau = "
           f"{report['rows'][0]['split']['tau']:.1f}, plain decoding's cost", ylim=(0, 6.8))
    ax.legend(loc="lower right")
    ax.grid(axis="y", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.doc:
        benchmark.check_doc(args.doc, SCRIPT)
    if args.from_json:
        report = json.loads(args.from_json.read_text())
    else:
        report = measure(args)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2) + "\n")
    text = table(report)
    print(text)
    if args.plot:
        plot(report, args.plot)
    if args.doc:
        benchmark.write_doc(args.doc, text, SCRIPT)
    return report


if __name__ == "__main__":
    main()
