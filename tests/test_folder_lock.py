"""One writer at a time in a folder (decode/inputs/folder_lock.py). While a process holds train.output_dir, a second
run into it (a second resume, a fresh run started at the same moment) is refused in one line that names the holder,
before anything is read or written; the lock goes with the holder however it ends (SIGKILL included), and the lock
file it leaves makes no folder look used. A cache another process is building is waited for: two data commands
started at once into one folder both end with the file of one command alone."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from decode.inputs.folder_lock import BUILD_LOCK, RUN_LOCK, FolderInUse, hold_folder, release_folder
from distill.outputs.run_folder import previous_run_files

from helpers import CHILD_ENV, TINY_RECIPE

ROOT = Path(__file__).resolve().parents[1]
HOLD = ("import sys, time\n"
        "from decode.inputs.folder_lock import hold_folder\n"
        "hold_folder(sys.argv[1], sys.argv[2])\n"
        "print('held', flush=True)\n"
        "time.sleep(float(sys.argv[3]))\n")


def holder(folder: Path, name: str = RUN_LOCK, seconds: float = 120) -> subprocess.Popen:
    """Another process that holds `folder` as a run's main process does (returns once it holds it)."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), name, str(seconds)], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT), "RANK": "0"})
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_held_folder_is_refused_naming_its_holder_and_freed_when_the_holder_is_killed(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    folder = tmp_path / "run"
    process = holder(folder)
    try:
        with pytest.raises(FolderInUse) as refused:
            hold_folder(folder, RUN_LOCK)
        command = " ".join(f"{sys.executable} -c {HOLD} {folder} {RUN_LOCK} 120".split())  # on one line
        assert str(refused.value) == (f"{folder} is in use by another run (pid {process.pid}: {command[:117]}...); "
                                      "wait for it to end, stop it, or choose another folder")
    finally:
        process.send_signal(signal.SIGKILL)  # no exit handler runs: the kernel lets go of the lock
        process.wait(timeout=30)
    hold_folder(folder, RUN_LOCK)
    assert (folder / RUN_LOCK).read_text() == ""  # nothing written: a run that only reads its folder changes no file
    release_folder(folder, RUN_LOCK)
    assert previous_run_files(folder) == []  # the lock file left behind is not a run


def test_a_process_holds_a_folder_once_and_lets_go_for_the_next(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    folder = tmp_path / "run"
    hold_folder(folder, RUN_LOCK)
    hold_folder(folder, RUN_LOCK)  # the same process again (resume checks, then the run): no conflict with itself
    release_folder(folder, RUN_LOCK)
    assert not folder.exists()  # created by the lock and left empty (a run refused by a later check): gone
    hold_folder(folder, RUN_LOCK)
    (folder / "recipe.yaml").write_text("train: {}\n")
    release_folder(folder, RUN_LOCK)
    assert sorted(p.name for p in folder.iterdir()) == [RUN_LOCK, "recipe.yaml"]  # a run's folder stays
    process = holder(folder)  # released: another process takes it at once
    process.kill()
    process.wait(timeout=30)


def test_only_the_main_process_of_a_launch_locks(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    hold_folder(tmp_path / "run", RUN_LOCK)
    assert not (tmp_path / "run").exists()


def test_the_other_processes_of_a_launch_refuse_a_folder_another_launch_holds(tmp_path, monkeypatch):
    """RANK 1 does not lock, but where a process of another launch (whose parent is not this process's launcher)
    holds the folder it stops with the main process's line; held by its own launch's main process (the same
    parent), it goes on."""
    monkeypatch.setenv("RANK", "1")
    folder = tmp_path / "run"
    process = holder(folder)  # its parent: this process, not this process's parent
    try:
        with pytest.raises(FolderInUse, match=f"is in use by another run \\(pid {process.pid}: "):
            hold_folder(folder, RUN_LOCK)
        monkeypatch.setattr(os, "getppid", os.getpid)  # as if this process and the holder shared their launcher
        hold_folder(folder, RUN_LOCK)
        hold_folder(folder, BUILD_LOCK, waiting="a cache")  # a build lock: the main process alone waits
    finally:
        process.kill()
        process.wait(timeout=30)


@pytest.mark.integration
def test_a_second_resume_into_a_running_folder_is_one_line_and_touches_nothing(tmp_path):
    """specdistill-train with train.resume_from_checkpoint=true into a folder another run holds: exit 1 with one line
    naming the folder and the holder; the folder's files are as they were (and the folder is checked first: the
    target and the dataset, which do not exist, are never reached)."""
    folder = tmp_path / "run"
    process = holder(folder)
    (folder / "checkpoint-4").mkdir()
    (folder / "checkpoint-4" / "trainer_state.json").write_text('{"global_step": 4}')
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    try:
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), TINY_RECIPE,
                               f"train.output_dir={folder}", "train.resume_from_checkpoint=true",
                               f"model.target={tmp_path / 'target'}", f"data.dataset={tmp_path / 'code.txt'}"],
                              cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env={**os.environ, **CHILD_ENV, "PYTHONPATH": str(ROOT)})
    finally:
        process.kill()
        process.wait(timeout=30)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        f"specdistill-train: error: {TINY_RECIPE}: train.output_dir: {folder} is in use by another run (pid "
        f"{process.pid}: {sys.executable} -c "), done.stderr[-2000:]
    assert done.stderr.strip().endswith("); wait for it to end, stop it, or choose another folder")
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before


def test_a_cache_being_built_is_waited_for_in_one_line(tmp_path, monkeypatch, caplog):
    """A build lock another process holds: one warning naming the cache and the holder, then the wait, until the
    holder lets go (here: it exits after 3 s)."""
    monkeypatch.delenv("RANK", raising=False)
    folder = tmp_path / "cache"
    process = holder(folder, BUILD_LOCK, seconds=3)
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="decode.inputs.folder_lock"):
        hold_folder(folder, BUILD_LOCK, waiting=f"teacher cache {folder}")
    waited = time.monotonic() - started
    release_folder(folder, BUILD_LOCK)
    process.wait(timeout=30)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"teacher cache {folder}: waiting for pid {process.pid}: {sys.executable} -c ")
    assert line.endswith(f", which holds {folder / BUILD_LOCK}")
    assert 1.5 < waited < 30


@pytest.mark.integration
def test_two_data_commands_into_one_folder_at_once_end_as_one_alone(tmp_path):
    """The runs of a sweep started together, sharing a cache: two `specdistill data responses` into one --out at once
    both exit 0 (the second to take the lock waits for the first, then finds every shard written), and the file is
    that of one command run alone."""

    from tiny import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer(320)
    tokenizer.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
                               "{% if add_generation_prompt %}<s>assistant\n{% endif %}")
    tiny_model("llama", seed=0, vocab_size=320, hidden=32, layers=2).save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def g{i}(y):"}) + "\n" for i in range(96)))
    command = [sys.executable, "-m", "specdistill.cli.data", "responses", "--target", str(tmp_path / "target"),
               "--prompts", str(prompts), "--max-new-tokens", "8", "--batch-size", "4", "--shard-size", "8"]
    env = {**os.environ, **CHILD_ENV, "PYTHONPATH": str(ROOT)}
    both = [subprocess.Popen([*command, "--out", str(tmp_path / "shared")], cwd=ROOT, env=env, text=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]
    errors = [process.communicate(timeout=300)[1] for process in both]
    assert [process.returncode for process in both] == [0, 0], [e[-2000:] for e in errors]
    assert not any("Traceback" in e for e in errors)
    subprocess.run([*command, "--out", str(tmp_path / "alone")], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=300)
    assert (tmp_path / "shared" / "train.jsonl").read_text() == (tmp_path / "alone" / "train.jsonl").read_text()


@pytest.mark.integration
def test_a_two_process_launch_into_a_held_folder_stops_at_once_and_says_it_once(tmp_path):
    """`accelerate launch` of 2 processes resuming a folder another run holds: both processes stop within seconds
    (the second did wait in the process group's set-up for the main one until the launcher killed it, 30 s later),
    and the line is printed once."""
    from helpers import accelerate_command

    folder = tmp_path / "run"
    process = holder(folder)
    (folder / "checkpoint-4").mkdir()  # something to resume: the folder's checks pass on every process
    (folder / "checkpoint-4" / "trainer_state.json").write_text('{"global_step": 4}')
    started = time.monotonic()
    try:
        done = subprocess.run(accelerate_command(ROOT / "scripts" / "train.py", TINY_RECIPE,
                                                 f"train.output_dir={folder}", "train.resume_from_checkpoint=true",
                                                 f"model.target={tmp_path / 'target'}",
                                                 f"data.dataset={tmp_path / 'code.txt'}"),
                              cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env={**os.environ, **CHILD_ENV, "ACCELERATE_USE_CPU": "true", "PYTHONPATH": str(ROOT)})
    finally:
        process.kill()
        process.wait(timeout=30)
    assert done.returncode != 0
    assert time.monotonic() - started < 25, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if "is in use by another run" in line]
    assert len(lines) == 1 and lines[0].startswith(f"specdistill-train: error: {TINY_RECIPE}: train.output_dir: "
                                                   f"{folder} is in use by another run (pid {process.pid}: "), lines
