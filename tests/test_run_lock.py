"""One run at a time in an output folder (distill/outputs/run_lock.py): while a process holds train.output_dir, a
second run into it (a second resume, a fresh run started at the same moment) is refused in one line that names the
holder, before anything is read or written; the lock goes with the holder however it ends (SIGKILL included), and
the lock file it leaves makes no folder look used."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from distill.outputs.run_folder import previous_run_files
from distill.outputs.run_lock import LOCK_FILE, FolderInUse, hold_output_folder, release_output_folder

from helpers import CHILD_ENV, TINY_RECIPE

ROOT = Path(__file__).resolve().parents[1]
HOLD = ("import sys, time\n"
        "from distill.outputs.run_lock import hold_output_folder\n"
        "hold_output_folder(sys.argv[1])\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n")


def holder(folder: Path) -> subprocess.Popen:
    """Another process that holds `folder` as a run's main process does (returns once it holds it)."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=ROOT, stdout=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONPATH": str(ROOT), "RANK": "0"})
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_held_folder_is_refused_naming_its_holder_and_freed_when_the_holder_is_killed(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    folder = tmp_path / "run"
    process = holder(folder)
    try:
        with pytest.raises(FolderInUse) as refused:
            hold_output_folder(folder)
        command = " ".join(f"{sys.executable} -c {HOLD} {folder}".split())  # its command line, on one line
        assert str(refused.value) == (f"{folder} is in use by another run (pid {process.pid}: {command[:117]}...); "
                                      "wait for it to end, stop it, or choose another folder")
    finally:
        process.send_signal(signal.SIGKILL)  # no exit handler runs: the kernel lets go of the lock
        process.wait(timeout=30)
    hold_output_folder(folder)
    assert (folder / LOCK_FILE).read_text() == ""  # nothing written: a run that only reads its folder changes no file
    release_output_folder(folder)
    assert previous_run_files(folder) == []  # the lock file left behind is not a run


def test_a_process_holds_a_folder_once_and_lets_go_for_the_next(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    folder = tmp_path / "run"
    hold_output_folder(folder)
    hold_output_folder(folder)  # the same process again (resume checks, then the run): no conflict with itself
    release_output_folder(folder)
    process = holder(folder)  # released: another process takes it at once
    process.kill()
    process.wait(timeout=30)


def test_only_the_main_process_of_a_launch_locks(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    hold_output_folder(tmp_path / "run")
    assert not (tmp_path / "run").exists()


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
