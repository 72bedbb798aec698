"""The tables of scripts/bench_trainer.py (docs/benchmarks/trainer_vs_gkd.md), written from its records alone: one
block per loss (`bench_trainer_forward_kl`, `bench_trainer_jsd`) and the page's summary of both."""
from __future__ import annotations

import argparse

from scripts.benchmark import markdown_table

SCRIPT = "bench_trainer"


def gkd_beta(args: argparse.Namespace) -> float:
    """GKD's beta for our loss: TRL's generalized JSD is forward KL at beta=0 and uses the same beta otherwise."""
    return 0.0 if args.loss == "forward_kl" else args.beta


def best(runs: list[dict]) -> dict:
    """The fastest run of a mode (least disturbed by other work on shared cores)."""
    return max(runs, key=lambda r: r["tokens_per_s"])


def least(runs: list[dict], key: str) -> float:
    """Memory of a mode: the smallest over its runs (they differ only by noise)."""
    return min(r[key] for r in runs)


NAMES = {"gkd": "TRL GKDTrainer (lmbda=0)", "online": "DistillTrainer, online target",
         "cached": "DistillTrainer, cached top-k"}


def block_name(loss: str) -> str:
    """The page block a loss's table goes into: bench_trainer_forward_kl, bench_trainer_jsd."""
    return f"{SCRIPT}_{loss}"


def report(record: dict) -> str:
    """A loss's block from its record alone: the setup, the table, disturbed runs and the cache build."""
    args = argparse.Namespace(**record["settings"])
    runs, build = record["runs"], record["build"]
    divergence = "forward KL" if args.loss == "forward_kl" else f"JSD beta={args.beta}"
    rss = "peak RSS MiB" if args.device == "cpu" else "peak CUDA allocated MiB"
    rss_key = "peak_rss_mib" if args.device == "cpu" else "peak_cuda_mib"
    gkd_speed = best(runs["gkd"])["tokens_per_s"]
    gkd_tensor, gkd_rss = least(runs["gkd"], "tensor_peak_mib"), least(runs["gkd"], rss_key)
    lines = [
        f"Machine: {record['machine']}.", "",
        f"Setup: {args.rows} random-token rows of {args.seq_len} tokens; per-device batch {args.batch_size}; "
        f"{divergence} (GKD beta={gkd_beta(args)}, lmbda=0, seq_kd=False); {args.warmup} warm-up + {args.steps} "
        f"timed steps, then 1 memory-probe step; device {args.device}; cached: k={args.k}. {args.repeats} runs per "
        f"mode, modes alternated.",
        "",
    ]
    table = []
    for mode in runs:
        r, speeds = best(runs[mode]), sorted(x["tokens_per_s"] for x in runs[mode])
        tensor, resident, temporaries = (least(runs[mode], k) for k in
                                         ("tensor_peak_mib", "resident_mib", "step_peak_mib"))
        name = NAMES[mode].replace("top-k", f"top-{args.k}")
        table.append([name, f"{r['tokens_per_s']:.0f}", f"{speeds[0]:.0f}..{speeds[-1]:.0f}",
                      f"{r['total_tokens_per_s']:.0f}", f"{r['median_step_s']:.3f}", f"{r['cpu_s_per_step']:.2f}",
                      f"{tensor:.0f}", f"{resident:.0f}", f"{temporaries:.0f}", f"{least(runs[mode], rss_key):.0f}",
                      f"{r['tokens_per_s'] / gkd_speed:.2f}x", f"{tensor / gkd_tensor:.2f}x",
                      f"{least(runs[mode], rss_key) / gkd_rss:.2f}x"])
    lines += markdown_table(["mode", "tokens/s", "spread", "tokens/s, all steps", "median s/step", "CPU s/step",
                             "tensor peak MiB", "= weights+grads+optim", "+ step temporaries", rss,
                             "tokens/s vs GKD", "tensor peak vs GKD", f"{rss.split(' MiB')[0]} vs GKD"], table)
    disturbed = [f"{mode} run {i + 1}" for mode in runs for i, r in enumerate(runs[mode])
                 if max(r["step_s"]) > 2 * r["median_step_s"]]
    lines += ["", "- Runs with a step over twice their median (other work on the cores): "
              + (", ".join(disturbed) if disturbed else "none") + f". Load average at start/end: {record['load']}."]
    if build is not None:
        gkd_step_s = args.batch_size * args.seq_len / gkd_speed
        lines.append(
            f"- Cache build (before timing, not in the table): {build['build_s']:.1f} s for {build['rows']} rows / "
            f"{build['positions']} positions ({build['positions'] / build['build_s']:.0f} positions/s, the time of "
            f"{build['build_s'] / gkd_step_s:.1f} GKD steps); {build['bytes'] / 2 ** 20:.1f} MiB on disk; "
            f"top-{args.k} mass of the target {build['topk_mass']:.3f}.")
    return "\n".join(lines) + "\n"


def summary(records: list[dict]) -> str:
    """The page's opening table from the records of both losses: each mode of ours against GKD."""
    table = []
    for record in records:
        args = argparse.Namespace(**record["settings"])
        runs = record["runs"]
        divergence = "forward KL" if args.loss == "forward_kl" else f"JSD beta={args.beta}"
        gkd_speed, gkd_tensor = best(runs["gkd"])["tokens_per_s"], least(runs["gkd"], "tensor_peak_mib")
        for mode in [m for m in ("cached", "online") if m in runs]:
            name = "cached top-32 teacher" if mode == "cached" else "online teacher"
            table.append([divergence, name.replace("32", str(args.k)),
                          f"{best(runs[mode])['tokens_per_s'] / gkd_speed:.2f}x",
                          f"{least(runs[mode], 'tensor_peak_mib') / gkd_tensor:.2f}x"])
    return "\n".join(markdown_table(["loss", "mode", "tokens/s vs GKD", "tensor peak vs GKD"], table)) + "\n"
