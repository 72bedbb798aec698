"""What `pip install .` installs: the packages decode, distill and kinds and the console commands inside them (each
job's `specdistill-JOB` and the umbrella `specdistill`), never a top-level `scripts` (issue 20, part 2); and the entry
files in scripts/ run the same commands by path from any folder.

The fast tests read pyproject.toml. The integration tests build a wheel from a copy of the sources, install it with
--no-deps into a fresh venv of this interpreter (torch and the other dependencies come from this interpreter's
site-packages through a .pth file: nothing is downloaded), and run the installed commands from a folder outside the
repository.
"""
from __future__ import annotations

import importlib
import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tiny import save_and_load, tiny_model, tiny_tokenizer

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"decode", "distill", "kinds", "specdistill"}
COMMANDS = {  # console command -> (the module pyproject.toml names, the entry file in scripts/ that runs it by path)
    "specdistill-eval": ("specdistill.cli.eval", "eval_acceptance.py"),
    "specdistill-check": ("specdistill.cli.check", "check_deploy.py"),
    "specdistill-train": ("specdistill.cli.train", "train.py"),
    "specdistill-push": ("specdistill.cli.push", "push_to_hub.py"),
    "specdistill-data": ("specdistill.cli.data", "build_data.py"),
    "specdistill-bench-serve": ("specdistill.cli.bench_serve", "bench_serve.py"),
}
# `specdistill JOB ...` runs the commands above (no entry file: python -m)
UMBRELLA = ("specdistill", "specdistill.cli.main")


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def child_env() -> dict[str, str]:
    """This environment without PYTHONPATH (nothing of the checkout may leak into the child), one thread, offline."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def run(command: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `command` in `cwd`; fails the test with the tail of stderr unless it exits 0."""
    done = subprocess.run(command, cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-3000:])
    return done


# ---------------------------------------------------------------------------------------------------------------
# pyproject.toml: the commands point into the packages, and only the packages are found
# ---------------------------------------------------------------------------------------------------------------

def test_console_commands_are_modules_inside_the_packages():
    scripts = pyproject()["project"]["scripts"]
    umbrella, umbrella_module = UMBRELLA
    assert scripts == {**{prog: f"{module}:cli" for prog, (module, _) in COMMANDS.items()},
                       umbrella: f"{umbrella_module}:cli"}
    assert callable(importlib.import_module(umbrella_module).cli), umbrella
    for prog, (module, entry_file) in COMMANDS.items():
        assert callable(importlib.import_module(module).cli), prog
        # the entry file in scripts/ runs the same function
        assert f"from {module} import cli" in (ROOT / "scripts" / entry_file).read_text(), entry_file


def test_only_decode_distill_and_kinds_are_found():
    from setuptools import find_packages

    include = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    found = find_packages(where=str(ROOT), include=include)
    assert {name.split(".")[0] for name in found} == PACKAGES, found
    assert {"specdistill.cli", "decode.serving", "decode.loop", "kinds.eagle3", "kinds.dflash"} <= set(found)
    subpackages = {path.parent.relative_to(ROOT).as_posix().replace("/", ".")
                   for path in (ROOT / "distill").glob("*/__init__.py")}
    assert subpackages >= {"distill.losses", "distill.recipe", "distill.models", "distill.data", "distill.run"}
    assert subpackages <= set(found), sorted(subpackages - set(found))  # every subpackage of distill/ installs


# ---------------------------------------------------------------------------------------------------------------
# A real install into a fresh venv
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv holding the wheel built from a copy of the sources (scripts/ included, so leaving it out is the
    packaging's doing); returns the venv folder."""
    root = tmp_path_factory.mktemp("install")
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("decode", "distill", "kinds", "specdistill", "scripts"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    # built by this interpreter: --no-build-isolation builds with the setuptools and wheel of the interpreter that
    # builds, and the fresh venv has neither (nothing is fetched)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "--wheel-dir", str(root / "dist"), str(source)], cwd=root)
    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=root)
    wheel = next((root / "dist").glob("specdistill-*.whl"))
    run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
         "--no-index", str(wheel)], cwd=root)
    # the dependencies (torch, transformers, ...): this interpreter's site-packages, appended to the venv's path (a
    # path line: the .pth files there, the editable install of the checkout included, are not run). A venv made with
    # --system-site-packages would see the base interpreter's packages instead, not this venv's.
    (venv_site_packages(venv) / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    (root / "elsewhere").mkdir()
    return venv


def venv_site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


@pytest.mark.integration
def test_the_wheel_holds_only_the_library_packages(installed):
    wheel = next((installed.parent / "dist").glob("specdistill-*.whl"))
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {top for top in tops if not top.endswith(".dist-info")} == PACKAGES, tops
    installed_tops = {p.name for p in venv_site_packages(installed).iterdir()} - {"dependencies.pth"}
    assert {top for top in installed_tops if not top.endswith(".dist-info")} == PACKAGES, installed_tops
    program = ("import importlib.util, decode, distill; print(importlib.util.find_spec('scripts')); "
               "print(decode.__file__); print(distill.__file__)")
    spec, decode_file, distill_file = run([str(installed / "bin" / "python"), "-c", program],
                                          cwd=installed.parent / "elsewhere").stdout.split()
    assert spec == "None"  # no module called scripts anywhere on the installed path
    site_packages = str(venv_site_packages(installed))
    assert decode_file.startswith(site_packages) and distill_file.startswith(site_packages)


@pytest.mark.integration
@pytest.mark.parametrize("prog", sorted(COMMANDS) + [UMBRELLA[0]])
def test_each_installed_command_answers_help_outside_the_repository(installed, prog):
    done = run([str(installed / "bin" / prog), "--help"], cwd=installed.parent / "elsewhere")
    assert prog in done.stdout and "Traceback" not in done.stderr


@pytest.mark.integration
@pytest.mark.parametrize("prog", sorted(COMMANDS))
def test_the_installed_umbrella_answers_each_job_help(installed, prog):
    """`specdistill JOB --help` from the venv: the job's help, named `specdistill JOB`."""
    job = prog.removeprefix("specdistill-")
    done = run([str(installed / "bin" / UMBRELLA[0]), job, "--help"], cwd=installed.parent / "elsewhere")
    assert done.stdout.startswith(f"usage: specdistill {job} ") and "Traceback" not in done.stderr, done.stdout


@pytest.mark.integration
def test_the_installed_eval_measures_a_tiny_pair(installed):
    """specdistill-eval from the venv, end to end: a draft identical to its target is accepted everywhere (greedy)."""
    pair = installed.parent / "pair"
    tok = tiny_tokenizer()
    target = tiny_model("llama", seed=0, vocab_size=len(tok))
    save_and_load(target, pair / "target", tok)
    save_and_load(target, pair / "draft", tok)
    (pair / "prompts.txt").write_text("def add(a, b):\nclass Point:\n")
    out = pair / "eval.json"
    run([str(installed / "bin" / "specdistill-eval"), "--target", str(pair / "target"), "--draft",
         str(pair / "draft"), "--prompts", str(pair / "prompts.txt"), "--gamma", "3", "--max-new-tokens", "8",
         "--output", str(out), "--quiet"], cwd=installed.parent / "elsewhere")
    (result,) = json.loads(out.read_text())["results"]
    assert result["gamma"] == 3 and result["num_prompts"] == 2 and result["new_tokens"] == 16
    assert result["greedy_match"] == 1.0 and result["acceptance_rate"] == 1.0


@pytest.mark.integration
def test_the_installed_acceptance_metric_loads_offline_outside_the_repository(installed):
    """decode/metrics/acceptance ships in the wheel (package data): evaluate.load(decode.loop.stats.ACCEPTANCE_METRIC)
    from the venv, in a folder without a checkout, gives SpecStats' summaries of the same counts."""
    program = ("import json, evaluate, decode.loop.stats as s; m = evaluate.load(s.ACCEPTANCE_METRIC); "
               "r = m.compute(drafted=[4, 2], accepted=[2, 2], produced=[3, 3], min_pq=[[.9, .7, .2], [.8, .6]]); "
               "print(s.ACCEPTANCE_METRIC); print(json.dumps(r))")
    done = run([str(installed / "bin" / "python"), "-c", program], cwd=installed.parent / "elsewhere")
    path, result = done.stdout.strip().split("\n")[-2:]
    assert path.startswith(str(venv_site_packages(installed))), path
    result = json.loads(result)
    assert result["mean_accepted_tokens"] == 3.0  # 6 new tokens / 2 verify passes
    assert result["draft_acceptance_rate"] == 4 / 6
    assert result["acceptance_rate"] == pytest.approx((0.9 + 0.7 + 0.2 + 0.8 + 0.6) / 5)


# ---------------------------------------------------------------------------------------------------------------
# The entry files in scripts/: the same commands by path, from any folder, without installing
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.parametrize("prog", sorted(COMMANDS))
def test_each_entry_file_runs_by_path_from_another_folder(prog, tmp_path):
    """`python scripts/FILE --help` from another folder (runpy does what `python FILE` does: the file as __main__,
    its folder first on sys.path), then which file the command's module came from: this checkout's (the entry
    file's sys.path line), not another copy installed in this interpreter."""
    module, entry_file = COMMANDS[prog]
    path = ROOT / "scripts" / entry_file
    program = (f"import runpy, sys; sys.argv = [{str(path)!r}, '--help']; sys.path[0] = {str(path.parent)!r}\n"
               f"try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
               "except SystemExit as end:\n    assert not end.code, end.code\n"
               f"print(sys.modules[{module!r}].__file__)")
    done = run([sys.executable, "-c", program], cwd=tmp_path)
    assert prog in done.stdout
    assert done.stdout.split()[-1] == str(ROOT / Path(*module.split(".")).with_suffix(".py"))
