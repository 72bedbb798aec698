"""Sampled decoding: the decoder's draw (decode.loop.sampling.draw, the inverse CDF) against torch.multinomial.

    .venv/bin/python scripts/bench_sampling.py                         # SmolLM2 (the GGUF make install brings), ~4 min
    .venv/bin/python scripts/bench_sampling.py --target FOLDER --batch-sizes 1 64 --new-tokens 32
    .venv/bin/python scripts/bench_sampling.py --json docs/benchmarks/decode/sampling.json \
        --doc docs/benchmarks/decode.md

torch.multinomial draws a random number per vocabulary entry at every drawn token; draw() draws one per row. Both are
timed on the code that samples: batched_generate (decode.loop.batched, what Magpie prompt writing, sampled target
responses and on-policy rows run) at each batch size (1: a single sequence). Every row
generates exactly --new-tokens tokens at temperature 1 (no eos), its prompt a distinct handful of token ids. The two
draws alternate, --repeats timed runs each after an untimed warm-up, medians; the ratio is measured in this one run.
Prints a markdown table and the machine; --json keeps the record, --doc writes the table between the page's
`bench_sampling` markers, --from-json writes it again from a record, measuring nothing.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # `python scripts/bench_sampling.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import decode.loop.sampling as sampling
from decode.inputs.gguf import smollm2_gguf
from decode.inputs.loading import load_causal_lm
from decode.loop.batched import batched_generate
from scripts import benchmark
from scripts.benchmark import markdown_table

SCRIPT = "bench_sampling"

FILES = ("decode/loop/sampling.py", "decode/loop/batched.py")


def multinomial_draw(probs: torch.Tensor, cfg: sampling.SamplingConfig, generator) -> torch.Tensor:
    """The reference: torch.multinomial, as the decoder drew before the inverse CDF."""
    if cfg.greedy:
        return probs.argmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


DRAWS = {"torch.multinomial": multinomial_draw, "inverse CDF (draw)": sampling.draw}


def generate_seconds(model, rows: int, new_tokens: int) -> float:
    vocab = model.config.vocab_size
    prompts = [[(100 + 7 * i + j) % vocab for j in range(8 + i % 7)] for i in range(rows)]
    start = time.perf_counter()
    out = batched_generate(model, prompts, max_new_tokens=new_tokens, sampling=sampling.SamplingConfig(1.0),
                           seeds=list(range(rows)), eos_token_id=None, pad_token_id=0)
    seconds = time.perf_counter() - start
    assert all(len(tokens) == new_tokens for tokens in out)
    return seconds


def measure(model, rows: int, new_tokens: int, repeats: int) -> dict[str, float]:
    """Median seconds of each draw at one batch size, the draws alternating (decode.loop.sampling.draw swapped)."""
    seconds: dict[str, list[float]] = {name: [] for name in DRAWS}
    try:
        for repeat in range(repeats + 1):
            for name, draw in DRAWS.items():
                sampling.draw = draw
                elapsed = generate_seconds(model, rows, new_tokens)
                if repeat:  # the first round warms up
                    seconds[name].append(elapsed)
    finally:
        sampling.draw = DRAWS["inverse CDF (draw)"]
    return {name: statistics.median(values) for name, values in seconds.items()}


def measure_all(args) -> dict:
    """The record: per batch size the tokens/s of both draws, and the machine they ran on."""
    model = load_causal_lm(args.target or str(smollm2_gguf()), torch.device("cpu"), torch.float32)
    rows_out = []
    for rows in args.batch_sizes:
        seconds = measure(model, rows, args.new_tokens, args.repeats)
        tokens = rows * args.new_tokens
        rows_out.append({"rows": rows, **{f"tokens_per_s {name}": tokens / s for name, s in seconds.items()}})
    return {"target": args.target or "SmolLM2-135M-Instruct (GGUF)", "new_tokens": args.new_tokens,
            "repeats": args.repeats, "machine": benchmark.machine("cpu"),
            "code": benchmark.code_version(FILES), "rows": rows_out}


def render(record: dict) -> str:
    """The page's block: the table, then the machine."""
    table = []
    for row in record["rows"]:
        old, new = row["tokens_per_s torch.multinomial"], row["tokens_per_s inverse CDF (draw)"]
        table.append([row["rows"], f"{old:.1f}", f"{new:.1f}", f"{new / old:.2f}x"])
    lines = markdown_table(["rows at once", "tokens/s, torch.multinomial", "tokens/s, inverse CDF", "ratio"], table)
    return "\n".join([*lines, "", f"Machine: {record['machine']}.", ""])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="model folder or .gguf (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32, 128])
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    benchmark.block_options(parser, SCRIPT)
    args = parser.parse_args(argv)
    benchmark.record_block(args, lambda: measure_all(args), render, SCRIPT)


if __name__ == "__main__":
    main()
