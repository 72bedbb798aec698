"""Target responses on a real model: responses/s of our batched decoder, transformers' `generate` and vLLM at the
same batch sizes (what `specdistill-data responses` and `data.target_batch_size` run).

    .venv/bin/python scripts/bench_responses.py --batch-sizes 1 16 64 --engines specdistill transformers vllm \
        --json docs/benchmarks/responses/bench_responses.json --doc docs/benchmarks/responses.md

Ours runs on CPU with the target's linear layers oneDNN-packed (decode.loop.packed_linear), as
`specdistill-data` does; `specdistill-f.linear` is ours with them left on F.linear.
Prompts: the first rows of --prompts rendered with the target's chat template; batch size B answers
max(--min-rows, B) of them (batch 1 is slow on a CPU), greedy, at most --new-tokens tokens, stopping at eos. Each
engine and batch size runs after an untimed warm-up batch (vLLM: its own timer around `LLM.generate`, the
engine start excluded), one after the other in this run, so ratios are measured in one run on one machine.
"equal to ours" counts rows whose tokens equal our decoder's at the same batch size (float rounding of padded
shapes may break a near-tie, from where that row differs). --target defaults to SmolLM2's GGUF (`make install`).
The measurements go to a record (--json); the table, written from it, is printed and with --doc put between the
page's lines `<!-- BEGIN bench_responses (scripts/bench_responses.py --doc) -->` and `<!-- END bench_responses -->`;
`--from-json RECORD --doc PAGE` writes it again from a committed record, measuring nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python scripts/bench_responses.py`: make the repository importable
    sys.path.insert(0, str(ROOT))

import datasets
import torch

import distill.data.target_data as target_data
from decode.inputs.gguf import smollm2_gguf
from decode.inputs.loading import load_causal_lm, load_tokenizer
from decode.inputs.prompts import encode_prompt_rows, read_prompt_rows
from distill.data.target_data import Sampling, generate_target_data
from scripts.benchmark import (
    check_doc,
    code_version,
    command_line,
    load_average,
    machine,
    markdown_table,
    record_of,
    record_options,
    write_doc,
)

DOC_NAME = "bench_responses"
FILES = ("distill/data/target_data.py", "decode/loop/batched.py", "decode/loop/packed_linear.py")


def ours(target, tokenizer, prompts: list[list[int]], batch_size: int, new_tokens: int,
         packed: bool = True) -> tuple[float, list]:
    """Seconds and responses of generate_target_data (what a run calls), after a warm-up batch. packed=False: the
    target's layers stay F.linear (target_data.packed_linears made a no-op), as before they were packed."""
    settings = dict(max_new_tokens=new_tokens, batch_size=batch_size, progress=False)
    packing = target_data.packed_linears
    target_data.packed_linears = packing if packed else (lambda *models, **kwargs: contextlib.nullcontext(0))
    try:
        with tempfile.TemporaryDirectory(prefix="bench_responses_") as work:
            generate_target_data(target, tokenizer, prompts[:batch_size], Path(work) / "warmup", **settings)
            started = time.perf_counter()
            rows = generate_target_data(target, tokenizer, prompts, Path(work) / "timed", **settings)
            return time.perf_counter() - started, rows["response_ids"]
    finally:
        target_data.packed_linears = packing


@torch.no_grad()
def transformers_generate(target, tokenizer, prompts: list[list[int]], batch_size: int,
                          new_tokens: int) -> tuple[float, list]:
    """Seconds and responses of `model.generate` (greedy, left padding), batch by batch, after a warm-up batch."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else \
        tokenizer.eos_token_id

    def batch(rows: list[list[int]]) -> list[list[int]]:
        width = max(len(r) for r in rows)
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        out = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                              eos_token_id=eos, pad_token_id=pad)[:, width:].tolist()
        return [r[: r.index(eos) + 1] if eos in r else r for r in out]

    batch(prompts[:batch_size])
    started, responses = time.perf_counter(), []
    for start in range(0, len(prompts), batch_size):
        responses += batch(prompts[start:start + batch_size])
    return time.perf_counter() - started, responses


def vllm_generate(folder: str, tokenizer, prompts: list[list[int]], batch_size: int, new_tokens: int,
                  python: Path) -> tuple[float, list]:
    """Seconds of vLLM's `LLM.generate` over all prompts at max_num_seqs = batch_size (timed inside the worker)."""
    from decode.serving.vllm_engine import run_worker
    from distill.data.target_vllm import vllm_request

    sampling = Sampling(new_tokens, 0.0, None, None, 0, 1)
    response = run_worker(python, vllm_request(folder, prompts, sampling, tokenizer.eos_token_id, 0,
                                               max_num_seqs=batch_size))
    return response["plain"]["seconds"], [list(r) for r in response["plain"]["outputs"]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="model folder or .gguf file (default: SmolLM2's GGUF)")
    parser.add_argument("--prompts", default="recipes/prompts/chat_eval.jsonl")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--min-rows", type=int, default=16, help="rows answered at batch sizes below this")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--engines", nargs="+", default=["specdistill", "transformers", "vllm"],
                        choices=["specdistill", "specdistill-f.linear", "transformers", "vllm"],
                        help="specdistill-f.linear: ours with the target's layers left on F.linear (no oneDNN packing)")
    parser.add_argument("--vllm-python", default=None)
    record_options(parser, DOC_NAME, ROOT / "bench_responses_out", "docs/benchmarks/responses/bench_responses.json")
    return parser.parse_args(argv)


def measure(args: argparse.Namespace) -> dict:
    """Every engine at every batch size, one after the other in this process: the record the page's block is
    written from (seconds, rows, tokens and rows equal to the first engine's, per engine and batch size)."""
    datasets.disable_progress_bars()
    target_path = args.target or smollm2_gguf()
    tokenizer = load_tokenizer(target_path)
    target = load_causal_lm(target_path, torch.device("cpu"), torch.float32)
    folder = target.name_or_path  # a .gguf: its converted folder, which vLLM loads
    encoded = [p.tolist() for p in encode_prompt_rows(tokenizer, read_prompt_rows(args.prompts), "on")]
    python = None
    if "vllm" in args.engines:
        from decode.serving.vllm_engine import find_vllm_python
        python = find_vllm_python(args.vllm_python)

    load_before, runs = load_average(), []
    for batch_size in args.batch_sizes:
        prompts = (encoded * (1 + max(args.min_rows, batch_size) // len(encoded)))[: max(args.min_rows, batch_size)]
        reference = None
        for engine in args.engines:
            if engine.startswith("specdistill"):
                seconds, responses = ours(target, tokenizer, prompts, batch_size, args.new_tokens,
                                          packed=engine == "specdistill")
            elif engine == "transformers":
                seconds, responses = transformers_generate(target, tokenizer, prompts, batch_size, args.new_tokens)
            else:
                seconds, responses = vllm_generate(folder, tokenizer, prompts, batch_size, args.new_tokens, python)
            reference = reference if reference is not None else responses
            run = {"engine": engine, "batch_size": batch_size, "rows": len(prompts), "seconds": seconds,
                   "tokens": sum(len(r) for r in responses), "equal": sum(a == b for a, b in zip(responses, reference))}
            print(f"{engine} batch {batch_size}: {run['rows']} rows, {run['tokens']} tokens in {seconds:.1f} s",
                  file=sys.stderr, flush=True)
            runs.append(run)
    return {"command": command_line("scripts/bench_responses.py"), "machine": machine("cpu"),
            "load_average": f"{load_before} / {load_average()}", "code": code_version(FILES),
            "target": Path(target_path).name, "prompts": args.prompts, "new_tokens": args.new_tokens,
            "min_rows": args.min_rows, "runs": runs}


HEADERS = ["engine", "batch size", "rows", "responses/s", "new tokens/s", "rows equal to the first engine's"]


def doc_text(record: dict) -> str:
    """The page's block from the record alone: the machine and settings, then one row per engine and batch size."""
    rows = [[r["engine"], r["batch_size"], r["rows"], f"{r['rows'] / r['seconds']:.2f}",
             f"{r['tokens'] / r['seconds']:.1f}", f"{r['equal']}/{r['rows']}"] for r in record["runs"]]
    lines = [f"Machine: {record['machine']}; load average before / after: {record['load_average']}.",
             f"Target: {record['target']} (SmolLM2-135M-Instruct), float32 on the CPU. Prompts: {record['prompts']} "
             f"(chat template), batch size B answers max({record['min_rows']}, B) of them, greedy, at most "
             f"{record['new_tokens']} new tokens, stopping at eos.", "", *markdown_table(HEADERS, rows)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    if args.doc:
        check_doc(args.doc, DOC_NAME)  # before anything is measured
    record = record_of(args, lambda: measure(args), DOC_NAME)
    text = doc_text(record)
    print(text, end="")
    if args.doc:
        write_doc(args.doc, text, DOC_NAME)
    return text


if __name__ == "__main__":
    main()
