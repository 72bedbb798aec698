"""specdistill.cli.launch.leave_launch_directly: a process of a multi-process launch ends with its status and everything
it printed or logged, without the interpreter's teardown (where a gloo worker thread can abort the process after
the run is done); a single process ends as usual."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from helpers import CHILD_ENV, ROOT

BODY = textwrap.dedent("""
    import atexit, logging, sys
    from specdistill.cli.launch import leave_launch_directly
    atexit.register(lambda: print("teardown ran", flush=True))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with leave_launch_directly(statuses=(0, 75)):
        print("printed, not flushed", end="")
        logging.getLogger("x").info("logged")
        {end}
""")


def finish(end: str, world_size: int) -> subprocess.CompletedProcess:
    env = {**CHILD_ENV, "WORLD_SIZE": str(world_size), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", BODY.format(end=end)], env=env, capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


@pytest.mark.parametrize("end, status", [("pass", 0), ("raise SystemExit(75)", 75), ("raise SystemExit(None)", 0)])
def test_a_process_of_a_launch_leaves_with_its_status_and_its_output_but_no_teardown(end, status):
    done = finish(end, world_size=2)
    assert done.returncode == status
    assert done.stdout == "printed, not flushed"  # flushed; the atexit handler never ran
    assert "logged" in done.stderr


@pytest.mark.parametrize("end, status", [("raise SystemExit(76)", 76), ("raise SystemExit('a message')", 1)])
def test_another_status_ends_as_usual(end, status):
    """An error's process leaves through the teardown: the launcher sees the process that failed first first."""
    done = finish(end, world_size=2)
    assert done.returncode == status
    assert done.stdout == "printed, not flushedteardown ran\n"


@pytest.mark.parametrize("end, status", [("pass", 0), ("raise SystemExit(75)", 75)])
def test_a_single_process_ends_as_usual(end, status):
    done = finish(end, world_size=1)
    assert done.returncode == status
    assert done.stdout == "printed, not flushedteardown ran\n"


def test_an_unexpected_error_keeps_its_traceback():
    done = finish("raise ValueError('unexpected')", world_size=2)
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "ValueError: unexpected" in done.stderr
