"""EAGLE-3 head training online vs from the hidden-state cache: training tokens/s and their ratio, from one invocation.

    OMP_NUM_THREADS=2 .venv/bin/python scripts/bench_hidden_cache.py --target TARGET_DIR --dataset TEXT_FILE
    .venv/bin/python scripts/bench_hidden_cache.py --target TARGET_DIR --dataset TEXT_FILE --steps 40 \
        --batch-size 8 --max-length 512 --overrides train.bf16=true
    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_hidden_cache.py --tiny    # a tiny random target: checks the script

Two runs of scripts/train.py (--recipe, recipes/tiny_eagle3.yaml by default; no acceptance measured) in fresh
processes, one after the other, on the same rows and settings:
  online   the frozen target runs at every step (its aux and final hidden states)
  cached   distill.hidden_state_cache in a temporary folder: built once before training (its build time, size and
           bytes per token are reported: what the first epoch pays), then every step reads it (what every later
           epoch and run gets)
Per run: tokens_per_s inside optimizer steps (the trainer's log, the first logged step left out as warm-up) and the
end-to-end seconds per step (train_runtime / steps: data loading and collation included). Prints a markdown table,
the ratio cached / online, and the largest relative difference between the two loss curves. Nothing is written
outside a temporary folder (--keep DIR keeps the runs).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch

from decode.measure.table import markdown_table
from scripts.benchmark import load_average, machine

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", type=Path, help="the target's folder (a Llama-like model with its tokenizer)")
    p.add_argument("--dataset", type=Path, help="data.dataset: a text file, folder or glob")
    p.add_argument("--tiny", action="store_true", help="build a tiny random target and text here instead")
    p.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "tiny_eagle3.yaml")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps per run")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                   help="distill.hidden_state_cache_dtype")
    p.add_argument("--overrides", nargs="*", default=[], metavar="KEY=VALUE", help="recipe overrides for both runs")
    p.add_argument("--keep", type=Path, help="write the runs and the cache here (kept) instead of a temporary folder")
    args = p.parse_args(argv)
    if not args.tiny and (args.target is None or args.dataset is None):
        p.error("give --target and --dataset, or --tiny")
    return args


def tiny_inputs(work: Path) -> tuple[Path, Path]:
    """A 4-layer random Llama (hidden 64) with a byte-level tokenizer, and a text file, built in `work`."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny import TINY_TEXT, tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tiny_model("llama", vocab_size=len(tokenizer), hidden=64, layers=4).save_pretrained(work / "target")
    tokenizer.save_pretrained(work / "target")
    (work / "text.txt").write_text(TINY_TEXT * 4)
    return work / "target", work / "text.txt"


def train(args: argparse.Namespace, target: Path, dataset: Path, out: Path, *extra: str) -> dict:
    """One run of scripts/train.py; its throughput from the trainer's log."""
    steps = args.steps
    command = [sys.executable, str(ROOT / "scripts" / "train.py"), str(args.recipe), f"model.target={target}",
               f"data.dataset={dataset}", f"train.output_dir={out}", f"train.max_steps={steps}",
               f"train.per_device_train_batch_size={args.batch_size}", f"data.max_length={args.max_length}",
               "data.num_eval_prompts=0", "train.logging_steps=1", f"train.save_steps={steps}",
               "train.save_total_limit=1", "train.report_to=[]", *args.overrides, *extra]
    done = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{out.name} run failed:\n{done.stderr[-4000:]}")
    history = json.loads((out / f"checkpoint-{steps}" / "trainer_state.json").read_text())["log_history"]
    speeds = [entry["tokens_per_s"] for entry in history if "tokens_per_s" in entry][1:]  # first step: warm-up
    runtime = json.loads((out / "train_results.json").read_text())["train_runtime"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    return {"tokens_per_s": statistics.median(speeds), "s_per_step": runtime / steps, "losses": losses}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        work = args.keep or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        target, dataset = tiny_inputs(work) if args.tiny else (args.target.resolve(), args.dataset.resolve())

        # ---- the two runs, one after the other ----------------------------------------------------------------
        online = train(args, target, dataset, work / "online")
        cache = work / "hidden_cache"
        cached = train(args, target, dataset, work / "cached", f"distill.hidden_state_cache={cache}",
                       f"distill.hidden_state_cache_dtype={args.dtype}")
        built = json.loads((cache / "hidden_cache.json").read_text())

        # ---- report -----------------------------------------------------------------------------------------------
        rows = [[name, f"{r['tokens_per_s']:.0f}", f"{r['s_per_step']:.3f}"]
                for name, r in (("online", online), ("cached", cached))]
        print(f"Command: `{' '.join(['.venv/bin/python', 'scripts/bench_hidden_cache.py', *sys.argv[1:]])}`\n")
        print(f"Machine: {machine('cuda' if torch.cuda.is_available() else 'cpu')}; "
              f"load average {load_average()}\n")
        print("\n".join(markdown_table(["run", "tokens/s in steps", "s per step (end to end)"], rows)))
        print(f"\ncache: {built['num_positions']} positions of {built['num_rows']} rows, {built['dtype']}, "
              f"{built['bytes_per_token']} bytes per token ({built['bytes_on_disk'] / built['num_positions']:.0f} on "
              f"disk), {built['bytes_on_disk'] / 2**20:.1f} MiB, built in {built['build_seconds']:.1f} s")
        print(f"ratio cached / online: {cached['tokens_per_s'] / online['tokens_per_s']:.2f}x tokens/s in steps, "
              f"{online['s_per_step'] / cached['s_per_step']:.2f}x end to end")
        # the same rows, seed and steps: the loss curves differ only by the cache's storage dtype
        gaps = [abs(c - o) / abs(o) for o, c in zip(online["losses"], cached["losses"])]
        print(f"loss curves ({len(gaps)} logged steps): largest relative difference cached vs online {max(gaps):.2e}")


if __name__ == "__main__":
    main()
