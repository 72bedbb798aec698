"""Target responses on a real model: responses/s of our batched decoder, transformers' `generate` and vLLM at the
same batch sizes (what `specdistill-data responses` and `data.target_batch_size` run).

    GGUF=$(.venv/bin/python -c "from decode.inputs.gguf import smollm2_gguf; print(smollm2_gguf())")
    .venv/bin/python scripts/bench_responses.py --target $GGUF --prompts recipes/prompts/chat_eval.jsonl \
        --batch-sizes 1 16 64 --engines specdistill transformers vllm

Ours runs on CPU with the target's linear layers oneDNN-packed (decode.loop.packed_linear), as
`specdistill-data` does; `specdistill-f.linear` is ours with them left on F.linear.
Prompts: the first rows of --prompts rendered with the target's chat template; batch size B answers
max(--min-rows, B) of them (batch 1 is slow on a CPU), greedy, at most --new-tokens tokens, stopping at eos. Each
engine and batch size runs after an untimed warm-up batch (vLLM: its own timer around `LLM.generate`, the
engine start excluded), one after the other in this run, so ratios are measured in one run on one machine.
"equal to ours" counts rows whose tokens equal our decoder's at the same batch size (float rounding of padded
shapes may break a near-tie, from where that row differs). Prints a markdown section for
docs/benchmarks/responses.md.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # `python scripts/bench_responses.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import datasets
import torch

import distill.data.target_data as target_data
from decode.inputs.loading import load_causal_lm, load_tokenizer
from decode.inputs.prompts import encode_prompt_rows, read_prompt_rows
from distill.data.target_data import Sampling, generate_target_data
from scripts.benchmark import code_version, command_line, load_average, machine, markdown_table

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="model folder or .gguf file")
    parser.add_argument("--prompts", default="recipes/prompts/chat_eval.jsonl")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--min-rows", type=int, default=16, help="rows answered at batch sizes below this")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--engines", nargs="+", default=["specdistill", "transformers", "vllm"],
                        choices=["specdistill", "specdistill-f.linear", "transformers", "vllm"],
                        help="specdistill-f.linear: ours with the target's layers left on F.linear (no oneDNN packing)")
    parser.add_argument("--vllm-python", default=None)
    args = parser.parse_args()
    datasets.disable_progress_bars()

    # ---- target, tokenizer, prompts ------------------------------------------------------------------------------
    tokenizer = load_tokenizer(args.target)
    target = load_causal_lm(args.target, torch.device("cpu"), torch.float32)
    folder = target.name_or_path  # a .gguf: its converted folder, which vLLM loads
    rows = read_prompt_rows(args.prompts)
    encoded = [p.tolist() for p in encode_prompt_rows(tokenizer, rows, "on")]
    python = None
    if "vllm" in args.engines:
        from decode.serving.vllm_engine import find_vllm_python
        python = find_vllm_python(args.vllm_python)

    # ---- every engine at every batch size, one after the other ---------------------------------------------------
    load_before, table = load_average(), []
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
            tokens = sum(len(r) for r in responses)
            same = sum(a == b for a, b in zip(responses, reference))
            print(f"{engine} batch {batch_size}: {len(prompts)} rows, {tokens} tokens in {seconds:.1f} s",
                  file=sys.stderr, flush=True)
            table.append([engine, batch_size, len(prompts), f"{len(prompts) / seconds:.2f}", f"{tokens / seconds:.1f}",
                          f"{same}/{len(prompts)}"])

    # ---- the markdown section ------------------------------------------------------------------------------------
    print("## Target responses on SmolLM2-135M-Instruct: ours, transformers, vLLM\n")
    print(f"Command: `{command_line('scripts/bench_responses.py')}`\n")
    print(f"Machine: {machine('cpu')}; load average before / after: {load_before} / "
          f"{load_average()}\n")
    print(f"Code (sha256): {code_version(FILES)}\n")
    print(f"Target: {Path(args.target).name} (SmolLM2-135M-Instruct), float32 on the CPU. Prompts: {args.prompts} "
          f"(chat template), greedy, at most {args.new_tokens} new tokens, stopping at eos.\n")
    headers = ["engine", "batch size", "rows", "responses/s", "new tokens/s", "rows equal to the first engine's"]
    print("\n".join(markdown_table(headers, table)))


if __name__ == "__main__":
    main()
