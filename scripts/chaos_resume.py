"""Inject faults into a tiny training run at random moments, resume it, and check it ends as the uninterrupted run did.

    python scripts/chaos_resume.py --runs 5 --seed 0 --workdir /tmp/chaos
    python scripts/chaos_resume.py --runs 10 --faults term flip full-disk --workdir /tmp/chaos

Fault classes (--faults, each trial draws one in turn):
    kill       SIGKILL at a random moment (the default)
    term       SIGTERM at a random moment: a preemption; the run saves the step in progress and exits 75 (outside a
               training step: it stops where it is and exits 75)
    flip       SIGKILL at a random moment once two checkpoints are complete, then one byte of the newest flipped:
               resume must skip that checkpoint (its manifest) and redo its steps
    full-disk  the disk full at a random checkpoint save (SPECDISTILL_FULL_DISK_AT=checkpoint-save:K): the run stops
               in one line (exit 1) with nothing half-written; resume once there is space
    dead-rank  the run on two CPU processes (accelerate launch, gloo); SIGKILL of one rank, drawn at random, at a
               random moment: the other must stop within DEAD_RANK_BOUND_S (exit 76 with one line, or the launcher's
               SIGTERM), no traceback of ours; resume on two processes, compared with the two-process reference
    stale      a run with a teacher cache (distill.teacher_cache), then 1-8 random rows of the target's embedding
               changed in place (half the trials by less than bfloat16 resolves), the same command again: it must be
               refused in one line naming distill.teacher_cache, the cache untouched (0 stale caches reused); a new
               cache folder then trains

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
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from distill.outputs.acceptance_log import complete_steps, read_records
from distill.outputs.checkpoints import PARTIAL_DIR, find_checkpoints

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


def command(target: Path, dataset: Path, out: Path, *extra: str, processes: int = 1) -> list[str]:
    """The tiny run; on two CPU processes with processes=2 (accelerate launch, DDP over gloo, as the docs give it)."""
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"] if processes > 1 else \
        [sys.executable]
    return [*launch, str(ROOT / "scripts" / "train.py"), str(RECIPE), f"model.target={target}",
            f"data.dataset={dataset}", f"train.output_dir={out}", *RUN, *extra]


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "ACCELERATE_USE_CPU": "true"}


def run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, env=environment(), cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"chaos_resume: error: a run failed ({done.returncode}): {done.stderr.strip()[-2000:]}")


def start_and_wait(cmd: list[str], out: Path, stderr=subprocess.DEVNULL) -> tuple[subprocess.Popen, bool]:
    """Start a run and return once it has written recipe.yaml (models loaded, training about to start)."""
    (out / "recipe.yaml").unlink(missing_ok=True)  # overwrite_output_dir deletes the rest once the run starts
    process = subprocess.Popen(cmd, env=environment(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr,
                               text=True)
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
    if (partial / "export").is_dir():
        return "during the export"
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
    import torch
    from safetensors.torch import load_file

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


FAULTS = ("kill", "term", "flip", "full-disk", "dead-rank", "stale")
# SIGTERM while Python starts (no handler yet) ends the process at once; a dead rank fails the launcher (1)
EXPECTED_EXIT = {"kill": (-signal.SIGKILL,), "term": (75, -signal.SIGTERM), "flip": (-signal.SIGKILL,),
                 "full-disk": (1,), "dead-rank": (1,), "stale": (1,)}
DEAD_RANK_BOUND_S = 60.0  # the survivor of a dead rank stops within this (gloo sees the closed connection at once)
ERROR = "specdistill-train: error: "


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


def ranks_of(launcher: int) -> dict[int, int]:
    """RANK -> pid of the processes a launcher started (its children that have RANK in their environment)."""
    ranks = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            variables = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        rank = next((v[5:] for v in variables if v.startswith(b"RANK=")), None)
        if parent == launcher and rank is not None:
            ranks[int(rank)] = int(entry.name)
    return ranks


def one_line_errors(stderr: str) -> tuple[list[str], bool]:
    """Our error lines (a progress bar may share their terminal line) and whether no traceback of ours is there."""
    return [x for x in re.split(r"[\r\n]", stderr) if x.startswith(ERROR)], "distill/" not in stderr


def kill_a_rank(rng: random.Random, span: float, target: Path, dataset: Path, out: Path) -> dict:
    """dead-rank: SIGKILL one rank of a two-process run at a random moment; how long the other took to stop."""
    cmd = command(target, dataset, out, "train.overwrite_output_dir=true", processes=2)
    process, running = start_and_wait(cmd, out, stderr=subprocess.PIPE)
    delay = rng.uniform(0.0, span)
    time.sleep(delay)
    ranks = ranks_of(process.pid)
    victim = rng.choice(sorted(ranks)) if ranks and process.poll() is None else None
    where = killed_at(out)
    if victim is not None:
        os.kill(ranks[victim], signal.SIGKILL)
    killed = time.monotonic()
    try:
        _, stderr = process.communicate(timeout=DEAD_RANK_BOUND_S + 60)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
    stopped = time.monotonic() - killed
    errors, no_traceback = one_line_errors(stderr)
    if victim is None:
        return {"fault": f"dead rank: none, the run had finished after {delay:.1f} s", "exit": process.returncode,
                "stopped_s": 0.0, "one_line": True}
    survivors = [line for line in errors if "stopped or stopped answering in a collective" in line]
    return {"fault": f"rank {victim} of 2 killed after {delay:.1f} s {where}", "exit": process.returncode,
            "stopped_s": round(stopped, 1), "bounded": stopped < DEAD_RANK_BOUND_S,
            "one_line": no_traceback and len(survivors) == len(errors) <= 1}


def cache_digest(folder: Path) -> str:
    """sha256 of every file of a folder (names and bytes)."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(folder)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def change_target_sparsely(rng: random.Random, target: Path) -> str:
    """Change 1-8 random rows of the embedding in place: by a relative 2**-12 (below what bfloat16 resolves, so a
    bfloat16-rounded sample of the weights would not see it) or by 1e-2. Returns what was changed."""
    from safetensors.torch import load_file, save_file

    weights = target / "model.safetensors"
    tensors = load_file(weights)
    name = next(k for k in tensors if "embed_tokens" in k)
    rows = rng.sample(range(tensors[name].shape[0]), rng.randint(1, 8))
    tiny = rng.random() < 0.5
    tensors[name][rows] *= (1 + 2 ** -12) if tiny else 1.01
    save_file(tensors, weights, metadata={"format": "pt"})
    return f"{len(rows)} embedding rows scaled by {'1 + 2^-12' if tiny else '1.01'}"


def stale_target(rng: random.Random, target: Path, dataset: Path, out: Path) -> dict:
    """stale: a run builds a teacher cache; the target changes sparsely; the same command must refuse the cache."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shutil.copytree(target, out / "target")
    cache = out / "teacher_cache"

    def train(folder: Path, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(command(out / "target", dataset, folder, f"distill.teacher_cache={cache}",
                                      "distill.temperature=1.0", *extra),
                              env=environment(), cwd=ROOT, capture_output=True, text=True)

    first = train(out / "run")
    if first.returncode != 0:
        raise SystemExit(f"chaos_resume: error: the cache-building run failed: {first.stderr.strip()[-2000:]}")
    before = cache_digest(cache)
    change = change_target_sparsely(rng, out / "target")
    again = train(out / "run", "train.overwrite_output_dir=true")
    errors, no_traceback = one_line_errors(again.stderr)
    refused = len(errors) == 1 and errors[0].startswith(ERROR + "distill.teacher_cache: ") and no_traceback
    untouched = cache_digest(cache) == before
    return {"fault": f"target changed after its cache was built: {change}", "exit": again.returncode,
            "one_line": refused, "stale_cache_reused": again.returncode == 0 or not untouched}


def inject(fault: str, rng: random.Random, span: float, target: Path, dataset: Path, out: Path) -> dict:
    """One trial of `fault`: the faulty run, then what it left. Returns the trial's record (before resuming)."""
    if fault == "dead-rank":
        return kill_a_rank(rng, span, target, dataset, out)
    if fault == "stale":
        return stale_target(rng, target, dataset, out)
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
    if fault == "flip":  # killed once two checkpoints are complete, before the run ends: there is one to flip
        started = time.monotonic()
        while process.poll() is None and len(find_checkpoints(out).complete) < 2:
            time.sleep(0.02)
        waited = time.monotonic() - started
        delay = waited + rng.uniform(0.0, max(0.0, span - waited) * 0.8)
        time.sleep(delay - waited)
    else:
        time.sleep(delay)
    finished_first = process.poll() is not None
    process.send_signal(signal.SIGTERM if fault == "term" else signal.SIGKILL)
    code = process.wait()
    where = "after the run had finished" if finished_first else killed_at(out)
    note = out / "preempted.json"
    if fault == "term" and code == 75 and note.is_file():
        where = f"during step {json.loads(note.read_text())['step']}, saved as its checkpoint (preempted)"
    elif fault == "term" and code == 75:
        where += ", outside a training step: stopped where it was, in one line"
    elif fault == "term" and code == -signal.SIGTERM:
        where = "while Python was starting (before any handler: nothing to lose)"
    record = {"fault": f"{fault} after {delay:.1f} s {where}", "exit": code}
    if fault == "flip":
        record["flipped"] = flip_newest(out)
    return record


def uninterrupted(target: Path, dataset: Path, out: Path, processes: int = 1) -> tuple[Path, float]:
    """The run never interrupted, and the seconds from recipe.yaml (training starts) to train_results.json."""
    (out / "train_results.json").unlink(missing_ok=True)
    process, _ = start_and_wait(command(target, dataset, out, "train.overwrite_output_dir=true",
                                        processes=processes), out)
    started = time.perf_counter()
    while process.poll() is None and not (out / "train_results.json").is_file():
        time.sleep(0.02)
    span = time.perf_counter() - started
    if process.wait() != 0:
        raise SystemExit(f"chaos_resume: error: the reference run on {processes} process(es) failed")
    return out, span


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

    # ---- the uninterrupted references: how long the training phase (recipe.yaml -> train_results.json) lasts ----
    reference, span = uninterrupted(target, dataset, args.workdir / "reference")
    print(f"reference run: {span:.1f} s from recipe.yaml (training starts) to train_results.json (run done)")
    if "dead-rank" in args.faults:
        reference2, span2 = uninterrupted(target, dataset, args.workdir / "reference2", processes=2)
        print(f"reference run on two processes: {span2:.1f} s")

    # ---- trials: a fault at a random moment of the training phase, resume, compare ----
    trials = []
    for trial in range(args.runs * len(args.faults)):
        fault = args.faults[trial % len(args.faults)]
        out = args.workdir / f"trial{trial}"
        processes, compared_with = (2, reference2) if fault == "dead-rank" else (1, reference)
        record = inject(fault, rng, span2 if fault == "dead-rank" else span, target, dataset, out)
        problems = [] if record["exit"] in EXPECTED_EXIT[fault] or record["exit"] == 0 else \
            [f"exit code {record['exit']}"]
        problems += [name for name in ("one_line", "nothing_half_written", "bounded") if record.get(name) is False]
        if fault == "stale":
            problems += ["the stale cache was used"] if record["stale_cache_reused"] else []
            fresh = out / "fresh_cache"  # what the user does next: a new cache folder for the changed target
            run(command(out / "target", dataset, out / "run", f"distill.teacher_cache={fresh}",
                        "distill.temperature=1.0", "train.overwrite_output_dir=true"))
            outcome = "refused in one line, the cache untouched; a new cache folder trained" if not problems else \
                "; ".join(problems)
        else:
            resume = ("train.resume_from_checkpoint=true",) if (out / "recipe.yaml").is_file() else (
                "train.overwrite_output_dir=true",)
            run(command(target, dataset, out, *resume, processes=processes))
            problems += differences(out, compared_with)
            outcome = "bitwise-equal weights, complete acceptance log" if not problems else "; ".join(problems)
        trials.append({"trial": trial, "class": fault, **record, "same_run": not problems, "problems": problems})
        details = [f"flipped {record['flipped']}"] if record.get("flipped") else []
        details += [f"the other rank stopped {record['stopped_s']} s later"] if record.get("stopped_s") else []
        print(f"trial {trial} ({fault}): {record['fault']}, exit {record['exit']}"
              f"{''.join(', ' + d for d in details)}; resumed: {outcome}")
    summary = {fault: {"runs": sum(t["class"] == fault for t in trials),
                       "same_run": sum(t["class"] == fault and t["same_run"] for t in trials)} for fault in args.faults}
    same = sum(t["same_run"] for t in trials)
    stale = sum(bool(t.get("stale_cache_reused")) for t in trials)
    print(json.dumps({"runs": len(trials), "same_run": same, "stale_caches_reused": stale, "by_fault": summary,
                      "trials": trials}, indent=2))
    return 0 if same == len(trials) else 1


if __name__ == "__main__":
    raise SystemExit(main())
