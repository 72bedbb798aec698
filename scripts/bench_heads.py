"""Hidden-state heads against standalone drafts on one trained target, the same training tokens for every row.

    python scripts/bench_heads.py --target TARGET_DIR --dataset CORPUS.txt|DIR --eval-prompts PROMPTS.jsonl \
        --out bench_heads_out [--steps 240] [--compile] [--vllm] [--doc docs/benchmarks/heads.md]

Rows (each trained by scripts/train.py for --steps optimizer steps of the same batch and block length):
  ce                    standalone 2-layer draft, plain cross-entropy             (recipes/quickstart/draft_ce.yaml)
  distilled             the same draft distilled from the target, the recipe's loss (lk_hybrid; draft_kd.yaml)
  distilled_forward_kl  the same with distill.loss=forward_kl
  head                  EAGLE-3 head without training-time test (ttt_steps 1)     (recipes/quickstart/head.yaml)
  head_ttt              EAGLE-3 head with the recipe's training-time test          (recipes/quickstart/head.yaml)
  pard_draft            the distilled draft drafting in parallel: one forward per step (recipes/quickstart/pard.yaml)
  pard_converted        the trained `distilled` draft converted to PARD by --steps more steps of pard.yaml
  p_eagle_head          the EAGLE-3 head drafting in parallel (P-EAGLE)            (recipes/quickstart/p_eagle.yaml)
  dflash_draft          a DFlash block drafter on the target's hidden states       (recipes/quickstart/dflash.yaml)
Each is measured by specdistill-eval (the same code path as the trainer) at gamma 2..6 (the one-forward kinds at
2..8: their draft cost does not grow with gamma), greedy and T=1: tau, acceptance, per-position acceptance, the
draft cost ratio c, and the wall-clock speedup over plain decoding measured in the same run (eager, and compiled
with --compile). --vllm adds tau measured inside vLLM (`--engine both`) for the head, DFlash and PARD rows.
Every step reuses what an earlier run left in --out (a row trained there with other settings stops it). The
tables are written from a record of what they show (the machine, the settings, each row's results), kept as --json
(default --out/bench_heads.json); `--from-json docs/benchmarks/heads/bench_heads.json --doc docs/benchmarks/heads.md`
writes them again from the committed record without training or measuring anything.
--doc writes the tables into a new file, or into a page between its lines `<!-- BEGIN bench_heads
(scripts/bench_heads.py --doc) -->` and `<!-- END bench_heads -->` (the hand-written text around them is kept); a page
without them stops the script before it measures anything.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from decode.measure.table import markdown_table
from distill.outputs.run_folder import RECIPE_FILE
from scripts.benchmark import check_doc, load_average, machine, record_of, write_doc
from specdistill.recipes import load_recipe

RECIPES = ROOT / "recipes" / "quickstart"
ROWS = {  # row -> (recipe, extra overrides)
    "ce": ("draft_ce.yaml", []),
    "distilled": ("draft_kd.yaml", []),
    "distilled_forward_kl": ("draft_kd.yaml", ["distill.loss=forward_kl"]),
    "head": ("head.yaml", ["distill.ttt_steps=1"]),
    "head_ttt": ("head.yaml", []),  # the recipe's training-time test (distill.ttt_steps)
    "pard_draft": ("pard.yaml", []),
    "pard_converted": ("pard.yaml", ["model.draft_config=null", "model.draft={out}/distilled"]),  # + its own steps
    "p_eagle_head": ("p_eagle.yaml", []),
    "dflash_draft": ("dflash.yaml", []),
}
STARTS_FROM = {"pard_converted": "distilled"}  # rows trained on from another row's draft (trained first)
HEAD_ROWS = ("head", "head_ttt", "p_eagle_head")  # the rows --head-overrides reach (EAGLE-3's aux_layers, vocabulary)
DFLASH_ROWS = ("dflash_draft",)  # the rows --dflash-overrides reach
VLLM_ROWS = (*HEAD_ROWS, *DFLASH_ROWS, "pard_draft")  # the rows --vllm measures inside vLLM
GAMMAS = ["2", "3", "4", "5", "6"]
ONE_FORWARD_RECIPES = ("pard.yaml", "p_eagle.yaml", "dflash.yaml")  # one draft forward whatever gamma is:
ONE_FORWARD_GAMMAS = [*GAMMAS, "7", "8"]  # their rows are measured further
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", type=Path, help="required unless --from-json")
    p.add_argument("--dataset", type=Path, help="required unless --from-json")
    p.add_argument("--eval-prompts", type=Path, help="required unless --from-json")
    p.add_argument("--out", type=Path, default=ROOT / "bench_heads_out")
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--num-prompts", type=int, default=24)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    p.add_argument("--overrides", nargs="*", default=[], metavar="KEY=VALUE",
                   help="recipe overrides for every row (e.g. train.warmup_steps=0.05)")
    p.add_argument("--head-overrides", nargs="*", default=[], metavar="KEY=VALUE",
                   help="recipe overrides for the EAGLE-3 rows only (head, head_ttt, p_eagle_head; e.g. "
                        "model.aux_layers=[1,3,5] distill.ttt_steps=4)")
    p.add_argument("--dflash-overrides", nargs="*", default=[], metavar="KEY=VALUE",
                   help="recipe overrides for the dflash_draft row only (e.g. model.dflash_target_layers=[0,2,4], the "
                        "outputs the head's aux layers 1, 3, 5 read)")
    p.add_argument("--compile", action="store_true", help="also measure the compiled decoder")
    p.add_argument("--vllm", action="store_true",
                   help=f"also measure the rows {', '.join(VLLM_ROWS)} inside vLLM (make serving)")
    p.add_argument("--doc", type=Path, default=None,
                   help="write the markdown here: a new file, or a page between its BEGIN / END bench_heads markers")
    p.add_argument("--json", type=Path, default=None,
                   help="write the record the tables are written from here (default: --out/bench_heads.json)")
    p.add_argument("--from-json", type=Path, default=None,
                   help="train and measure nothing: the tables of this record (docs/benchmarks/heads/bench_heads.json)")
    args = p.parse_args(argv)
    missing = [flag for flag in ("--target", "--dataset", "--eval-prompts")
               if getattr(args, flag[2:].replace("-", "_")) is None]
    if missing and args.from_json is None:
        p.error(f"the following arguments are required: {', '.join(missing)} (or --from-json)")
    args.out = args.out.resolve()  # the trainings run from the repository: paths given here are this folder's
    for name in ("target", "dataset", "eval_prompts"):
        if getattr(args, name) is not None and Path(getattr(args, name)).exists():
            setattr(args, name, Path(getattr(args, name)).resolve())
    return args


def run(cmd: list[str], check: bool = True) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=check, env=ENV, cwd=ROOT)


def train(args: argparse.Namespace, row: str) -> Path:
    """scripts/train.py for one row (skipped when its output folder already holds a draft exported with the same
    recipe; one trained with other settings stops the benchmark)."""
    out = args.out / row
    recipe, extra = ROWS[row]
    if row in STARTS_FROM:
        train(args, STARTS_FROM[row])
    extra = [value.format(out=args.out) for value in extra]
    if row in HEAD_ROWS:
        extra = [*args.head_overrides, *extra]  # the row's own ttt_steps last: it defines the row
    if row in DFLASH_ROWS:
        extra = [*args.dflash_overrides, *extra]
    extra = [*args.overrides, *extra]
    recipe_args = [str(RECIPES / recipe), f"model.target={args.target}", f"data.dataset={args.dataset}",
                   f"data.eval_prompts={args.eval_prompts}", f"train.output_dir={out}", f"train.max_steps={args.steps}",
                   f"train.per_device_train_batch_size={args.batch}", f"train.save_steps={args.steps}",
                   "eval.at_checkpoints=false", *extra]
    if (out / "train_results.json").is_file():
        check_reusable(out, recipe_args)
    else:
        run([sys.executable, str(ROOT / "scripts" / "train.py"), *recipe_args])
    return out


def check_reusable(out: Path, recipe_args: list[str]) -> None:
    """Exit with one line when the draft in `out` was trained with another recipe than `recipe_args` (a recipe file
    and its overrides) asks for, e.g. another --overrides train.seed into the same --out."""
    saved_file = out / RECIPE_FILE
    if not saved_file.is_file():
        return
    wanted = load_recipe(recipe_args[0], recipe_args[1:]).model_dump()
    saved = load_recipe(saved_file).model_dump()
    changed = [f"{section}.{key}: {before!r} there, {value!r} now"
               for section, values in wanted.items() for key, value in values.items()
               if value != (before := saved.get(section, {}).get(key))]
    if changed:
        sys.exit(f"bench_heads: {out} holds a draft trained with other settings ({'; '.join(changed[:3])}"
                 f"{'; ...' if len(changed) > 3 else ''}): pass another --out, or remove that folder to train it again")


def tokens_per_s(out: Path) -> float | None:
    """The trainer's logged training tokens/s, averaged over its log lines."""
    state = next(out.glob("checkpoint-*/trainer_state.json"), None)
    if state is None:
        return None
    values = [e["tokens_per_s"] for e in json.loads(state.read_text())["log_history"] if "tokens_per_s" in e]
    return sum(values) / len(values) if values else None


def evaluate(args: argparse.Namespace, row: str, draft: Path, temperature: float, compiled: bool,
             engine: str = "specdistill") -> dict:
    """specdistill-eval's JSON for one row (reused when present)."""
    name = f"{row}_T{temperature:g}{'_compiled' if compiled else ''}{'_' + engine if engine != 'specdistill' else ''}"
    path = args.out / "evals" / f"{name}.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        gammas = ["2", "4"] if engine != "specdistill" else gammas_of(row)
        run([sys.executable, str(ROOT / "scripts" / "eval_acceptance.py"), "--target", str(args.target),
             "--draft", str(draft), "--prompts", str(args.eval_prompts), "--num-prompts", str(args.num_prompts),
             "--max-new-tokens", str(args.max_new_tokens), "--gamma", *gammas, "--temperature", str(temperature),
             "--device", "cpu", "--dtype", "float32", "--output", str(path),
             *(["--engine", engine] if engine != "specdistill" else []),
             *(["--compile"] if compiled else [])], check=engine == "specdistill")  # both: exit 1 = out of tolerance
    if not path.is_file():  # --engine both stopped before writing (e.g. no vLLM interpreter): its error is above
        sys.exit(f"bench_heads: {name} wrote no results (see the error above; `make serving` creates .venv-vllm)")
    return json.loads(path.read_text())


def gammas_of(row: str) -> list[str]:
    return ONE_FORWARD_GAMMAS if ROWS[row][0] in ONE_FORWARD_RECIPES else GAMMAS


RESULT_KEYS = ("num_prompts", "gamma", "temperature", "mean_accepted_tokens", "acceptance_rate",
               "per_position_acceptance", "draft_cost_ratio", "speedup", "predicted_speedup", "greedy_match")
PARITY_KEYS = ("gamma", "tau_specdistill", "tau_vllm", "ratio", "greedy_match_vllm")


def kept(result: dict, keys: tuple[str, ...]) -> dict:
    """What the record keeps of an eval result: `keys` (what the tables read, with the prompts, temperature and greedy
    match)."""
    return {key: result[key] for key in keys if key in result}


def measure(args: argparse.Namespace) -> dict:
    """Every row trained and measured (or reused from --out): the record the page's block is written from."""
    rows, parity = [], []
    for row in args.rows:
        draft = train(args, row)
        tps = tokens_per_s(draft)
        for temperature in (0.0, 1.0):
            for compiled in (False, True) if args.compile and temperature == 0.0 else (False,):
                results = evaluate(args, row, draft, temperature, compiled)["results"]
                rows.append({"row": row, "decoding": f"T={temperature:g}" + (", compiled" if compiled else ""),
                             "train_tokens_per_s": tps, "results": [kept(r, RESULT_KEYS) for r in results]})
        if args.vllm and row in VLLM_ROWS:
            both = evaluate(args, row, draft, 0.0, False, engine="both")
            parity += [{"row": row, **kept(p, PARITY_KEYS)} for p in both.get("parity", [])]
    return {"machine": machine("cpu"), "load_average": load_average(), "target": args.target.name,
            "steps": args.steps, "batch": args.batch, "overrides": args.overrides,
            "head_overrides": args.head_overrides, "dflash_overrides": args.dflash_overrides,
            "num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens, "rows": rows, "parity": parity}


def doc_text(record: dict) -> str:
    """The page's block from the record alone: the machine and settings, one table row per (row, decoding, gamma)
    (the per-position column when the record has it), and vLLM's tau beside ours."""
    positions = any(r.get("per_position_acceptance") for row in record["rows"] for r in row["results"])
    table = []
    for row in record["rows"]:
        tps = row["train_tokens_per_s"]
        for r in row["results"]:
            cells = [row["row"], row["decoding"], r["gamma"], f"{r['mean_accepted_tokens']:.2f}",
                     f"{r['acceptance_rate']:.3f}", f"{r['draft_cost_ratio']:.3f}", f"{r['speedup']:.2f}x",
                     f"{r['predicted_speedup']:.2f}x", f"{tps:.0f}" if tps else "-"]
            if positions:
                cells.insert(5, " / ".join(f"{a:.2f}" for a in r.get("per_position_acceptance") or []) or "-")
            table.append(cells)
    headers = ["row", "decoding", "gamma", "tau", "acceptance", "c", "speedup", "predicted", "train tok/s"]
    if positions:
        headers.insert(5, "per-position acceptance")
    also = [("every row also", record["overrides"]), ("EAGLE-3 rows also", record["head_overrides"]),
            ("dflash_draft also", record["dflash_overrides"])]
    lines = [f"Machine: {record['machine']}; load average at the end {record['load_average']}.",
             f"Target: `{record['target']}`; {record['steps']} steps x batch {record['batch']} for every row"
             + "".join(f"; {who} `{' '.join(overrides)}`" for who, overrides in also if overrides) + "; "
             f"{record['num_prompts']} held-out prompts x {record['max_new_tokens']} new tokens.", "",
             *markdown_table(headers, table)]
    if record["parity"]:
        parity = [[p["row"], p["gamma"], f"{p['tau_specdistill']:.3f}", f"{p['tau_vllm']:.3f}", f"{p['ratio']:.3f}",
                   p["greedy_match_vllm"]] for p in record["parity"]]
        lines += ["", "Inside vLLM (`--engine both`, greedy):", "",
                  *markdown_table(["row", "gamma", "tau ours", "tau vLLM", "ratio", "vLLM greedy = plain"], parity)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.doc:
        check_doc(args.doc, "bench_heads")

    # ---- the record: trained and measured into --out, or read back (--from-json) ----
    record = record_of(args, lambda: measure(args), "bench_heads")

    # ---- the tables ----
    text = doc_text(record)
    print(text)
    if args.doc:
        write_doc(args.doc, text, "bench_heads")


if __name__ == "__main__":
    main()
