"""scripts/gpu_check.sh stops before any step when its interpreter lacks a dependency of pyproject.toml, naming each
one (a GPU image once measured everything and lost every eval JSON at the end for want of `evaluate`)."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or sys.version_info < (3, 11),
                                reason="needs bash, and tomllib (Python 3.11) in the interpreter it checks")


def run(python: str, tmp_path: Path, step: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), step], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": python}, timeout=120)


def test_missing_packages_stop_the_script_before_any_step(tmp_path):
    done = run(f"{sys.executable} -S", tmp_path, "tests")  # -S: no site-packages, so no dependency is installed
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("gpu_check.sh: missing Python packages: torch transformers datasets")
    assert " evaluate " in line and "deepspeed" not in line  # ZeRO training only: never needed here
    assert not (tmp_path / "out" / "tests.log").exists()  # no step ran


def test_an_interpreter_with_every_package_passes_the_check(tmp_path):
    done = run(sys.executable, tmp_path, "nonsense")  # the project's venv: the check passes, the step is refused
    assert done.returncode == 2
    assert done.stderr.strip() == "gpu_check.sh: unknown step 'nonsense' (tests, decode, overhead, head or train)"
