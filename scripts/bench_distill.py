"""Distillation benchmark: which training objective gives the draft that the target accepts most, per decoding mode.

    python scripts/bench_distill.py                   # both pairs, every row, two seeds for the top rows
                                                      # (sized for ~90 min on a quiet 2-core CPU)
    python scripts/bench_distill.py --fast            # a smoke run of everything at toy sizes (~5 min)
    python scripts/bench_distill.py --pairs quickstart --rows ce forward_kl --seed-rows 0

Two target/draft pairs, both on the quickstart's corpus (the standard library, scripts/quickstart_corpus.py) and its
BPE tokenizer; each target is trained with cross-entropy by scripts/train.py (recipes/quickstart/target.yaml) in
rounds of Sizes.target_steps (cosine to 0 each round, a lower peak each round, the previous round's weights) until
its held-out CE improved by < 1% over the last fifth of its steps (bench_distill_rows.target_converged):
  quickstart  the quickstart's target (Llama hidden 256 x 4 layers) -> a draft from scratch (hidden 128 x 2 layers,
              recipes/quickstart/draft_kd.yaml's model.draft_config)
  deep        a deeper, narrower target (hidden 192 x 8 layers) -> a draft made of its layers 0 and 7
              (model.draft_layers [0, 7]: the target's embeddings, head and two layers, all trained)
Every row of a pair trains the same draft with scripts/train.py (recipes/quickstart/draft_kd.yaml plus the row's
overrides) on the same rows, for the same steps, with the same optimiser and seed; only the objective differs.
Then the top --seed-rows rows of each pair (and ce) are trained and measured again with the other seeds (draft
init, data order, sampling): the tables show the mean and the spread.

Columns (decode/ does the decoding, as `specdistill-eval` does):
  tf_acceptance    teacher-forced sum_x min(p, q) at temperature 1, averaged over held-out text positions
  greedy_agree     teacher-forced argmax p == argmax q on the same positions
  tau_greedy       mean_accepted_tokens at gamma 4, greedy, on held-out prompts (x CE: over the ce row's)
  tau_sampled      the same at temperature 1
  speedup          measured wall-clock speedup at gamma 4, greedy and sampled (noisy on a shared machine)
  tokens/s, wall   training throughput logged by the trainer, and the row's training wall time

Everything is cached under --out (bench_distill_out/, ignored by git): corpus, tokenizer, targets (out/targets/,
shared by --draft-steps variants), the target's responses, the teacher cache, each trained draft and each measured
row (<pair>/<row>.json, <pair>/<row>@seedN.json); a re-run only does what is missing, then rewrites --doc.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from scripts.bench_distill_rows import (
    PAIRS,
    ROWS,
    SEEDS,
    Pair,
    Sizes,
    draft_overrides,
    over_seeds,
    row_key,
    target_converged,
    target_overrides,
    top_rows,
)

RECIPES = ROOT / "recipes" / "quickstart"
THREADS = 1
NOTES = "<!-- notes: kept when the tables above are regenerated -->"
FAST = Sizes(target_steps=6, target_max_rounds=3, target_batch=4, draft_steps=6, draft_batch=4, max_length=64,
             num_prompts=3, max_new_tokens=8, heldout_blocks=2, target_max_new_tokens=8, on_policy_max_new_tokens=8)


def banner(title: str) -> None:
    print(f"\n{'=' * 100}\n== {title}\n{'=' * 100}", flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Data: the quickstart corpus, and the documents each kind of run trains on
# ---------------------------------------------------------------------------------------------------------------

def write_subset(docs: list[dict], path: Path, chars: float) -> Path:
    """The first documents of `docs` whose text adds up to at least `chars` characters, as a .jsonl file."""
    if path.is_file():
        return path
    chosen, total = [], 0
    for doc in docs:
        if total >= chars:
            break
        chosen.append(doc)
        total += len(doc["text"])
    path.write_text("".join(json.dumps({"text": d["text"]}) + "\n" for d in chosen))
    return path


def prepare_data(shared: Path, out: Path, sizes: Sizes):
    """Corpus and tokenizer (in `shared`), the target's and the drafts' training files (in `out`)."""
    from scripts.quickstart_corpus import build_corpus, read_jsonl
    from scripts.quickstart_tokenizer import train_tokenizer

    corpus = build_corpus(shared / "data", max_chars_per_doc=8000)
    tokenizer = train_tokenizer(corpus, shared / "tokenizer", vocab_size=4096)
    docs = list(read_jsonl(corpus.train))
    random.Random(0).shuffle(docs)  # a fixed sample of the whole library, not its alphabetically first files
    chars_per_token = json.loads((shared / "tokenizer" / "corpus_tokenizer.json").read_text())[
        "heldout_chars_per_token"]
    (out / "data").mkdir(parents=True, exist_ok=True)
    block_chars = sizes.max_length * chars_per_token
    target_file = write_subset(docs, out / "data" / "target_train.jsonl",
                               1.15 * sizes.target_max_rounds * sizes.target_steps * sizes.target_batch * block_chars)
    draft_file = write_subset(docs, out / "data" / "draft_train.jsonl",
                              1.05 * sizes.draft_steps * sizes.draft_batch * block_chars)
    return corpus, tokenizer, target_file, draft_file


# ---------------------------------------------------------------------------------------------------------------
# Training: scripts/train.py in its own process, as a user runs it
# ---------------------------------------------------------------------------------------------------------------

def train(recipe: str, output_dir: Path, overrides: list[str]) -> float:
    """Run scripts/train.py unless output_dir already holds its result; the wall seconds it took (0 if reused)."""
    if (output_dir / "train_results.json").is_file():
        print(f"reusing {output_dir}", flush=True)
        return 0.0
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), str(RECIPES / recipe),
           f"train.output_dir={output_dir}", *overrides]
    print("$ " + " ".join(cmd), flush=True)
    start = time.time()
    # one thread: on a machine shared with other jobs two threads mostly wait for each other at every op
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": str(THREADS)})
    return time.time() - start


def seed_target(out: Path, pair: Pair, tokenizer) -> Path:
    """The pair's randomly initialised target: the quickstart's seed target with the pair's shape overrides."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from scripts.quickstart_tiny import seed_target as quickstart_seed

    base = quickstart_seed(out, tokenizer)
    if not pair.target_shape:
        return base
    folder = out / pair.name / "seed_target"
    if not (folder / "config.json").is_file():
        config = AutoConfig.from_pretrained(base)
        for key, value in pair.target_shape.items():
            setattr(config, key, value)
        AutoModelForCausalLM.from_config(config).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return folder


def train_target(targets: Path, pair: Pair, tokenizer, target_file: Path, sizes: Sizes, blocks) -> dict:
    """The pair's target, trained round by round until its held-out CE stops improving (or target_max_rounds);
    {"dir": the final round's folder, "rounds": [{steps, heldout_ce, train_ce}], "converged": bool}. Cached in
    targets/<pair>/ (round<r>/ and rounds.json): a re-run trains only the rounds that are missing."""
    folder = targets / pair.name
    log_path = folder / "rounds.json"
    rounds = json.loads(log_path.read_text()) if log_path.is_file() else []
    start = seed_target(targets, pair, tokenizer)
    history = [(r["steps"], r["heldout_ce"]) for r in rounds]
    for index in range(1, sizes.target_max_rounds + 1):
        round_dir = folder / f"round{index}"
        if index > len(rounds):
            if target_converged(history):
                break
            train("target.yaml", round_dir, target_overrides(start, target_file, sizes, index))
            rounds.append({"steps": index * sizes.target_steps, "heldout_ce": heldout_ce(round_dir, blocks),
                           "train_ce": training_log(round_dir)["ce"]})
            history.append((rounds[-1]["steps"], rounds[-1]["heldout_ce"]))
            log_path.write_text(json.dumps(rounds, indent=2) + "\n")
            print(f"target {pair.name} round {index}: {json.dumps(rounds[-1])}", flush=True)
        start = round_dir
    return {"dir": start, "rounds": rounds, "converged": target_converged(history)}


def heldout_ce(model_dir: Path, blocks) -> float:
    """Mean next-token cross-entropy (nats/token) of a model on the held-out blocks."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    total, count = 0.0, 0
    with torch.inference_mode():
        for rows in blocks.split(4):
            logits = model(rows).logits[:, :-1].float()  # [B, T-1, V]
            total += float(F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten(), reduction="sum"))
            count += rows[:, 1:].numel()
    return total / count


def training_log(output_dir: Path) -> dict:
    """Mean logged tokens_per_s and the last logged kd / ce of a finished run (from its last trainer_state.json)."""
    states = sorted(output_dir.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name[11:]))
    logs = json.loads(states[-1].read_text())["log_history"] if states else []
    speeds = [entry["tokens_per_s"] for entry in logs if "tokens_per_s" in entry]
    last = next((entry for entry in reversed(logs) if "ce" in entry), {})  # a training log (kd: a teacher's loss)
    return {"tokens_per_s": sum(speeds) / len(speeds) if speeds else None, "kd": last.get("kd"),
            "ce": last.get("ce")}


# ---------------------------------------------------------------------------------------------------------------
# Measuring a draft
# ---------------------------------------------------------------------------------------------------------------

def heldout_blocks(corpus, tokenizer, sizes: Sizes):
    """[N, max_length] token blocks of held-out text (documents joined by eos)."""
    import torch

    from scripts.quickstart_corpus import read_jsonl

    stream: list[int] = []
    need = sizes.heldout_blocks * sizes.max_length
    for doc in read_jsonl(corpus.heldout):
        stream += tokenizer(doc["text"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        if len(stream) >= need:
            break
    return torch.tensor(stream[:need], dtype=torch.long).view(sizes.heldout_blocks, sizes.max_length)


def teacher_forced(target, draft, blocks) -> dict:
    """Mean sum_x min(p, q) (temperature 1) and argmax agreement of draft and target over every position."""
    import torch

    overlap, agree, count = 0.0, 0, 0
    with torch.inference_mode():
        for rows in blocks.split(4):
            p = target(rows).logits.float().softmax(-1)  # [B, T, V]
            q = draft(rows).logits.float().softmax(-1)  # [B, T, V]
            overlap += float(torch.minimum(p, q).sum(-1).sum())  # sum_x min(p, q) = 1 - TV(p, q)
            agree += int((p.argmax(-1) == q.argmax(-1)).sum())
            count += rows.numel()
    return {"tf_acceptance": overlap / count, "greedy_agreement": agree / count}


def measure(target_dir: Path, draft_dir: Path, prompts, blocks, sizes: Sizes, eos: int, seed: int = 0) -> dict:
    """Teacher-forced numbers and decode.measure.evaluate's gamma-4 results, greedy and
    at temperature 1 (sampling seed)."""
    from transformers import AutoModelForCausalLM

    from decode.measure.settings import EvalSettings
    from kinds import kind_of_source
    from specdistill.drafts import evaluate_acceptance

    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    kind = kind_of_source(draft_dir)
    draft = kind.load(str(draft_dir), target, target.device, target.dtype).eval()
    row = {"tf_acceptance": None, "greedy_agreement": None}  # a head drafts from the target's hidden states
    if kind.language_model:  # a language model of its own: teacher-forced against the target
        row = teacher_forced(target, draft, blocks)
    for mode, temperature in (("greedy", 0.0), ("sampled", 1.0)):
        settings = EvalSettings(gammas=[4], temperature=temperature, max_new_tokens=sizes.max_new_tokens,
                                eos_token_id=eos, seed=seed)
        result = evaluate_acceptance(target, draft, prompts, settings, progress=False)[0]
        row.update({f"tau_{mode}": result["mean_accepted_tokens"], f"acceptance_rate_{mode}": result[
            "acceptance_rate"], f"speedup_{mode}": result["speedup"],
            f"predicted_speedup_{mode}": result["predicted_speedup"]})
    return row


# ---------------------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------------------

def write_doc(path: Path, out: Path, results: dict[str, dict[str, dict]], sizes: Sizes, command: str,
              targets: dict[str, dict]) -> None:
    """docs/benchmarks/distill.md: one table per pair and the winner per decoding mode."""
    from scripts.bench_distill_rows import budget_line, format_pair_table, target_lines, winners
    from scripts.benchmark import machine

    lines = ["# Distillation benchmark: which objective the target accepts most", "",
             "```", command, "```", "",
             f"Machine: {machine('cpu')}, float32; shared with other jobs during the run, so wall-clock columns "
             "(speedup, tokens/s, wall) are noisy; acceptance and tau are deterministic (greedy) or seeded (sampled).",
             "",
             f"Sizes: {json.dumps(asdict(sizes))}", "", budget_line(sizes), ""]
    for name, rows in results.items():
        lines += [f"## Pair `{name}`: {PAIRS[name].describe}", "",
                  *(target_lines(targets[name]) if name in targets else []), format_pair_table(rows), ""]
    lines += winners(results)
    notes = path.read_text().split(NOTES, 1)[1] if path.is_file() and NOTES in path.read_text() else "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n" + NOTES + notes)  # hand-written notes after the marker are kept


# ---------------------------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------------------------

def run_row(pair: Pair, name: str, seed: int, target_dir: Path, pair_dir: Path, sizes: Sizes, data, prompts,
            blocks) -> dict:
    """Train and measure one row at one seed, unless <pair>/<row>[@seedN].json already holds it."""
    key = row_key(name, seed)
    result_path = pair_dir / f"{key}.json"
    if result_path.is_file():
        return json.loads(result_path.read_text())
    _, tokenizer, _, draft_file = data
    banner(f"pair {pair.name}: row {key}")
    draft_dir = pair_dir / key
    wall = train("draft_kd.yaml", draft_dir,
                 draft_overrides(pair, name, target_dir, draft_file, pair_dir, sizes, seed))
    sampling_seed = seed - SEEDS[0]  # 0 for the first seed, as before seeds were added
    row = {"row": name, "seed": seed, "overrides": ROWS[name], "train_wall_s": wall, **training_log(draft_dir),
           **measure(target_dir, draft_dir, prompts, blocks, sizes, tokenizer.eos_token_id, sampling_seed)}
    result_path.write_text(json.dumps(row, indent=2) + "\n")
    print(json.dumps(row), flush=True)
    return row


def run_pair(out: Path, targets: Path, pair: Pair, rows: list[str], sizes: Sizes, data, seeds: list[int],
             seed_rows: int) -> dict:
    """Train the pair's target, then train and measure every missing row at seeds[0], then the top seed_rows rows
    (and ce) at the other seeds. Returns the target's record (train_target)."""
    from decode.inputs.prompts import read_prompt_rows
    from distill.data.rows import eval_prompts

    corpus, tokenizer, target_file, _ = data
    pair_dir = out / pair.name
    pair_dir.mkdir(parents=True, exist_ok=True)
    prompts = eval_prompts(read_prompt_rows(corpus.eval_prompts, limit=sizes.num_prompts), "text", tokenizer, 64)
    blocks = heldout_blocks(corpus, tokenizer, sizes)
    banner(f"pair {pair.name}: target")
    target = train_target(targets, pair, tokenizer, target_file, sizes, blocks)
    args = (pair_dir, sizes, data, prompts, blocks)
    first = {name: run_row(pair, name, seeds[0], target["dir"], *args) for name in rows}
    again = ["ce", *top_rows(first, seed_rows)] if seed_rows > 0 and "ce" in first else []
    for seed in seeds[1:]:
        for name in again:
            run_row(pair, name, seed, target["dir"], *args)
    return target


def measured_rows(out: Path) -> dict[str, dict[str, dict]]:
    """The rows measured under `out`, per pair, in the order of PAIRS and ROWS, each merged over its seeds."""
    results = {}
    for pair in PAIRS:
        rows = {}
        for row in ROWS:
            runs = [json.loads(path.read_text()) for path in
                    [out / pair / f"{row}.json", *sorted((out / pair).glob(f"{row}@seed*.json"))] if path.is_file()]
            if runs:
                rows[row] = over_seeds(runs)
        if rows:
            results[pair] = rows
    return results


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "bench_distill_out")
    p.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks" / "distill.md")
    p.add_argument("--fast", action="store_true", help="toy sizes: a smoke test of every step")
    p.add_argument("--pairs", nargs="+", choices=list(PAIRS), default=list(PAIRS))
    p.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    p.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS), help="the first for every row")
    p.add_argument("--seed-rows", type=int, default=3, help="rows (besides ce) run again at the other seeds")
    p.add_argument("--draft-steps", type=int, help="override the drafts' optimizer steps")
    p.add_argument("--target-steps", type=int, help="override the steps of one round of the targets' training")
    args = p.parse_args(argv)
    sizes = FAST if args.fast else Sizes()
    size_name = "fast" if args.fast else "full"
    out = args.out.resolve() / size_name
    for key in ("draft_steps", "target_steps"):  # a variant of the sizes gets its own folder
        if getattr(args, key):
            sizes = replace(sizes, **{key: getattr(args, key)})
            out = out.parent / f"{out.name}-{key.replace('_', '')}{getattr(args, key)}"
    # the targets depend on the target sizes only: shared by every --draft-steps variant
    targets_dir = args.out.resolve() / "targets" / (
        size_name + (f"-targetsteps{args.target_steps}" if args.target_steps else ""))
    start = time.time()
    import torch
    torch.set_num_threads(THREADS)
    banner("data: the quickstart corpus and tokenizer")
    data = prepare_data(args.out.resolve(), out, sizes)
    targets = {name: run_pair(out, targets_dir, PAIRS[name], args.rows, sizes, data, args.seeds, args.seed_rows)
               for name in args.pairs}
    results = measured_rows(out)  # every pair and row measured so far, also by other invocations
    for name in set(results) - set(targets):
        rounds_log = targets_dir / name / "rounds.json"
        rounds = json.loads(rounds_log.read_text()) if rounds_log.is_file() else []
        targets[name] = {"rounds": rounds, "converged": target_converged([(r["steps"], r["heldout_ce"])
                                                                          for r in rounds])}
    command = "python " + " ".join(["scripts/bench_distill.py", *(argv if argv is not None else sys.argv[1:])])
    if not args.fast or args.doc != p.get_default("doc"):
        write_doc(args.doc, out, results, sizes, command, targets)
        print(f"wrote {args.doc}")
    print(f"done in {(time.time() - start) / 60:.1f} min")


if __name__ == "__main__":
    main()
