"""Preemption (distill/run/preemption.py): SIGTERM, SIGINT or SIGUSR1 during a step ends that step, saves a complete
checkpoint of it without measuring it, writes preempted.json and exits with 75; the resumed run measures what lacks its
lines and ends equal, bit for bit, to a run that was never stopped. A signal outside the grace period's reach (a step
that never ends) exits within the grace period. The signal arrives at an exact moment: SPECDISTILL_KILL_AT=train-step:K
with SPECDISTILL_KILL_SIGNAL sends it to the run itself as step K begins. Outside training steps (the models just
loaded, the export) the same signals end the run with 75 and one line too, and resume ends bit for bit."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_kill_resume import RUN, STEPS, reference, workdir  # the tiny run of those tests  # noqa: F401 - module fixtures: the tiny pair, the uninterrupted run

from distill.outputs.acceptance_log import read_records
from distill.run.preemption import PREEMPTED_EXIT, STOP_FILE
from distill.utils import KILL_ENV, SIGNAL_ENV

from helpers import TINY_RECIPE

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def command(workdir: Path, out: str, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / "train.py"), TINY_RECIPE, f"model.target={workdir / 'target'}",
            f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={workdir / out}", *RUN, *extra]


def signalled_run(workdir: Path, out: str, step: int, name: str) -> subprocess.CompletedProcess:
    env = {**ENV, KILL_ENV: f"train-step:{step}", SIGNAL_ENV: name}
    return subprocess.run(command(workdir, out), env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.integration
@pytest.mark.parametrize("name, step", [("TERM", 6), ("INT", 3), ("USR1", 9)])
def test_a_signal_saves_the_step_in_progress_and_resume_ends_bit_for_bit(workdir, reference, name, step):
    done = signalled_run(workdir, f"signal_{name}", step, name)
    assert done.returncode == PREEMPTED_EXIT, done.stderr[-3000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line == (f"specdistill-train: stopped by SIG{name} at step {step}: checkpoint-{step} is saved in "
                    f"{workdir / f'signal_{name}'}; continue with train.resume_from_checkpoint=true"), line
    folder = workdir / f"signal_{name}"
    note = json.loads((folder / STOP_FILE).read_text())
    assert note["signal"] == f"SIG{name}" and note["step"] == step and note["exit_code"] == PREEMPTED_EXIT
    assert (folder / f"checkpoint-{step}" / "model.safetensors").is_file()  # no finished optimizer step lost
    assert not (folder / "train_results.json").exists() and not (folder / "model.safetensors").exists()
    assert step not in {r["step"] for r in read_records(folder)}  # the grace period went to the save, not a measurement
    resumed = subprocess.run(command(workdir, f"signal_{name}", "train.resume_from_checkpoint=true"), env=ENV,
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for saved in STEPS:
        ours, theirs = (load_file(f / f"checkpoint-{saved}" / "model.safetensors") for f in (folder, reference))
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours), saved
    assert {r["step"] for r in read_records(folder)} == set(STEPS)  # an off-schedule preemption save is not measured
    assert not (folder / STOP_FILE).exists()  # the run finished: the note of its preemption is gone


@pytest.mark.integration
@pytest.mark.parametrize("point, name, again", [
    ("models-loaded", "TERM", "nothing of this attempt was written yet: run the same command again"),
    ("export", "INT", "continue with train.resume_from_checkpoint=true"),
])
def test_a_signal_outside_training_steps_exits_75_in_one_line_and_the_run_goes_on_bit_for_bit(workdir, reference,
                                                                                              point, name, again):
    """SIGTERM right after the models load (nothing written yet) and SIGINT during the export (every checkpoint
    saved): no traceback, exit 75 with one line saying how to go on, and the run, gone on as it says, ends as the
    uninterrupted one."""
    out = f"outside_{point}"
    env = {**ENV, KILL_ENV: point, SIGNAL_ENV: name}
    done = subprocess.run(command(workdir, out), env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == PREEMPTED_EXIT, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"specdistill-train: stopped by SIG{name} outside a training step (loading, preparing data, measuring or "
        f"exporting): every file written so far is complete; {again}")
    assert "Traceback" not in done.stderr
    folder = workdir / out
    assert not (folder / "train_results.json").exists()
    if point == "models-loaded":
        assert not list(folder.glob("checkpoint-*"))
    extra = ("train.resume_from_checkpoint=true",) if "resume" in again else ()
    resumed = subprocess.run(command(workdir, out, *extra), env=ENV, cwd=ROOT, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for saved in STEPS:
        ours, theirs = (load_file(f / f"checkpoint-{saved}" / "model.safetensors") for f in (folder, reference))
        assert all(torch.equal(ours[k], theirs[k]) for k in ours), saved
    best = json.loads((folder / "train_results.json").read_text())["best"]["checkpoint"]
    exported = load_file(folder / "model.safetensors")
    assert all(torch.equal(exported[k], v) for k, v in load_file(folder / best / "model.safetensors").items())


@pytest.mark.integration
def test_a_signal_from_outside_stops_a_long_run_within_seconds(workdir):
    """As a scheduler sends it: SIGTERM at some moment of a long run; the run saves the step it was in and exits 75."""
    process = subprocess.Popen(command(workdir, "outside", "train.max_steps=100000", "train.save_steps=100000",
                                       "train.report_to=[tensorboard]"),  # its runs/ folder: the sign training began
                               env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list((workdir / "outside" / "runs").glob("*")):
        time.sleep(0.2)  # TensorBoard's folder appears when training begins
    assert time.monotonic() < deadline, "training never began"
    time.sleep(2)
    process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == PREEMPTED_EXIT, stderr[-3000:]
    assert time.monotonic() - sent < 20
    step = json.loads((workdir / "outside" / STOP_FILE).read_text())["step"]
    assert step > 0 and (workdir / "outside" / f"checkpoint-{step}" / "trainer_state.json").is_file()


def test_the_grace_period_bounds_the_exit_when_a_step_never_ends(tmp_path):
    """A step that hangs past train.preemption_grace_s: the watchdog exits with 75 after the grace period."""
    script = (
        "import os, signal, time\n"
        "from distill.run.preemption import PreemptionCallback\n"
        "callback = PreemptionCallback(grace_s=1.0)\n"
        "callback.install()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(60)\n"  # a step that never ends
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], env=ENV, cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == PREEMPTED_EXIT, done.stderr[-2000:]
    assert 0.9 < time.monotonic() - started < 20
    assert "grace period after SIGTERM ran out" in done.stderr


def test_ctrl_c_twice_exits_at_once(tmp_path):
    script = (
        "import os, signal, time\n"
        "from distill.run.preemption import PreemptionCallback\n"
        "callback = PreemptionCallback(grace_s=60.0)\n"
        "callback.install()\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(0.2)\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], env=ENV, cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 130 and time.monotonic() - started < 20


@pytest.mark.parametrize("module, runs, attribute, expected", [
    ("train", "specdistill.cli.train", "main",
     "specdistill-train: stopped by SIGUSR1 outside a training step (loading, preparing data, measuring or "
     "exporting): every file written so far is complete; run the same command again"),
    ("data", "specdistill.cli.data_run", "run",
     "specdistill-data: stopped by SIGUSR1 outside a shard build (loading or finishing): every file written "
     "so far is complete; run the same command again to resume"),
])
def test_a_signal_while_a_command_loads_is_one_line_and_the_handlers_are_restored(monkeypatch, capsys, tmp_path,
                                                                                  module, runs, attribute, expected):
    """The signal lands inside the command's run (as while loading a model), after its command line was read: exit
    75, one line; after the command the process's own handlers are back."""
    import importlib

    command_module = importlib.import_module(f"specdistill.cli.{module}")
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}

    def loading(*_args, **_kwargs):
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(5)  # interrupted by the handler's exception
        raise AssertionError("the signal did not stop the command")

    monkeypatch.setattr(importlib.import_module(runs), attribute, loading)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model: {}\n")  # read by no one: the run is replaced; the command checks it exists
    with pytest.raises(SystemExit) as exit_info:
        command_module.cli([str(recipe)] if module == "train" else ["hidden-states", str(recipe)])
    assert exit_info.value.code == PREEMPTED_EXIT
    assert capsys.readouterr().err.strip().splitlines() == [expected]
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_a_run_that_fails_mid_training_leaves_the_handlers_as_they_were(workdir, monkeypatch, tmp_path):
    """A step that raises ends the run without on_train_end: the handlers training installed go all the same (else a
    later SIGTERM to this process would wait for a step that no longer runs)."""
    from distill.run.trainer import DistillTrainer
    from specdistill.cli import train

    def failing_step(self, *args, **kwargs):
        assert signal.getsignal(signal.SIGTERM) not in before.values()  # training's own handler is installed
        raise RuntimeError("a step that fails")

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    monkeypatch.setattr(DistillTrainer, "training_step", failing_step)
    with pytest.raises(RuntimeError, match="a step that fails"):
        train.main(command(workdir, str(tmp_path / "failed"))[2:])
    assert {sig: signal.getsignal(sig) for sig in before} == before


@pytest.mark.integration
def test_a_closed_terminal_saves_the_step_in_progress(workdir):
    """A run in a terminal that closes (an SSH session dropped without tmux or nohup): the kernel sends SIGHUP, and
    every later write to the terminal fails. The run saves the step it was in and exits 75, preempted.json naming
    SIGHUP; the progress bar's writes after the hang-up go nowhere instead of ending the run unsaved."""
    import pty
    import select

    out = workdir / "hung_up"
    argv = command(workdir, "hung_up", "train.max_steps=100000", "train.save_steps=100000",
                   "train.report_to=[tensorboard]")
    pid, terminal = pty.fork()  # the child's stdout and stderr are the terminal; it is the session's leader
    if pid == 0:
        os.chdir(ROOT)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as in a login session (a suite run under nohup ignores it)
        os.execve(argv[0], argv, ENV)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list((out / "runs").glob("*")):
        if select.select([terminal], [], [], 0.2)[0]:  # read what the run writes, as a terminal does
            with contextlib.suppress(OSError):
                os.read(terminal, 65536)
    assert time.monotonic() < deadline, "training never began"
    end = time.monotonic() + 2
    while time.monotonic() < end:  # a few steps with the progress bar running
        if select.select([terminal], [], [], 0.1)[0]:
            os.read(terminal, 65536)
    os.close(terminal)  # the terminal closes: SIGHUP to the run
    hung_up = time.monotonic()
    while (waited := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() - hung_up < 60:
        time.sleep(0.1)
    if waited == (0, 0):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the run did not stop within 60 s of its terminal closing")
    assert os.waitstatus_to_exitcode(waited[1]) == PREEMPTED_EXIT
    note = json.loads((out / STOP_FILE).read_text())
    assert note["signal"] == "SIGHUP" and note["step"] > 0
    assert (out / f"checkpoint-{note['step']}" / "trainer_state.json").is_file()


def test_under_nohup_a_closed_terminal_changes_nothing():
    """SIGHUP ignored (nohup): training's handler and the handler outside training leave it ignored, and a SIGHUP
    neither stops the run nor touches its output; the other stop signals are handled as always."""
    script = (
        "import os, signal, sys\n"
        "from distill.run.preemption import PreemptionCallback, stop_signals_raise\n"
        "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "with stop_signals_raise():\n"
        "    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN\n"
        "    callback = PreemptionCallback(grace_s=60.0)\n"
        "    callback.install()\n"
        "    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN\n"
        "    assert signal.getsignal(signal.SIGTERM) == callback._handle\n"
        "    os.kill(os.getpid(), signal.SIGHUP)\n"
        "    assert callback.received is None\n"
        "    callback.uninstall()\n"
        "print('still here', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=ENV, cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout == "still here\n", done.stderr[-2000:]


def test_a_write_waiting_on_a_terminal_that_closes_does_not_end_the_process(tmp_path):
    """A dropped SSH session often stalls output first: the process waits in a write to its terminal when the
    terminal goes, and that write fails (EIO) before any SIGHUP handler can run. Inside the commands' signal block
    such a write sends the stream to /dev/null and the process goes on (SIGHUP ignored here, to see the write
    alone)."""
    import pty

    ready, done = tmp_path / "writing", tmp_path / "went_on"
    script = ("import signal, sys\n"
              "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
              "from distill.run.preemption import stop_signals_raise\n"
              "with stop_signals_raise():\n"
              f"    open({str(ready)!r}, 'w').close()\n"
              "    for _ in range(2000):\n"
              "        print('x' * 1000, file=sys.stderr, flush=True)\n"  # fills the terminal nobody reads
              f"open({str(done)!r}, 'w').close()\n")
    pid, terminal = pty.fork()
    if pid == 0:
        os.chdir(ROOT)
        os.execve(sys.executable, [sys.executable, "-c", script], ENV)
    deadline = time.monotonic() + 120
    while not ready.exists() and time.monotonic() < deadline:  # its imports done: the terminal is still there
        time.sleep(0.1)
    time.sleep(2)  # the child waits in a write: nobody reads the terminal
    os.close(terminal)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and done.exists()
