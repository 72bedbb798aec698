"""Preemption: the signals a cluster sends before it kills (SLURM, Kubernetes and spot instances send SIGTERM and wait
a grace period; a user presses Ctrl-C; SLURM's --signal sends SIGUSR1; a terminal that closes, a dropped SSH session,
sends SIGHUP) stop a run cleanly. After SIGHUP, stdout and stderr that were the terminal write nowhere (a write to it
would fail and end the run unsaved): preempted.json says what happened. Under nohup (SIGHUP ignored) a run goes on
when its terminal closes, as nohup promises.

    signal arrives            -> noted (the first one); a watchdog starts: after train.preemption_grace_s the process
                                 exits with PREEMPTED_EXIT whatever it is doing (what resume reads is then the last
                                 complete checkpoint: checkpoints are written into .partial/ and renamed when whole)
    the step in progress ends -> every process agrees to stop at this step (one all-reduce of the flag per step under
                                 several processes: a signal that reached one rank stops them all at the same step);
                                 a checkpoint of it is saved (without the acceptance measurement, which a resume does)
    after training            -> preempted.json (signal, step, checkpoint, how to resume) in train.output_dir, and
                                 Preempted: specdistill-train prints one line and exits with PREEMPTED_EXIT

`train.resume_from_checkpoint=true` then continues bit for bit. A second SIGINT (Ctrl-C twice) exits at once with 130.

Outside training steps (loading models, preparing data, the last measurement, the export) there is no step to
finish: `stop_signals_raise` makes the signal raise StoppedOutsideTraining where the process is, so it ends with
PREEMPTED_EXIT and one line too (not silently, as SIGTERM's default would, nor with KeyboardInterrupt's traceback).
Every file the run writes is complete or absent, so nothing half-done is left where resume reads.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import TrainerCallback

from decode.inputs.writes import write_atomic
from distill.outputs.run_folder import RECIPE_FILE
from distill.utils import (  # noqa: F401 - PREEMPTED_EXIT: read from here by the commands and tests
    INTERRUPTED_TWICE_EXIT,
    PREEMPTED_EXIT,
    STOP_SIGNALS,
    crash_point,
    leave_a_closed_terminal,
    outlive_the_terminal,
    stop_signals,
)

logger = logging.getLogger(__name__)

SIGNALS = STOP_SIGNALS
STOP_FILE = "preempted.json"


@dataclass
class Preempted(Exception):
    """The run stopped on a signal after saving `checkpoint` at `step` in `output_dir`."""

    signal_name: str
    step: int
    output_dir: str

    def __str__(self) -> str:
        return (f"stopped by {self.signal_name} at step {self.step}: checkpoint-{self.step} is saved in "
                f"{self.output_dir}; continue with train.resume_from_checkpoint=true")


class StoppedOutsideTraining(Exception):
    """A stop signal arrived while no training step was running (loading, preparing data, measuring, exporting)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signal_name = signal.Signals(signum).name
        self.resume = "run the same command again"  # how to go on (the run's folder decides: resume_hint)

    def __str__(self) -> str:
        return (f"stopped by {self.signal_name} outside a training step (loading, preparing data, measuring or "
                f"exporting): every file written so far is complete; {self.resume}")


def resume_hint(output_dir: str, since: float) -> str:
    """How to go on after a stop: resume when this process began training in `output_dir` (its recipe.yaml, written
    as training begins, is newer than `since`, the process's start); else the same command again (it starts, resumes
    or overwrites as it says: nothing of this attempt was written)."""
    started = Path(output_dir) / RECIPE_FILE
    if started.is_file() and started.stat().st_mtime >= since:
        return "continue with train.resume_from_checkpoint=true"
    return "nothing of this attempt was written yet: run the same command again"


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[None]:
    """Inside the block a signal of SIGNALS raises StoppedOutsideTraining in the main thread, wherever it is; training
    installs its own handler over this one (PreemptionCallback) and restores it after. The previous handlers are
    restored on leaving. stdout and stderr that are a terminal survive its hang-up from here on (outlive_the_terminal).
    A no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outlive_the_terminal()

    def handler(signum: int, frame) -> None:
        leave_a_closed_terminal(signum)  # SIGHUP: the one line would go to a terminal that is gone
        raise StoppedOutsideTraining(signum)

    previous = {sig: signal.signal(sig, handler) for sig in stop_signals()}
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


class PreemptionCallback(TrainerCallback):
    """Stops training at the end of the optimizer step in progress when a signal of SIGNALS arrives, with a complete
    checkpoint of that step (see the module docstring)."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.received: int | None = None   # the first signal, on this process
        self.stopped_at: int | None = None  # the step every process stopped at
        self._previous: dict[int, object] = {}

    # ---- the handler ----------------------------------------------------------------------------------------------

    def install(self) -> None:
        """Handle SIGNALS in this process (the main thread only can; elsewhere the run keeps the default handlers)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in stop_signals():
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def _handle(self, signum: int, frame) -> None:
        leave_a_closed_terminal(signum)  # SIGHUP: the progress bar's next write to a terminal that is gone would fail
        if self.received is not None:
            if signum == signal.SIGINT:  # Ctrl-C twice: the user does not want to wait
                os._exit(INTERRUPTED_TWICE_EXIT)
            return
        self.received = signum
        logger.warning("%s received: finishing the step in progress, saving a checkpoint and stopping (at most %g s)",
                       signal.Signals(signum).name, self.grace_s)
        watchdog = threading.Timer(self.grace_s, self._out_of_time)
        watchdog.daemon = True
        watchdog.start()

    def _out_of_time(self) -> None:
        logger.error("the %g s grace period after %s ran out: exiting now; resume reads the last complete checkpoint",
                     self.grace_s, signal.Signals(self.received).name)
        logging.shutdown()
        os._exit(PREEMPTED_EXIT)

    # ---- the Trainer's events -------------------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, **kwargs):
        self.install()

    def on_step_begin(self, args, state, control, **kwargs):
        crash_point("train-step")  # test hook: SPECDISTILL_KILL_AT=train-step:K with SPECDISTILL_KILL_SIGNAL=TERM

    def on_step_end(self, args, state, control, **kwargs):
        if self.stopping_now(args.device):
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step

    def on_train_end(self, args, state, control, **kwargs):
        self.uninstall()

    def stopping_now(self, device: torch.device) -> bool:
        """Whether any process received a signal (one all-reduce under several processes, so all stop together)."""
        flag = self.received is not None
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            backend = torch.distributed.get_backend()
            tensor = torch.tensor([int(flag)], device=device if backend == "nccl" else "cpu")
            torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
            flag = bool(tensor.item())
            if flag and self.received is None:
                self.received = signal.SIGTERM  # another rank's signal: this one stops with it
        return flag

    @property
    def stopping(self) -> bool:
        """True once this run decided to stop on a signal (the checkpoint being saved is a preemption's)."""
        return self.stopped_at is not None

    # ---- after training -------------------------------------------------------------------------------------------

    def finish(self, output_dir: str, is_main_process: bool) -> None:
        """After training: raise Preempted (with preempted.json written by the main process) when the run stopped on a
        signal; otherwise remove a preempted.json an earlier, preempted attempt of this run left."""
        note = Path(output_dir) / STOP_FILE
        if self.stopped_at is None:
            if is_main_process:
                note.unlink(missing_ok=True)
            return
        stopped = Preempted(signal.Signals(self.received).name, self.stopped_at, output_dir)
        if is_main_process:
            write_atomic(note, json.dumps({
                "signal": stopped.signal_name, "step": stopped.step, "checkpoint": f"checkpoint-{stopped.step}",
                "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "exit_code": PREEMPTED_EXIT,
                "resume": "train.resume_from_checkpoint=true"}, indent=2) + "\n")
        raise stopped
