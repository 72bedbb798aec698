"""What `specdistill-eval` prints: each engine's results table, by category, the tau parity table, and the device
the numbers were measured on; and whether vLLM's plain output is our target's (--engine both)."""
from __future__ import annotations

import argparse

import torch

from decode.measure.settings import EvalSettings
from decode.measure.table import format_table
from decode.measure.tally import category_rows
from decode.serving.parity import parity_columns
from decode.serving.vllm_engine import plain_outputs


def plain_match(response: dict, outputs: list[dict], settings: EvalSettings) -> float | None:
    """Greedy only: the share of prompts whose vLLM plain output is our target's (vLLM's prefill token, then our
    plain continuation): the model vLLM loaded computes what ours does."""
    if settings.temperature > 0:
        return None
    ours = {o["prompt_index"]: o["plain_ids"] for o in outputs}
    theirs = plain_outputs(response)
    return sum(theirs[i][1:] == ours[i] for i in ours) / len(ours)


def print_report(args: argparse.Namespace, report: dict) -> None:
    """The results table (each engine's with --engine both), categories, and the parity table."""
    engines = [("results", args.engine)] if args.engine != "both" else [("results", "specdistill"),
                                                                       ("vllm_results", "vllm")]
    for key, engine in engines:
        results = report[key]
        print((f"{engine}:\n" if args.engine == "both" else "") +
              format_table([{"drafter": report["draft"], **r} for r in results]))
        if any("by_category" in r for r in results):
            print(category_report(results, engine))
    if "parity" in report:
        parity = report["parity"]
        print(f"\ntau parity (tolerance {args.parity_tolerance}):\n" + format_table(parity, parity_columns(parity)))


# one vLLM generate call decodes every prompt: its tokens/s and speedup belong to the run, not to a category
RUN_TIMINGS = ("speedup", "target_tokens_per_s", "speculative_tokens_per_s")


def category_report(results: list[dict], engine: str) -> str:
    """The by-category table of an engine's results; vLLM's without the run's timings, which every category would
    repeat (the eval JSON keeps them, as documented)."""
    rows = category_rows(results)
    if engine != "vllm":
        return "\nby category:\n" + format_table(rows)
    rows = [{key: value for key, value in row.items() if key not in RUN_TIMINGS} for row in rows]
    return ("\nby category (counts only: one vLLM call times every prompt, so tokens/s and speedup are the run's):\n"
            + format_table(rows))


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
