"""Training steps in float32 and in bfloat16 autocast, the same recipe and the same batches, in one run.

    GGUF=$(.venv/bin/python -c "from decode.inputs.gguf import smollm2_gguf; print(smollm2_gguf())")
    .venv/bin/python scripts/bench_precision.py recipes/smollm2/eagle3.yaml model.target=$GGUF \
        data.dataset=DATA distill.hidden_state_cache=CACHE [--steps 40] [--warmup 8] [--markdown FILE]

Each precision trains the recipe with scripts/train.py for --steps optimizer steps from the recipe's seed, so step i
sees the same batch in both runs: float32, then `train.bf16=true` (with `train.use_cpu=true` on a CPU: bfloat16
autocast over the draft's forward and the loss's lm_head matmuls, DistillTrainer.autocast_smart_context_manager).
Every step is logged (train.logging_steps=1) with tokens_per_s, the input tokens of the step over its seconds. The
speed ratio is the median over steps i > --warmup of tokens_per_s_bf16[i] / tokens_per_s_fp32[i]: paired steps carry
the same tokens, so rows of different lengths cancel. Also printed: the median tokens/s of each precision and the
last logged loss, kd and tv of each run (the training signal: bfloat16 must follow float32). No acceptance is measured (data.num_eval_prompts=0); the hidden-state or teacher cache the recipe names
must exist already, or its build is timed as part of the first run's start (not of its steps).
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from decode.measure.table import markdown_table  # noqa: E402
from scripts.benchmark import load_average, machine, write_result  # noqa: E402

PRECISIONS = {"float32": [], "bfloat16": ["train.bf16=true"]}


def train(recipe: str, overrides: list[str], out: Path, steps: int, precision: str) -> list[dict]:
    """One run of scripts/train.py; its per-step training logs."""
    shutil.rmtree(out, ignore_errors=True)
    extra = PRECISIONS[precision] + (["train.use_cpu=true"] if precision != "float32" and not torch.cuda.is_available()
                                     else [])
    command = [sys.executable, str(ROOT / "scripts" / "train.py"), recipe, *overrides, f"train.output_dir={out}",
               f"train.max_steps={steps}", f"train.save_steps={steps}", "train.logging_steps=1",
               "train.report_to=[]", "data.num_eval_prompts=0", "eval.at_checkpoints=false", *extra]
    subprocess.run(command, check=True)
    state = json.loads((out / f"checkpoint-{steps}" / "trainer_state.json").read_text())
    return [entry for entry in state["log_history"] if "tokens_per_s" in entry]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="key=value recipe overrides (the target, data, caches)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=8, help="first steps left out of the medians")
    parser.add_argument("--out", type=Path, default=None, help="run folders (default: a temporary folder)")
    parser.add_argument("--markdown", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    if args.steps <= args.warmup:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    with tempfile.TemporaryDirectory(prefix="bench-precision-") as scratch:
        out = args.out or Path(scratch)
        logs = {name: train(args.recipe, args.overrides, out / name, args.steps, name) for name in PRECISIONS}
    steps = {name: {entry["step"]: entry for entry in log} for name, log in logs.items()}
    timed = sorted(i for i in steps["float32"] if i > args.warmup and i in steps["bfloat16"])
    ratio = statistics.median(steps["bfloat16"][i]["tokens_per_s"] / steps["float32"][i]["tokens_per_s"]
                              for i in timed)
    rows, result = [], {"steps": len(timed), "ratio": ratio}
    for name, by_step in steps.items():
        speed = statistics.median(by_step[i]["tokens_per_s"] for i in timed)
        last = by_step[max(by_step)]
        result[name] = {"tokens_per_s": speed, **{key: last.get(key, math.nan) for key in ("loss", "kd", "tv")}}
        rows.append([name, f"{speed:.0f}", f"{ratio if name != 'float32' else 1.0:.2f}x",
                     *(f"{last.get(key, math.nan):.4f}" for key in ("loss", "kd", "tv"))])
    text = "\n".join([
        f"`scripts/bench_precision.py {' '.join([args.recipe, *args.overrides])}`, {args.steps} steps "
        f"(medians over steps {args.warmup + 1}..{args.steps}, paired by step)",
        f"Machine: {machine('cuda' if torch.cuda.is_available() else 'cpu')}; load average {load_average()}", "",
        *markdown_table(["precision", "tokens/s", "speed vs float32",
                         *(f"{key} at step {args.steps}" for key in ("loss", "kd", "tv"))], rows), ""])
    write_result(text, args.markdown)
    return result


if __name__ == "__main__":
    main()
