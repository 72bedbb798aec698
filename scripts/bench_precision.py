"""Training steps in float32 and in bfloat16 autocast, the same recipe and the same batches, in one run.

    GGUF=$(.venv/bin/python -c "from decode.inputs.gguf import smollm2_gguf; print(smollm2_gguf())")
    .venv/bin/python scripts/bench_precision.py recipes/smollm2/eagle3.yaml model.target=$GGUF \
        data.dataset=DATA distill.hidden_state_cache=CACHE [--steps 40] [--warmup 8] [--repeats 3] \
        [--markdown FILE]

Each precision trains the recipe with scripts/train.py for --steps optimizer steps from the recipe's seed, so step i
sees the same batch in both runs: float32, then `train.bf16=true` (with `train.use_cpu=true` on a CPU: bfloat16
autocast over the draft's forward and the loss's lm_head matmuls, DistillTrainer.autocast_smart_context_manager).
Every step is logged (train.logging_steps=1) with tokens_per_s, the input tokens of the step over its seconds. The
speed ratio is the median over steps i > --warmup of tokens_per_s_bf16[i] / tokens_per_s_fp32[i]: paired steps carry
the same tokens, so rows of different lengths cancel. Also printed: the median tokens/s of each precision and the
last logged loss, kd and tv of each run (the training signal: bfloat16 must follow float32). No acceptance is measured
(data.num_eval_prompts=0); the hidden-state or teacher cache the recipe names must exist already, or its build is
timed as part of the first run's start (not of its steps).

A shared VM's speed drifts over minutes (seen: the draft recipe's bfloat16/float32 ratio 0.76x to 1.4x from one pair
of runs to the next on a 2-core Intel Xeon VM), and whole runs one after the other carry that drift into the ratio.
--repeats N runs the pair N times, alternating (float32, bfloat16, float32, bfloat16, ...): the ratio printed is the
median of every repeat's paired steps, and each repeat's own ratio is printed beside it, so the spread shows.
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

import torch

from decode.measure.table import markdown_table
from scripts.benchmark import load_average, machine, write_result

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


def by_step(log: list[dict]) -> dict[int, dict]:
    """A run's training logs keyed by optimizer step."""
    return {entry["step"]: entry for entry in log}


def run_folder(out: Path, precision: str, repeat: int, repeats: int) -> Path:
    """Where one run trains: out/PRECISION, or out/PRECISION-R when the pair is repeated."""
    return out / (precision if repeats == 1 else f"{precision}-{repeat + 1}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="key=value recipe overrides (the target, data, caches)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=8, help="first steps left out of the medians")
    parser.add_argument("--out", type=Path, default=None, help="run folders (default: a temporary folder)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run the pair this many times, alternating precisions (a drifting machine's spread)")
    parser.add_argument("--markdown", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    if args.steps <= args.warmup:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1 (got {args.repeats})")
    with tempfile.TemporaryDirectory(prefix="bench-precision-") as scratch:
        out = args.out or Path(scratch)
        repeats = [{name: by_step(train(args.recipe, args.overrides, run_folder(out, name, r, args.repeats),
                                        args.steps, name))
                    for name in PRECISIONS} for r in range(args.repeats)]
    timed = sorted(i for i in repeats[0]["float32"] if i > args.warmup and i in repeats[0]["bfloat16"])
    pairs = [[steps["bfloat16"][i]["tokens_per_s"] / steps["float32"][i]["tokens_per_s"] for i in timed]
             for steps in repeats]
    ratio = statistics.median(r for pair in pairs for r in pair)
    rows, result = [], {"steps": len(timed), "ratio": ratio, "ratios": [statistics.median(p) for p in pairs]}
    for name in PRECISIONS:
        speed = statistics.median(steps[name][i]["tokens_per_s"] for steps in repeats for i in timed)
        last = repeats[0][name][max(repeats[0][name])]
        result[name] = {"tokens_per_s": speed, **{key: last.get(key, math.nan) for key in ("loss", "kd", "tv")}}
        rows.append([name, f"{speed:.0f}", f"{ratio if name != 'float32' else 1.0:.2f}x",
                     *(f"{last.get(key, math.nan):.4f}" for key in ("loss", "kd", "tv"))])
    spread = (f"; each repeat's ratio: {', '.join(f'{r:.2f}x' for r in result['ratios'])}" if args.repeats > 1
              else "")
    text = "\n".join([
        f"`scripts/bench_precision.py {' '.join([args.recipe, *args.overrides])}`, {args.steps} steps "
        f"(medians over steps {args.warmup + 1}..{args.steps}, paired by step), "
        f"{args.repeats} repeat{'s' if args.repeats > 1 else ''} of the pair{spread}",
        f"Machine: {machine('cuda' if torch.cuda.is_available() else 'cpu')}; load average {load_average()}", "",
        *markdown_table(["precision", "tokens/s", "speed vs float32",
                         *(f"{key} at step {args.steps}" for key in ("loss", "kd", "tv"))], rows), ""])
    write_result(text, args.markdown)
    return result


if __name__ == "__main__":
    main()
