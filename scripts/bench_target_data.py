"""Target responses: rows/s of today's batch-1 decoder vs batched generation (data.target_batch_size).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_target_data.py             # ~1 min CPU time
    .venv/bin/python scripts/bench_target_data.py --device cuda --rows 512 --batch-sizes 1 16 64 128

The target is a Llama built from a config with RANDOM weights (hidden 256, 6 layers, vocab 4096, float32; the
lm_head sharpened x16 so that its distributions look like a trained LM's): rows/s depends on the shapes, not on
what the weights learnt. The prompts are --rows random-token prompts of 8..64 tokens (different lengths, so batches
are padded). The tokenizer has no eos, so every response is exactly --new-tokens tokens.
Each mode runs distill.data.target_data.generate_target_data, the call a training run makes (shards written with
`datasets`), into its own temporary folder, after an untimed warm-up batch; all modes run in this one process, one
after the other, so the ratios are measured in one run. Wall and CPU seconds are both reported: on cores shared
with other jobs the wall clock mostly measures the others (and OpenMP threads waiting for a descheduled sibling
burn CPU: use OMP_NUM_THREADS=1 there). Greedy rows of every batch size are checked against the
batch-1 rows. Prints the table with the machine and the run's settings; --json keeps the record it is written from,
--doc writes it between docs/benchmarks/serving.md's `bench_target_data` markers, --from-json writes it again from a
record, measuring nothing:

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_target_data.py --json docs/benchmarks/serving/target_data.json \
        --doc docs/benchmarks/serving.md
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # `python scripts/bench_target_data.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import datasets
import torch
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from distill.data.target_data import generate_target_data
from scripts.benchmark import (
    block_options,
    code_version,
    load_average,
    machine,
    markdown_table,
    random_llama,
    record_block,
    sharpen,
)

SCRIPT = "bench_target_data"
VOCAB = 4096
SHARPEN = 16.0
FILES = ("distill/data/target_data.py", "decode/loop/batched.py", "decode/loop/speculative.py")


def word_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """A tokenizer of `vocab` made-up words with a pad token and no eos (responses run to max_new_tokens)."""
    words = {"<pad>": 0, **{f"w{i}": i for i in range(1, vocab)}}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(words, unk_token="w1")),
                                   pad_token="<pad>")


def random_prompts(rows: int, seed: int, vocab: int) -> list[list[int]]:
    """Random-token prompts of 8..64 tokens."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 65, (rows,), generator=generator).tolist()
    return [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in lengths]


def measure(target, tokenizer, prompts: list[list[int]], batch_size: int, new_tokens: int,
            device: str) -> tuple[float, float, list[list[int]]]:
    """Wall seconds and CPU seconds (this process, all threads) to generate responses to every prompt at this batch
    size, and the responses. On shared cores the CPU seconds are the steadier measure."""
    settings = dict(max_new_tokens=new_tokens, temperature=0.0, batch_size=batch_size, progress=False)
    with tempfile.TemporaryDirectory(prefix="bench_target_data_") as work:
        generate_target_data(target, tokenizer, prompts[:batch_size], Path(work) / "warmup", **settings)
        if device == "cuda":
            torch.cuda.synchronize()
        started, cpu = time.perf_counter(), time.process_time()
        rows = generate_target_data(target, tokenizer, prompts, Path(work) / "timed", **settings)
        if device == "cuda":
            torch.cuda.synchronize()
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(f"batch {batch_size}: {wall:.1f} s wall, {cpu:.1f} CPU s", file=sys.stderr, flush=True)
    return wall, cpu, rows["response_ids"]


def measure_all(args: argparse.Namespace) -> dict:
    """The record: per batch size wall and CPU seconds and the rows equal to the first size's, the machine, settings."""
    target = sharpen(random_llama(hidden=256, layers=6, seed=0, vocab=VOCAB), SHARPEN).to(args.device).eval()
    tokenizer = word_tokenizer(VOCAB)
    prompts = random_prompts(args.rows, seed=0, vocab=VOCAB)
    load_before = load_average()
    results = {b: measure(target, tokenizer, prompts, b, args.new_tokens, args.device) for b in args.batch_sizes}
    base_rows = results[args.batch_sizes[0]][2]
    return {"machine": machine(args.device), "load_average": f"{load_before} / {load_average()}",
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "(unset)"), "code": code_version(FILES),
            "device": args.device, "rows": args.rows, "new_tokens": args.new_tokens,
            "runs": [{"batch_size": b, "wall_s": wall, "cpu_s": cpu,
                      "rows_equal_to_first": sum(r == x for r, x in zip(rows, base_rows))}
                     for b, (wall, cpu, rows) in results.items()]}


def render(record: dict) -> str:
    """The page's block from the record alone."""
    runs = record["runs"]
    base = runs[0]
    table = [["batch-1 decoder" if r["batch_size"] == 1 else "batched", r["batch_size"],
              f"{record['rows'] / r['wall_s']:.2f}", f"{base['wall_s'] / r['wall_s']:.2f}x",
              f"{record['rows'] / r['cpu_s']:.2f}", f"{base['cpu_s'] / r['cpu_s']:.2f}x",
              f"{r['rows_equal_to_first']}/{record['rows']}"] for r in runs]
    versus = f"vs batch {base['batch_size']}"
    headers = ["path", "data.target_batch_size", "rows/s (wall)", versus, "rows per CPU s", versus,
               "rows equal to the baseline's"]
    return "\n".join([
        f"Machine: {record['machine']}; OMP_NUM_THREADS={record['omp_num_threads']}; load average (1, 5, 15 min) "
        f"before / after: {record['load_average']}.", "",
        f"{record['rows']} random-token prompts of 8..64 tokens, {record['new_tokens']}-token greedy responses.", "",
        *markdown_table(headers, table)]) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--rows", type=int, default=64, help="prompts answered per mode")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens per response")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8, 16], help="the first is the baseline")
    block_options(parser, SCRIPT)
    args = parser.parse_args(argv)
    datasets.disable_progress_bars()
    record_block(args, lambda: measure_all(args), render, SCRIPT)


if __name__ == "__main__":
    main()
