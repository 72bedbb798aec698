"""decode.serving.vllm_engine.run_worker: no process the vLLM worker starts outlives the command. The worker here is a
stand-in interpreter (a shell script) that starts a child of its own, as vLLM starts its engine core: a timeout,
SIGTERM to the command, a worker that ignores SIGTERM and a worker that ends leaving its child behind all end with
every process of the worker's group gone."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from decode.serving import vllm_engine
from decode.serving.vllm_engine import ServingError, run_worker

from helpers import CHILD_ENV, ROOT


def fake_python(tmp_path: Path, body: str) -> Path:
    """An executable called as `python WORKER REQUEST RESPONSE`: starts `sleep 300` in the background, writes its
    pid to $FAKE_CHILD_PID, then runs `body` ($3 is the response file)."""
    script = tmp_path / "python"
    script.write_text("#!/bin/bash\nsleep 300 &\necho $! > \"$FAKE_CHILD_PID\"\n" + body + "\n")
    script.chmod(0o755)
    return script


def child_pid(tmp_path: Path, within: float = 20.0) -> int:
    pid_file = tmp_path / "child.pid"
    deadline = time.monotonic() + within
    while not (pid_file.is_file() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline, "the stand-in worker never started its child"
        time.sleep(0.05)
    return int(pid_file.read_text())


def gone(pid: int, within: float = 15.0) -> bool:
    """Whether `pid` has ended (or is a zombie waiting for a parent to reap it) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def pid_file(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FAKE_CHILD_PID", str(tmp_path / "child.pid"))
    return tmp_path / "child.pid"


def test_a_timeout_stops_the_worker_and_what_it_started(tmp_path, pid_file):
    python = fake_python(tmp_path, "wait")
    started = time.monotonic()
    with pytest.raises(ServingError, match="did not finish within 1 s"):
        run_worker(python, {"x": 1}, timeout=1)
    assert time.monotonic() - started < 10
    assert gone(child_pid(tmp_path))


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace(tmp_path, pid_file, monkeypatch):
    monkeypatch.setattr(vllm_engine, "WORKER_STOP_GRACE_S", 1.0)
    python = fake_python(tmp_path, "trap '' TERM\nwhile true; do sleep 0.1; done")
    with pytest.raises(ServingError):
        run_worker(python, {}, timeout=1)
    assert gone(child_pid(tmp_path))


def test_a_finished_worker_leaves_nothing_behind(tmp_path, pid_file):
    python = fake_python(tmp_path, 'echo \'{"done": true}\' > "$3"')
    assert run_worker(python, {}) == {"done": True}
    assert gone(child_pid(tmp_path))


def test_a_failed_worker_is_one_line_and_leaves_nothing_behind(tmp_path, pid_file):
    python = fake_python(tmp_path, "echo 'ValueError: no such model' >&2\nexit 3")
    with pytest.raises(ServingError, match=r"vLLM failed \(exit 3\): ValueError: no such model"):
        run_worker(python, {})
    assert gone(child_pid(tmp_path))


def test_sigterm_to_the_command_stops_the_worker_group_then_the_command(tmp_path, pid_file):
    python = fake_python(tmp_path, "wait")
    command = textwrap.dedent(f"""
        from pathlib import Path
        from decode.serving.vllm_engine import run_worker
        run_worker(Path({str(python)!r}), {{}})
    """)
    env = {**os.environ, **CHILD_ENV, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen([sys.executable, "-c", command], env=env, cwd=ROOT) as parent:
        child = child_pid(tmp_path, within=60)
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=30) == -signal.SIGTERM  # ends by the signal, as it would have without us
    assert gone(child)
