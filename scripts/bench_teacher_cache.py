"""Online teacher vs cached top-k teacher: time per training step, peak memory, cache build time and size.

    .venv/bin/python scripts/bench_teacher_cache.py                # ~1-2 min on 2 CPU cores
    .venv/bin/python scripts/bench_teacher_cache.py --device cuda --rows 1024 --batch-size 16 --seq-len 512

A Llama target (hidden 256, 4 layers, vocab 4096; logits sharpened like a trained LM's) and draft (hidden 64,
2 layers) are built from configs; the data are random tokens. Each training mode runs in its own subprocess so that
its peak memory (max RSS on CPU, torch.cuda.max_memory_allocated on GPU) is its own:
  online: draft forward + target forward (hidden states) + chunked_distill_loss with the target's lm_head, as the
          trainer does it today;
  cached: draft forward + chunked_distill_loss with a SparseTeacher read from the cache through
          with_teacher_columns / TeacherCollator (the target is never loaded).
One step = forward, backward, AdamW step. Prints a table and what it shows; --json keeps the record they are written
from, --doc writes them between docs/benchmarks/teacher_cache.md's `bench_teacher_cache` markers, --from-json writes
them again from a record, measuring nothing:

    .venv/bin/python scripts/bench_teacher_cache.py --json docs/benchmarks/teacher_cache/cpu.json \
        --doc docs/benchmarks/teacher_cache.md
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # `python scripts/bench_teacher_cache.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import datasets
import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM

from distill.data.rows import DistillCollator
from distill.data.teacher_cache import (
    TeacherCollator,
    build_teacher_cache,
    load_teacher_cache,
    sparse_teacher_from_batch,
    with_teacher_columns,
)
from distill.losses.distill_loss import chunked_distill_loss
from scripts.benchmark import (
    arguments,
    block_options,
    code_version,
    current_memory_mib,
    machine,
    markdown_table,
    peak_memory_mib,
    random_llama,
    random_rows,
    record_block,
    run_worker,
    sharpen,
    timed,
    worker_args,
)

SCRIPT = "bench_teacher_cache"
VOCAB = 4096
SHARPEN = 16.0  # random init gives near-uniform logits; x16 gives top-1 / top-32 mass ~0.44 / ~0.95, like an LM
FILES = ("distill/data/teacher_cache.py", "distill/data/shard_store.py", "distill/losses/distill_loss.py",
         "distill/losses/fused.py")


# ---------------------------------------------------------------------------------------------------------------
# Workers (each in its own process)
# ---------------------------------------------------------------------------------------------------------------

def loss_sums(draft, batch, target, chunk_size: int):
    """The trainer's loss: positions [:, :-1] predict labels[:, 1:]; online when target is given, else cached."""
    hidden = draft(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True,
                   use_cache=False, logits_to_keep=1).hidden_states[-1]  # [B, T, H]
    if target is None:
        teacher, teacher_head = sparse_teacher_from_batch(batch), None
    else:
        with torch.no_grad():
            teacher = target.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                        use_cache=False).last_hidden_state[:, :-1]  # [B, T-1, H']
        teacher_head = target.get_output_embeddings()
    return chunked_distill_loss(hidden[:, :-1], draft.get_output_embeddings(), teacher, batch["labels"][:, 1:],
                                batch["attention_mask"][:, 1:].bool(), teacher_head=teacher_head,
                                chunk_size=chunk_size, loss="forward_kl")


def train_worker(args: argparse.Namespace) -> dict:
    work = Path(args.work_dir)
    device = args.device
    rows = datasets.load_from_disk(str(work / "rows"))
    if args.mode == "cached":
        target = None
        dataset = with_teacher_columns(rows, load_teacher_cache(work / "cache"))
        collate = TeacherCollator(DistillCollator(pad_token_id=0))
    else:
        target = AutoModelForCausalLM.from_pretrained(work / "target", dtype=torch.float32).to(device).eval()
        target.requires_grad_(False)
        dataset, collate = rows, DistillCollator(pad_token_id=0)
    draft = AutoModelForCausalLM.from_pretrained(work / "draft", dtype=torch.float32).to(device).train()
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-3)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, collate_fn=collate,
                        generator=torch.Generator().manual_seed(0))
    memory_before = current_memory_mib(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()

    times, cpu_times = [], []
    batches = iter(loader)
    for step in range(args.warmup + args.steps):
        with timed(device) as elapsed:
            try:
                batch = next(batches)
            except StopIteration:
                batches = iter(loader)
                batch = next(batches)
            batch = {k: v.to(device) for k, v in batch.items()}
            sums = loss_sums(draft, batch, target, args.chunk_size)
            (sums.loss / sums.num_tokens).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if step >= args.warmup:
            times.append(elapsed.wall)
            cpu_times.append(elapsed.cpu)
    return {"mode": args.mode, "step_s": statistics.median(times), "step_cpu_s": statistics.median(cpu_times),
            "tokens_per_step": args.batch_size * args.seq_len,
            "peak_mb": peak_memory_mib(device), "before_training_mb": memory_before}


def build_worker(args: argparse.Namespace) -> dict:
    work = Path(args.work_dir)
    rows = datasets.load_from_disk(str(work / "rows"))
    target = AutoModelForCausalLM.from_pretrained(work / "target", dtype=torch.float32).to(args.device).eval()
    draft = AutoModelForCausalLM.from_pretrained(work / "draft", dtype=torch.float32).to(args.device).eval()
    tokenizer = _StubTokenizer()
    with timed(args.device) as elapsed:
        cache = build_teacher_cache(target, rows, work / "cache", k=args.k, batch_size=args.batch_size,
                                    target_id="bench-target", tokenizer=tokenizer, progress=False)
    seconds, cpu_seconds = elapsed.wall, elapsed.cpu
    # how far the k-truncated loss is from the online one, for the untrained draft on one batch
    batch = TeacherCollator(DistillCollator(0))([with_teacher_columns(rows, cache)[i] for i in range(8)])
    batch = {k: v.to(args.device) for k, v in batch.items()}
    with torch.no_grad():
        online = loss_sums(draft, batch, target, args.chunk_size).loss.item()
        cached = loss_sums(draft, batch, None, args.chunk_size).loss.item()
    top_mass = batch["teacher_topk_logprobs"][:, :-1].exp().sum(-1).mean().item()
    return {"build_s": seconds, "build_cpu_s": cpu_seconds, "bytes": cache.metadata["bytes_on_disk"],
            "positions": cache.metadata["num_positions"], "rows": len(cache), "topk_mass": top_mass,
            "loss_gap": (cached - online) / online}


class _StubTokenizer:
    """The cache records a vocabulary hash; random-token data need no real tokenizer."""

    bos_token_id, eos_token_id, pad_token_id, unk_token_id = 1, 2, 0, None

    def get_vocab(self) -> dict[str, int]:
        return {f"<{i}>": i for i in range(VOCAB)}


# ---------------------------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------------------------

def report(record: dict) -> str:
    """The page's block from the record alone: the machine and settings, the table, what it shows."""
    args = argparse.Namespace(**record["settings"])
    build, online, cached = record["build"], record["online"], record["cached"]
    memory = "peak CUDA MiB allocated" if args.device == "cuda" else "peak RSS MiB"
    lines = [f"Machine: {record['machine']}; load average (1 min) before / after {record['load_average']}.", "",
             f"device={args.device} rows={args.rows} seq_len={args.seq_len} batch={args.batch_size} k={args.k} "
             f"steps={args.steps} (median; best of {args.repeats} runs) torch threads={record['torch_threads']}", ""]
    lines += markdown_table(["mode", "s/step (wall)", "CPU s/step (all threads)", "tokens/s", memory,
                             "MiB before training"],
                            [[r["mode"], f"{r['step_s']:.3f}", f"{r['step_cpu_s']:.3f}",
                              f"{r['tokens_per_step'] / r['step_s']:.0f}", f"{r['peak_mb']:.0f}",
                              f"{r['before_training_mb']:.0f}"] for r in (online, cached)])
    lines += ["", f"- Step time online / cached: **{online['step_s'] / cached['step_s']:.2f}x** wall "
              f"({online['step_cpu_s'] / cached['step_cpu_s']:.2f}x CPU); peak memory online / cached: "
              f"{online['peak_mb'] / cached['peak_mb']:.2f}x (**{cached['peak_mb'] - online['peak_mb']:+.0f} MiB**).",
              f"- Cache build: {build['build_s']:.1f} s ({build['build_cpu_s']:.1f} CPU s) for {build['rows']} rows / "
              f"{build['positions']} positions ({build['positions'] / build['build_s']:.0f} positions/s), "
              f"{build['build_cpu_s'] / online['step_cpu_s'] * args.batch_size / build['rows']:.2f} online steps "
              f"of CPU time per batch of {args.batch_size} rows.",
              f"- Cache size: {build['bytes'] / 2 ** 20:.2f} MiB = {build['bytes'] / build['positions']:.0f} "
              f"B/position (k = {args.k}: int32 ids + float16 log-probs = {6 * args.k} B/position of payload).",
              f"- Fidelity: the target's top-{args.k} mass is {build['topk_mass']:.3f}; the cached forward KL of the "
              f"untrained draft is {100 * build['loss_gap']:+.2f}% off the online one."]
    return "\n".join(lines) + "\n"


def measure(args: argparse.Namespace) -> dict:
    """The record: the cache build and the best run of each mode (runs alternating), the machine, the settings."""
    with tempfile.TemporaryDirectory(prefix="bench_teacher_cache_") as work:
        args.work_dir = work
        # ---- models and data ------------------------------------------------------------------------------------
        sharpen(random_llama(hidden=256, layers=4, seed=0, vocab=VOCAB), SHARPEN).save_pretrained(Path(work) / "target")
        random_llama(hidden=64, layers=2, seed=1, vocab=VOCAB).save_pretrained(Path(work) / "draft")
        random_rows(args.rows, args.seq_len, seed=0, vocab=VOCAB, lowest_id=4).save_to_disk(str(Path(work) / "rows"))

        # ---- cache build, then one process per training mode ---------------------------------------------------
        load_before = os.getloadavg()[0]
        build = run_worker(__file__, "build", args, mode="cached")
        runs: dict[str, list[dict]] = {"online": [], "cached": []}
        for _ in range(args.repeats):  # alternating, best of: the 2 CPU cores may be shared with other jobs
            for mode in runs:
                runs[mode].append(run_worker(__file__, "train", args, mode=mode))
    online, cached = (min(runs[mode], key=lambda r: r["step_cpu_s"]) for mode in ("online", "cached"))
    settings = {k: getattr(args, k) for k in ("device", "rows", "seq_len", "batch_size", "k", "steps", "warmup",
                                              "repeats", "chunk_size")}
    return {"machine": machine(args.device), "code": code_version(FILES), "torch_threads": torch.get_num_threads(),
            "load_average": f"{load_before:.2f} / {os.getloadavg()[0]:.2f}", "settings": settings,
            "build": build, "online": online, "cached": cached,
            "wall_s_per_step_of_every_run": {m: [round(r["step_s"], 3) for r in rs] for m, rs in runs.items()}}


def main(argv: list[str] | None = None) -> None:
    # --device --rows --seq-len --batch-size --k --steps --warmup --repeats --chunk-size
    parser = arguments(__doc__, device="cuda" if torch.cuda.is_available() else "cpu")
    block_options(parser, SCRIPT)
    args = parser.parse_args(argv)
    datasets.disable_progress_bars()

    if args.role != "driver":
        args = worker_args(args)
        result = build_worker(args) if args.role == "build" else train_worker(args)
        print(json.dumps(result))
        return

    record_block(args, lambda: measure(args), report, SCRIPT)


if __name__ == "__main__":
    main()
