"""The target's forwards over training rows on CPU: oneDNN-packed weights against F.linear, in the two cache builds.

    .venv/bin/python scripts/bench_cache_builds.py                     # SmolLM2 (the GGUF make install brings), ~4 min
    .venv/bin/python scripts/bench_cache_builds.py --target FOLDER --rows 64 --batch-size 4

distill.data.hidden_cache.build_hidden_cache (an EAGLE-3 head's aux and final hidden states, stored float32) and
distill.data.teacher_cache.build_teacher_cache (the top-k log-probabilities) run the frozen target once over every
row; on CPU they run it on packed layers (decode.loop.packed_linear.packed_linears, in distill/data/row_cache.py).
Each build runs here twice into fresh temporary folders, packed and with the packing made a no-op (F.linear), the
two alternating, after an untimed warm-up build of a few rows; the ratio is measured in this one run. Rows: --rows
rows of random token ids, lengths uniform in [--min-length, --max-length] (seeded): a forward's cost depends on the
lengths, not on the tokens. Counts the positions where both teacher caches stored the same top-1 id and the same
top-k ids in the same order (float rounding may swap two near-equal log-probabilities: counted, not failed).
Prints a markdown section (machine and code version included).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # `python scripts/bench_cache_builds.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import datasets
import torch

import distill.data.row_cache as row_cache
from decode.inputs.gguf import smollm2_gguf
from decode.inputs.loading import load_causal_lm, load_tokenizer
from distill.data.hidden_cache import build_hidden_cache
from distill.data.teacher_cache import build_teacher_cache
from scripts.benchmark import command_line, header, markdown_table

FILES = ("distill/data/row_cache.py", "decode/loop/packed_linear.py")
MODES = ("packed", "F.linear")


@contextlib.contextmanager
def linear_mode(mode: str):
    """Inside: the cache builds pack the target's layers ("packed", as shipped) or leave them on F.linear."""
    packing = row_cache.packed_linears
    row_cache.packed_linears = packing if mode == "packed" else (lambda *m, **k: contextlib.nullcontext())
    try:
        yield
    finally:
        row_cache.packed_linears = packing


def random_rows(count: int, low: int, high: int, vocab: int, seed: int = 0) -> datasets.Dataset:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (count,), generator=generator).tolist()
    return datasets.Dataset.from_dict({"input_ids": [torch.randint(0, vocab, (n,), generator=generator).tolist()
                                                     for n in lengths]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="model folder or .gguf (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--rows", type=int, default=96)
    parser.add_argument("--min-length", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--k", type=int, default=64, help="the teacher cache's top-k")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    datasets.disable_progress_bars()
    target_path = args.target or str(smollm2_gguf())
    target = load_causal_lm(target_path, torch.device("cpu"), torch.float32).eval()
    tokenizer = load_tokenizer(target_path)
    layers = target.config.num_hidden_layers
    aux = [2, layers // 2, layers - 3]  # vLLM's EAGLE-3 default
    rows = random_rows(args.rows, args.min_length, args.max_length, target.config.vocab_size)
    builds = {
        "hidden-state cache (float32)": lambda data, out: build_hidden_cache(
            target, data, out, aux_layers=aux, batch_size=args.batch_size, target_id="bench", dtype="float32",
            progress=False),
        f"teacher cache (top-{args.k})": lambda data, out: build_teacher_cache(
            target, data, out, k=args.k, batch_size=args.batch_size, target_id="bench", tokenizer=tokenizer,
            progress=False),
    }
    tokens = sum(map(len, rows["input_ids"]))
    table = []
    with tempfile.TemporaryDirectory(prefix="bench_cache_builds_") as work:
        for name, build in builds.items():
            seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
            built = {}
            for repeat in range(args.repeats + 1):
                for mode in MODES if repeat % 2 else reversed(MODES):
                    data = rows if repeat else rows.select(range(min(2 * args.batch_size, len(rows))))
                    out = Path(work) / f"{len(table)}-{name[:6]}-{mode}-{repeat}"
                    with linear_mode(mode):
                        started = time.perf_counter()
                        cache = build(data, out)
                        elapsed = time.perf_counter() - started
                    if repeat:  # the first round warms up
                        seconds[mode].append(elapsed)
                        built[mode] = cache
            best = {mode: min(values) for mode, values in seconds.items()}
            same = ""
            if hasattr(built["packed"], "topk"):  # [rows, longest, k] padded: compare each row's own positions
                ids = [built[mode].topk(range(len(rows)))[0] for mode in MODES]
                real = torch.arange(ids[0].shape[1])[None, :] < torch.tensor(list(map(len, rows["input_ids"])))[:, None]
                top1 = int(((ids[0][..., 0] == ids[1][..., 0]) & real).sum())
                whole = int(((ids[0] == ids[1]).all(-1) & real).sum())
                same = f"top-1 {top1}/{tokens}, all {args.k} in order {whole}/{tokens}"
            for mode in MODES:
                table.append([name, mode, f"{best[mode]:.1f}", f"{tokens / best[mode]:.0f}",
                              f"{best['F.linear'] / best[mode]:.2f}x", same if mode == "packed" else ""])
            print(f"{name}: packed {best['packed']:.1f} s, F.linear {best['F.linear']:.1f} s", file=sys.stderr)
    print("## The target's forwards in the cache builds: packed weights against F.linear\n")
    print("\n".join(header(command_line("scripts/bench_cache_builds.py"), "cpu", FILES)))
    print(f"Target: {Path(target_path).name}, float32 on the CPU. {args.rows} rows of {args.min_length}-"
          f"{args.max_length} random tokens ({tokens} in all), batch {args.batch_size}; best of {args.repeats} "
          "builds per mode, the modes alternating.\n")
    headers = ["build", "layers", "seconds", "tokens/s", "vs F.linear", "positions with the same ids"]
    print("\n".join(markdown_table(headers, table)))


if __name__ == "__main__":
    main()
