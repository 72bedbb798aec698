"""Inject faults into a tiny training run at random moments, resume it, and check it ends as the uninterrupted run did.

    python scripts/chaos_resume.py --runs 5 --seed 0 --workdir /tmp/chaos
    python scripts/chaos_resume.py --runs 10 --faults term flip full-disk --workdir /tmp/chaos

Fault classes (--faults, each trial draws one in turn):
    kill       SIGKILL at a random moment (the default)
    term       SIGTERM at a random moment: a preemption; the run saves the step in progress and exits 75
    flip       SIGKILL at a random moment, then one byte of the newest complete checkpoint flipped: resume must skip
               that checkpoint (its manifest) and redo its steps
    full-disk  the disk full at a random checkpoint save (SPECDISTILL_FULL_DISK_AT=checkpoint-save:K): the run stops
               in one line (exit 1) with nothing half-written; resume once there is space

Builds a tiny target (tests/tiny.py) unless --target/--dataset are given, runs the uninterrupted reference once,
then for each trial starts the same run, waits for it to write recipe.yaml (models loaded), SIGKILLs it after a
random delay drawn uniformly over the reference's time from that moment to its train_results.json, resumes it
(train.resume_from_checkpoint=true) and checks:
every checkpoint's weights bitwise equal to the reference's, the exported draft equal to the checkpoint it names,
and acceptance.jsonl holding every checkpoint's measurement once with the reference's numbers (the wall-clock
speedup columns aside). Prints one line per trial (where the kill landed, judged from what the folder held) and a
JSON summary; exit status 1 if any trial differs.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from distill.outputs.acceptance_log import complete_steps, read_records  # noqa: E402
from distill.outputs.checkpoints import PARTIAL_DIR, find_checkpoints  # noqa: E402

RECIPE = ROOT / "recipes" / "tiny_distill.yaml"
RUN = ("train.max_steps=12", "train.save_steps=4", "train.save_total_limit=null", "train.logging_steps=4",
       "train.report_to=[]", "data.num_eval_prompts=2", "eval.gammas=[2]", "eval.max_new_tokens=8")
MEASURED = ("step", "checkpoint", "gamma", "temperature", "acceptance_rate", "mean_accepted_tokens",
            "per_position_acceptance", "greedy_match", "num_prompts", "new_tokens")


def tiny_inputs(workdir: Path) -> tuple[Path, Path]:
    """A tiny Llama target with its tokenizer, and a small text file (tests/tiny.py)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny import TINY_TEXT, save_and_load, tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    save_and_load(tiny_model("llama", vocab_size=len(tok), hidden=32, layers=2), workdir / "target", tok)
    (workdir / "code.txt").write_text(TINY_TEXT)
    return workdir / "target", workdir / "code.txt"


def command(target: Path, dataset: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / "train.py"), str(RECIPE), f"model.target={target}",
            f"data.dataset={dataset}", f"train.output_dir={out}", *RUN, *extra]


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, env=environment(), cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"chaos_resume: error: a run failed ({done.returncode}): {done.stderr.strip()[-2000:]}")


def start_and_wait(cmd: list[str], out: Path) -> tuple[subprocess.Popen, bool]:
    """Start a run and return once it has written recipe.yaml (models loaded, training about to start)."""
    (out / "recipe.yaml").unlink(missing_ok=True)  # overwrite_output_dir deletes the rest once the run starts
    process = subprocess.Popen(cmd, env=environment(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while process.poll() is None and not (out / "recipe.yaml").is_file():
        time.sleep(0.05)
    return process, process.poll() is None


def killed_at(out: Path) -> str:
    """Where the kill landed, judged from what the output folder holds."""
    if not (out / "recipe.yaml").is_file():
        return "before training (loading, tokenising)"
    if (out / "train_results.json").is_file():
        return "after train_results.json was written (while exiting)"
    partial = out / PARTIAL_DIR
    if partial.is_dir() and any(partial.iterdir()):
        return "during a checkpoint save"
    saved = {int(p.name.split("-")[1]) for p in find_checkpoints(out).complete}
    measured = complete_steps(read_records(out), gammas=[2], temperatures=[0.0])
    if saved - measured:
        return f"during the acceptance measurement of step {max(saved - measured)}"
    if saved and max(saved) == 12:
        return "during the export"
    return f"during training (after step {max(saved, default=0)})"


def measured_rows(out: Path) -> list[tuple]:
    return sorted(tuple(json.dumps(r.get(k)) for k in MEASURED) for r in read_records(out))


def differences(out: Path, reference: Path) -> list[str]:
    """What differs between a resumed run and the reference (empty: the same run)."""
    from safetensors.torch import load_file
    import torch

    problems = []
    for folder in find_checkpoints(reference).complete:
        ours, theirs = out / folder.name / "model.safetensors", folder / "model.safetensors"
        if not ours.is_file():
            problems.append(f"{folder.name} missing")
            continue
        a, b = load_file(ours), load_file(theirs)
        if a.keys() != b.keys() or not all(torch.equal(a[k], b[k]) for k in a):
            problems.append(f"{folder.name} weights differ")
    if measured_rows(out) != measured_rows(reference):
        problems.append("acceptance.jsonl differs")
    results = out / "train_results.json"
    if not results.is_file():
        problems.append("no train_results.json")
    else:
        best = json.loads(results.read_text())["best"]["checkpoint"]
        exported, saved = load_file(out / "model.safetensors"), load_file(out / best / "model.safetensors")
        if not all(torch.equal(exported[k], saved[k]) for k in saved):
            problems.append("exported draft differs from its checkpoint")
    return problems


FAULTS = ("kill", "term", "flip", "full-disk")
EXPECTED_EXIT = {"kill": (-signal.SIGKILL,), "term": (75, -signal.SIGTERM), "flip": (-signal.SIGKILL,),
                 "full-disk": (1,)}  # SIGTERM before training starts (no handler yet) ends the process at once


def flip_newest(out: Path) -> str:
    """Flip one byte of the newest complete checkpoint's weights when an older complete one remains to resume from;
    returns which (empty: none flipped)."""
    complete = find_checkpoints(out).complete
    if len(complete) < 2:
        return ""
    newest = complete[-1]
    weights = newest / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-17] ^= 0x01
    weights.write_bytes(bytes(data))
    return newest.name


def inject(fault: str, rng: random.Random, span: float, target: Path, dataset: Path, out: Path) -> dict:
    """One trial of `fault`: the faulty run, then what it left. Returns the trial's record (before resuming)."""
    cmd = command(target, dataset, out, "train.overwrite_output_dir=true")
    if fault == "full-disk":
        save = rng.randint(1, 3)  # checkpoint-4, -8 or -12
        env = {**environment(), "SPECDISTILL_FULL_DISK_AT": f"checkpoint-save:{save}"}
        for stale in (out / "recipe.yaml", out / "train_results.json"):
            stale.unlink(missing_ok=True)
        done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        errors = [line for line in done.stderr.splitlines() if line.startswith("specdistill-train: error: ")]
        partial = out / PARTIAL_DIR
        clean = not (partial.is_dir() and any(partial.iterdir()))
        one_line = len(errors) == 1 and "no space left on the device of " in errors[0] and "Traceback" not in \
            done.stderr
        return {"fault": f"full disk at save {save}", "exit": done.returncode, "one_line": one_line,
                "nothing_half_written": clean}
    delay = rng.uniform(0.0, span)
    process, _ = start_and_wait(cmd, out)
    time.sleep(delay)
    finished_first = process.poll() is not None
    process.send_signal(signal.SIGTERM if fault == "term" else signal.SIGKILL)
    code = process.wait()
    where = "after the run had finished" if finished_first else killed_at(out)
    note = out / "preempted.json"
    if fault == "term" and code == 75 and note.is_file():
        where = f"during step {json.loads(note.read_text())['step']}, saved as its checkpoint (preempted)"
    elif fault == "term" and code == -signal.SIGTERM:
        where = "before training began (loading: no handler yet, no step to lose)"
    record = {"fault": f"{fault} after {delay:.1f} s {where}", "exit": code}
    if fault == "flip":
        record["flipped"] = flip_newest(out)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="trials per fault class")
    parser.add_argument("--faults", nargs="+", choices=FAULTS, default=["kill"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--target", type=Path)
    parser.add_argument("--dataset", type=Path)
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    target, dataset = (args.target, args.dataset) if args.target else tiny_inputs(args.workdir)
    rng = random.Random(args.seed)

    # ---- the uninterrupted reference: how long its training phase (recipe.yaml -> train_results.json) lasts ----
    reference = args.workdir / "reference"
    (reference / "train_results.json").unlink(missing_ok=True)
    process, _ = start_and_wait(command(target, dataset, reference, "train.overwrite_output_dir=true"), reference)
    started = time.perf_counter()
    while process.poll() is None and not (reference / "train_results.json").is_file():
        time.sleep(0.02)
    span = time.perf_counter() - started
    if process.wait() != 0:
        raise SystemExit("chaos_resume: error: the reference run failed")
    print(f"reference run: {span:.1f} s from recipe.yaml (training starts) to train_results.json (run done)")

    # ---- trials: a fault at a random moment of the training phase, resume, compare ----
    trials = []
    for trial in range(args.runs * len(args.faults)):
        fault = args.faults[trial % len(args.faults)]
        out = args.workdir / f"trial{trial}"
        record = inject(fault, rng, span, target, dataset, out)
        problems = [] if record["exit"] in EXPECTED_EXIT[fault] or record["exit"] == 0 else \
            [f"exit code {record['exit']}"]
        if fault == "full-disk" and record["exit"] != 0:
            problems += [name for name in ("one_line", "nothing_half_written") if not record[name]]
        resume = ("train.resume_from_checkpoint=true",) if (out / "recipe.yaml").is_file() else (
            "train.overwrite_output_dir=true",)
        run(command(target, dataset, out, *resume))
        problems += differences(out, reference)
        trials.append({"trial": trial, "class": fault, **record, "same_run": not problems, "problems": problems})
        print(f"trial {trial} ({fault}): {record['fault']}, exit {record['exit']}"
              f"{', flipped ' + record['flipped'] if record.get('flipped') else ''}; resumed: "
              f"{'bitwise-equal weights, complete acceptance log' if not problems else '; '.join(problems)}")
    summary = {fault: {"runs": sum(t["class"] == fault for t in trials),
                       "same_run": sum(t["class"] == fault and t["same_run"] for t in trials)} for fault in args.faults}
    same = sum(t["same_run"] for t in trials)
    print(json.dumps({"runs": len(trials), "same_run": same, "by_fault": summary, "trials": trials}, indent=2))
    return 0 if same == len(trials) else 1


if __name__ == "__main__":
    raise SystemExit(main())
