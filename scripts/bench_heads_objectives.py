"""Heads that learn more from the same rows (docs/benchmarks/head_objectives.md): EAGLE-3 heads for
SmolLM2-135M-Instruct trained by arms that differ in one thing, on the same rows, steps and seeds, each judged by
specdistill-eval on the held-out chat prompts (recipes/prompts/chat_eval.jsonl).

    python scripts/bench_heads_objectives.py --data quickstart_out/data --arms recipe lk_hybrid tv \
        --seeds 0 --num-prompts 96 --gammas 2 4 --temperatures 0 1 --out bench_head_objectives_out \
        --doc docs/benchmarks/head_objectives.md

--data is a folder of `make quickstart` (its chat/ rows and hidden_cache/): every arm trains on those rows from that
cache, as recipes/smollm2/eagle3.yaml (--budget quickstart; with BASE's `model.head_fc_init=random`
`model.head_attn_init=random`, the recipe its arms were measured on) or eagle3_90min.yaml (--budget 90min) with the
overrides of scripts/head_arms.py's ARMS (`recipe`: none); an arm of ROWS trains on the target's answers to --data's
prompts written another way (longer, sampled) beside chat/. Each (arm, seed) is trained by scripts/train.py and measured
by scripts/eval_acceptance.py at every --temperatures: tau, acceptance per position, the wall-clock speedup over plain
decoding measured in the same run, and the training's wall time. A trained arm and its evals are reused from --out (a
folder trained with other settings stops the script). --doc writes the table between the page's lines `<!-- BEGIN
bench_heads_objectives (scripts/bench_heads_objectives.py --doc) -->` and `<!-- END bench_heads_objectives -->`
(--budget 90min: `bench_heads_objectives_90min`; --stop-at-eos, answers ended at EOS as served: the name with `_eos`),
and --plot a PNG of each arm's tau gain over the recipe (both drawn by scripts/head_objectives_page.py) from a record
of what they show (the machine, the budget, each run's results), kept as --json; `--from-json
docs/benchmarks/head_objectives/bench_heads_objectives.json --doc docs/benchmarks/head_objectives.md` draws them again
from the committed record without training or measuring anything.
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

from decode.inputs.gguf import smollm2_gguf
from scripts.benchmark import check_doc, load_average, machine, record_of, record_options, write_doc
from scripts.head_arms import ARMS, CACHES, ROWS, TTT4  # noqa: F401  (TTT4: the tests read it here)
from scripts.head_objectives_page import baseline_of, doc_text, machines_of, plot

BUDGETS = {"quickstart": "eagle3.yaml", "90min": "eagle3_90min.yaml"}  # recipes/smollm2/
# a budget's recipe -> the overrides before each arm's that make it the recipe its arms were measured on: the
# quickstart's recipe has since started fc on the deepest aux layer and the attention from the target's last layer (the
# arms `fc_last` and `fc_last_attn`, which won at no cost)
BASE = {"eagle3.yaml": ["model.head_fc_init=random", "model.head_attn_init=random"]}
# a budget's recipe -> the page block its table goes in (one page, one table per budget; a record holds one budget)
BLOCKS = {"eagle3.yaml": "bench_heads_objectives", "eagle3_90min.yaml": "bench_heads_objectives_90min"}
PROMPTS = ROOT / "recipes" / "prompts" / "chat_eval.jsonl"
# the arm is measured by specdistill-eval on the held-out prompts (below), not by the trainer after its last step
NO_TRAINER_EVAL = ["eval.held_in_prompts=0", "data.num_eval_prompts=0"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default=None, help="default: the SmolLM2 GGUF that `make install` brings")
    p.add_argument("--data", type=Path, default=ROOT / "quickstart_out" / "data",
                   help="a folder with chat/ (training rows) and hidden_cache/ (the quickstart's)")
    p.add_argument("--budget", choices=list(BUDGETS), default="quickstart")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--more-seeds", nargs="+", default=[], metavar="ARM=SEED[,SEED]",
                   help="more seeds for some arms (the winners), e.g. ttt4=1,2")
    p.add_argument("--num-prompts", type=int, default=96, help="held-out prompts (of 96)")
    p.add_argument("--gammas", nargs="+", type=int, default=[2, 4])
    p.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0])
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--stop-at-eos", action="store_true",
                   help="end each answer at its EOS, as served (specdistill-eval --stop-at-eos); without it the judge "
                        "generates all --max-new-tokens, past any EOS. A record of its own (block NAME_eos)")
    p.add_argument("--acceptance-only", action="store_true",
                   help="judge the arms on acceptance and tau alone (specdistill-eval --acceptance-only: no plain "
                        "decoding, nothing timed); their speedup cells read -")
    p.add_argument("--overrides", nargs="+", default=[], metavar="KEY=VALUE",
                   help="recipe overrides for every arm's training, after the arm's own (e.g. train.max_steps=2 for a "
                        "smoke run); the record names them and --add-to joins only records with the same")
    record_options(p, "bench_heads_objectives", ROOT / "bench_head_objectives_out",
                   "docs/benchmarks/head_objectives/bench_heads_objectives.json")
    p.add_argument("--plot", type=Path, default=None, help="a PNG of tau per arm, a panel per gamma")
    p.add_argument("--add-to", type=Path, default=None,
                   help="a record of earlier arms (the committed one): this run's arms join it (a run of the same arm, "
                        "seed, temperature and held-out prompts replaces its row at the gammas it measured, the "
                        "row's other gammas kept); the budget and new tokens must be the record's; a record not there "
                        "yet is started by this run")
    args = p.parse_args(argv)
    # the trainings and evals run from the repository: paths given here are this folder's
    args.data, args.out = args.data.resolve(), args.out.resolve()
    if args.target and Path(args.target).exists():
        args.target = str(Path(args.target).resolve())
    return args


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=ENV, cwd=ROOT)


def train(args: argparse.Namespace, arm: str, seed: int) -> Path:
    """scripts/train.py for one (arm, seed): the budget's recipe on the arm's rows and cache, its overrides."""
    out = args.out / f"{arm}_seed{seed}"
    if not (out / "train_results.json").is_file():
        recipe = ROOT / "recipes" / "smollm2" / BUDGETS[args.budget]
        rows, cache = rows_of(args, arm)
        run([sys.executable, str(ROOT / "scripts" / "train.py"), str(recipe),
             f"model.target={args.target}", f"data.dataset={rows}", f"distill.hidden_state_cache={cache}",
             f"train.output_dir={out}", f"train.seed={seed}", *NO_TRAINER_EVAL,
             *BASE.get(BUDGETS[args.budget], []), *ARMS[arm], *args.overrides])
    return out


def rows_of(args: argparse.Namespace, arm: str) -> tuple[Path, Path]:
    """The arm's training rows and hidden-state cache: --data's chat/ and hidden_cache/ (for an arm of CACHES its own
    cache beside it), or for an arm of ROWS its own folder beside chat/, written first from --data's prompts/ by
    `specdistill data responses` (which resumes), and a cache of its own (built by the training on first use)."""
    if arm not in ROWS:
        return args.data / "chat", args.data / CACHES.get(arm, "hidden_cache")
    name, options = ROWS[arm]
    rows = args.data / name
    if not (rows / "train.jsonl").is_file():
        run([sys.executable, str(ROOT / "scripts" / "build_data.py"), "responses", "--target", str(args.target),
             "--prompts", str(args.data / "prompts"), "--out", str(rows), "--batch-size", "128", *options])
    return rows, args.data / f"hidden_cache_{name.removeprefix('chat_')}"


def arm_changes(arm: str) -> list[str]:
    """What makes the arm, in the record: its overrides, and for an arm of ROWS the command its rows came from."""
    return [*ARMS[arm], *([f"rows: responses {' '.join(ROWS[arm][1])}"] if arm in ROWS else [])]


def evaluate(args: argparse.Namespace, arm: str, seed: int, head: Path, temperature: float) -> dict:
    """specdistill-eval's JSON for one trained arm at one temperature (reused when present and measured at the gammas
    asked: another --gammas measures it again)."""
    alone = "_acceptance" if args.acceptance_only else ""
    eos = "_eos" if args.stop_at_eos else ""
    path = args.out / "evals" / f"{arm}_seed{seed}_T{temperature:g}_n{args.num_prompts}{eos}{alone}.json"
    if not path.is_file() or measured_gammas(path) != set(args.gammas):
        path.parent.mkdir(parents=True, exist_ok=True)
        run([sys.executable, str(ROOT / "scripts" / "eval_acceptance.py"), "--target", str(args.target),
             "--draft", str(head), "--prompts", str(PROMPTS), "--num-prompts", str(args.num_prompts),
             "--chat-template", "on", "--max-new-tokens", str(args.max_new_tokens), "--gamma", *map(str, args.gammas),
             "--temperature", str(temperature), "--device", "cpu", "--dtype", "float32", "--quiet",
             "--output", str(path), *(["--acceptance-only"] if args.acceptance_only else []),
             *(["--stop-at-eos"] if args.stop_at_eos else [])])
    return json.loads(path.read_text())


def measured_gammas(path: Path) -> set[int]:
    """The gammas of an eval JSON's overall results (its rows by category aside)."""
    results = json.loads(path.read_text())["results"]
    return {int(r["gamma"]) for r in results if r.get("category") in (None, "all")}


RESULT_KEYS = ("num_prompts", "gamma", "temperature", "mean_accepted_tokens", "acceptance_rate",
               "per_position_acceptance", "speedup", "predicted_speedup", "greedy_match")


def measure(args: argparse.Namespace) -> dict:
    """Every (arm, seed) trained and measured at every temperature (or reused from --out): the record the page's
    block is written from."""
    more = {arm: [int(x) for x in seeds.split(",")] for arm, seeds in (item.split("=") for item in args.more_seeds)}
    runs = []
    for arm in args.arms:
        for seed in [*args.seeds, *more.get(arm, [])]:
            head = train(args, arm, seed)
            seconds = json.loads((head / "train_results.json").read_text()).get("train_runtime")
            for temperature in args.temperatures:
                results = evaluate(args, arm, seed, head, temperature)["results"]
                runs.append({"arm": arm, "seed": seed, "temperature": temperature, "train_seconds": seconds,
                             "results": [{k: r[k] for k in RESULT_KEYS if k in r} for r in results]})
    return {"machine": machine("cpu"), "load_average": load_average(), "budget": BUDGETS[args.budget],
            "data": args.data.name, "seeds": args.seeds, "more_seeds": args.more_seeds,
            "num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens,
            "arms": {arm: arm_changes(arm) for arm in args.arms},
            **({"base": BASE[BUDGETS[args.budget]]} if BUDGETS[args.budget] in BASE else {}),
            **({"overrides": args.overrides} if args.overrides else {}),
            **({"stop_at_eos": True} if args.stop_at_eos else {}),
            "runs": runs}


# what arms of one table must share (held-out prompts may differ: a column)
SAME = ("budget", "base", "data", "max_new_tokens", "overrides", "stop_at_eos")


def merged(earlier: dict, record: dict) -> dict:
    """``record``'s arms added to ``earlier``'s; a run of the same (machine, arm, seed, temperature, held-out prompts)
    replaces its row's results at the gammas it measured and keeps the others (the recipe judged at gamma 1 beside its
    gamma 2 and 4: one row, each gamma from the run that measured it; the training seconds the newest run's). Rows
    from another machine (another CPU trains and times differently) are labelled by machine, each machine with its
    own `recipe` row to compare against; runs judged on another number of held-out prompts keep it (`num_prompts` of
    the run, a column of the table). SystemExit naming the first setting they do not share."""
    for key in SAME:
        if earlier.get(key) != record.get(key):
            sys.exit(f"--add-to: its {key} is {earlier.get(key)!r}, this run's {record.get(key)!r}: arms of one table "
                     "share them")
    machines = machines_of(earlier)
    label = next((k for k, m in machines.items() if m["machine"] == record["machine"]), chr(ord("A") + len(machines)))
    machines[label] = {"machine": record["machine"], "load_average": record["load_average"]}
    runs_before = [{"num_prompts": earlier["num_prompts"], **r} for r in earlier["runs"]]
    runs_before = runs_before if "machines" in earlier else [{"machine": "A", **r} for r in runs_before]
    added = [{"machine": label, "num_prompts": record["num_prompts"], **r} for r in record["runs"]]
    key = lambda r: (r["machine"], r["arm"], r["seed"], r["temperature"], r["num_prompts"])  # noqa: E731
    before = {key(r): r for r in runs_before}
    added = [{**r, "results": with_earlier_gammas(before.get(key(r)), r["results"])} for r in added]
    runs = [r for r in runs_before if key(r) not in {key(r) for r in added}] + added
    order = list(dict.fromkeys([*earlier["arms"], *record["arms"]]))
    arms = {**earlier["arms"], **record["arms"]}
    runs.sort(key=lambda r: (r["machine"], r["num_prompts"], order.index(r["arm"]), r["seed"], r["temperature"]))
    counts = sorted({r["num_prompts"] for r in runs})
    if len(counts) == 1:  # one number of held-out prompts: the record's, not a column
        runs = [{k: v for k, v in r.items() if k != "num_prompts"} for r in runs]
    out = {key: value for key, value in earlier.items() if key not in ("machine", "load_average", "machines")}
    out["num_prompts"] = counts[0] if len(counts) == 1 else counts
    out.update(more_seeds=list(dict.fromkeys([*earlier.get("more_seeds", []), *record["more_seeds"],
                                              *other_seeds(earlier, record)])),
               arms={arm: arms[arm] for arm in order})
    if len(machines) == 1:
        return {**out, **machines["A"], "runs": [{k: v for k, v in r.items() if k != "machine"} for r in runs]}
    return {**out, "machines": machines, "runs": runs}


def with_earlier_gammas(earlier: dict | None, results: list[dict]) -> list[dict]:
    """``results`` and the earlier run's results at the gammas ``results`` does not measure, by gamma."""
    measured = {r["gamma"] for r in results}
    kept = [r for r in (earlier or {}).get("results", []) if r["gamma"] not in measured]
    return sorted([*kept, *results], key=lambda r: r["gamma"])


def other_seeds(earlier: dict, record: dict) -> list[str]:
    """`arm=seed` for each run of ``record`` at a seed ``earlier`` lists for no arm or not for this one (`--seeds 1`
    for the recipe joining a record of seed 0): the header names every seed its table holds."""
    listed = {(arm, int(seed)) for arm, seeds in (item.split("=") for item in earlier.get("more_seeds", []))
              for seed in seeds.split(",")}
    return [f"{r['arm']}={r['seed']}" for r in record["runs"]
            if r["seed"] not in earlier["seeds"] and (r["arm"], r["seed"]) not in listed]


def block_of(args: argparse.Namespace) -> str:
    """The page block this run writes: its budget's, NAME_eos for answers ended at EOS (--from-json: the record's)."""
    record = json.loads(args.from_json.read_text(encoding="utf-8")) if args.from_json else \
        {"budget": BUDGETS[args.budget], "stop_at_eos": args.stop_at_eos}
    return BLOCKS[record["budget"]] + ("_eos" if record.get("stop_at_eos") else "")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    block = block_of(args)
    if args.doc:
        check_doc(args.doc, block, "bench_heads_objectives")

    # ---- the record: trained and measured into --out (joined to --add-to's), or read back (--from-json) ----
    def measured() -> dict:
        args.target = args.target or str(smollm2_gguf())
        record = measure(args)
        if args.add_to and args.add_to.is_file():
            return merged(json.loads(args.add_to.read_text(encoding="utf-8")), record)
        return record

    record = record_of(args, measured, "bench_heads_objectives")

    # ---- the table and the plot ----
    text = doc_text(record)
    print(text)
    if args.plot:
        plot(args.plot, record["runs"], baseline_of(record))
    if args.doc:
        write_doc(args.doc, text, block, "bench_heads_objectives")


if __name__ == "__main__":
    main()
