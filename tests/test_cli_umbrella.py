"""The umbrella command `specdistill JOB ...` (specdistill.cli.main): it lists every job, answers each job's help and
errors exactly as the job's `specdistill-JOB` alias does (its program name aside), refuses an unknown job in one
line naming the closest, loads no torch for its own help; and docs/reference/cli.md is what specdistill.cli.reference
generates from the same parsers."""
from __future__ import annotations

import argparse
import importlib
import logging
import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import NamedTuple

import pytest

from specdistill.cli import main as umbrella
from specdistill.cli.main import JOBS, Job, job_module
from specdistill.cli.reference import GENERATE, PAGE, cell, reference_markdown, subcommands

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
JOB = {job.name: job for job in JOBS}


class Ran(NamedTuple):
    code: int
    out: str
    err: str


def run(cli: Callable[..., None], argv: list[str], capsys, **kwargs: str) -> Ran:
    """Call a console entry point in this process; its exit status and what it printed (logging handlers that the
    command added are removed: the next call's capsys gets a fresh one)."""
    root, before = logging.getLogger(), list(logging.getLogger().handlers)
    try:
        cli(argv, **kwargs)
        code = 0
    except SystemExit as end:
        code = end.code if isinstance(end.code, int) else int(end.code is not None)
    finally:
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)
    printed = capsys.readouterr()
    return Ran(code, printed.out, printed.err)


def through_both(job: Job, argv: list[str], capsys) -> tuple[Ran, Ran]:
    """`specdistill JOB argv` with its program name written as the alias's, and `specdistill-JOB argv`."""
    ran = run(umbrella.cli, [job.name, *argv], capsys)
    as_alias = Ran(ran.code, ran.out.replace(job.prog, job.alias), ran.err.replace(job.prog, job.alias))
    return as_alias, run(job_module(job).cli, argv, capsys)


@pytest.fixture(autouse=True)
def fixed_width(monkeypatch):
    """argparse wraps help at $COLUMNS: the same width for every call (wide enough that no job line wraps)."""
    monkeypatch.setenv("COLUMNS", "200")


# ---------------------------------------------------------------------------------------------------------------
# The jobs: the aliases' modules, listed by the top-level help
# ---------------------------------------------------------------------------------------------------------------

def test_each_job_runs_the_module_its_alias_names():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["specdistill"] == "specdistill.cli.main:cli"
    assert {name: target for name, target in scripts.items() if name != "specdistill"} == \
        {job.alias: f"{job.module}:cli" for job in JOBS}


def test_the_help_lists_every_job_with_its_line(capsys):
    ran = run(umbrella.cli, ["--help"], capsys)
    assert ran.code == 0 and not ran.err
    lines = ran.out.splitlines()
    assert lines[0] == "usage: specdistill [-h] [--version] JOB ..."
    for job in JOBS:
        assert any(line.split() == [job.name, *job.summary.split()] for line in lines), (job.name, ran.out)
        assert job.alias in ran.out  # the aliases still work, and the help says so
    assert run(umbrella.cli, [], capsys) == ran  # no arguments: the same help, exit 0


def test_version_is_the_installed_distribution(capsys):
    assert run(umbrella.cli, ["--version"], capsys) == Ran(0, f"specdistill {version('specdistill')}\n", "")


def test_python_dash_m_specdistill_is_the_command():
    """`python -m specdistill ...` (a venv whose scripts are not on PATH) answers as `specdistill ...` does."""
    done = subprocess.run([sys.executable, "-m", "specdistill", "evl"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip() == ("specdistill: error: unknown job 'evl'; did you mean 'eval'? (jobs: data, train, "
                                   "eval, check, bench-serve, push)")
    version_line = subprocess.run([sys.executable, "-m", "specdistill", "--version"], cwd=ROOT, capture_output=True,
                                  text=True, timeout=120).stdout
    assert version_line == f"specdistill {version('specdistill')}\n"


def test_the_top_level_help_loads_no_torch():
    program = ("import sys\nfrom specdistill.cli.main import cli\ntry:\n    cli(['--help'])\n"
               "except SystemExit:\n    pass\n"
               "print(sorted({name.split('.')[0] for name in sys.modules} & {'torch', 'transformers', 'decode'}))")
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "[]", done.stdout[-2000:]


@pytest.mark.parametrize("argv", [["train", "--help"], ["train"]])
def test_the_train_help_loads_no_torch(argv):
    """`specdistill train --help` (or no recipe) prints its help without the trainer: torch and transformers are
    imported when a recipe runs."""
    program = (f"import sys\nfrom specdistill.cli.main import cli\ntry:\n    cli({argv!r})\n"
               "except SystemExit:\n    pass\n"
               "print(sorted({name.split('.')[0] for name in sys.modules} & {'torch', 'transformers', 'peft'}))")
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage: specdistill train [-h] RECIPE.yaml [key=value ...]" in done.stdout, done.stdout[-2000:]
    assert done.stdout.splitlines()[-1] == "[]", done.stdout[-2000:]


# ---------------------------------------------------------------------------------------------------------------
# Each job's help and errors are its alias's
# ---------------------------------------------------------------------------------------------------------------

def help_commands() -> list[list[str]]:
    """[job] and [job, subcommand] for every job and every subcommand (specdistill data prompts, ...)."""
    commands = []
    for job in JOBS:
        commands.append([job.name])
        commands += [[job.name, sub.prog.split()[-1]] for sub in subcommands(job_module(job).build_parser(job.prog))]
    return commands


HELP_COMMANDS = help_commands()


@pytest.mark.parametrize("argv", [[*command, "--help"] for command in HELP_COMMANDS]
                         + [[job.name, "--no-such-flag"] for job in JOBS], ids=" ".join)
def test_every_help_and_usage_error_answers_before_torch_loads(argv):
    """Every job's and subcommand's `--help`, and a usage error of every job, answer from the parser alone: torch,
    transformers and peft are imported when a job runs (each command module imports its run only after the parse)."""
    program = (f"import sys\nfrom specdistill.cli.main import cli\ntry:\n    cli({argv!r})\n    code = 0\n"
               "except SystemExit as stop:\n    code = stop.code or 0\nprint('exit', code)\n"
               "print(sorted({name.split('.')[0] for name in sys.modules} & {'torch', 'transformers', 'peft'}))")
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=120)
    *_, code, loaded = done.stdout.splitlines()
    assert code == ("exit 0" if argv[-1] == "--help" else "exit 1"), done.stdout[-2000:] + done.stderr[-2000:]
    assert loaded == "[]", f"{argv}: {loaded}"


def test_the_help_commands_reach_the_data_subcommands():
    assert {("data", "prompts"), ("data", "responses"), ("data", "hidden-states")} <= set(map(tuple, HELP_COMMANDS))


@pytest.mark.parametrize("command", HELP_COMMANDS, ids=" ".join)
def test_each_job_help_is_its_alias_help(command, capsys):
    job, rest = JOB[command[0]], command[1:]
    through_umbrella, through_alias = through_both(job, [*rest, "--help"], capsys)
    assert through_alias.code == 0 and through_alias.out.startswith(f"usage: {job.alias}"), through_alias
    assert through_umbrella == through_alias
    shown = run(umbrella.cli, command + ["--help"], capsys).out
    assert shown.startswith(f"usage: {' '.join(['specdistill', *command])} [-h]"), shown  # named `specdistill JOB`


# past the parser: each refused by the job's own checks, before anything loads ({tmp} is an empty folder)
REFUSED = {
    "eval": (["--target", "{tmp}/t", "--draft", "{tmp}/d", "--prompts", "{tmp}/p.txt", "--gamma", "0"],
             "error: --gamma must be >= 1"),
    "check": (["--target", "{tmp}/t", "--draft", "{tmp}/d"], "is not a model folder with a config.json"),
    "bench-serve": (["--target", "{tmp}/t", "--draft", "prompt-lookup", "--prompts", "{tmp}/p.txt", "--output",
                     "{tmp}/o.json", "--vllm-python", sys.executable], "GuideLLM is not installed"),
    "train": (["{tmp}/recipe.yaml", "train.max_steps=1"], "recipe file not found"),
    "push": (["{tmp}/out", "--repo-id", "me/draft", "--dry-run"], "does not exist"),
    "data": (["hidden-states", "{tmp}/recipe.yaml"], "recipe file not found"),
}


def test_every_job_has_a_refused_run():
    assert set(REFUSED) == set(JOB)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_dispatch_runs_the_job_and_answers_its_one_line_error(name, tmp_path, capsys):
    job, argv, expected = JOB[name], [a.format(tmp=tmp_path) for a in REFUSED[name][0]], REFUSED[name][1]
    through_umbrella, through_alias = through_both(job, argv, capsys)
    assert through_alias.code == 1 and through_alias.err.count("\n") == 1 and expected in through_alias.err, \
        through_alias
    assert "Traceback" not in through_alias.err
    assert through_umbrella == through_alias
    assert job.alias not in run(umbrella.cli, [name, *argv], capsys).err  # the job names itself `specdistill JOB`


@pytest.mark.parametrize("argv", [["eval", "--gamma", "nan"], ["data"], ["data", "promts"], ["push", "--step", "x"]],
                         ids=" ".join)
def test_a_usage_error_names_the_job_as_specdistill_job(argv, capsys):
    ran = run(umbrella.cli, argv, capsys)
    assert ran.code == 1 and ran.err.startswith(f"specdistill {argv[0]}: error: ") and ran.err.count("\n") == 1, ran


# ---------------------------------------------------------------------------------------------------------------
# An unknown job
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("typed, closest", [("trian", "train"), ("evl", "eval"), ("chek", "check"), ("dat", "data"),
                                            ("psuh", "push")])
def test_a_typo_is_one_line_naming_the_closest_job(typed, closest, capsys):
    ran = run(umbrella.cli, [typed, "--help"], capsys)
    assert ran == Ran(1, "", f"specdistill: error: unknown job {typed!r}; did you mean {closest!r}? "
                             f"(jobs: data, train, eval, check, bench-serve, push)\n")


def test_an_unknown_job_or_option_is_one_line_too(capsys):
    assert run(umbrella.cli, ["xyzzy"], capsys) == Ran(
        1, "", "specdistill: error: unknown job 'xyzzy' (jobs: data, train, eval, check, bench-serve, push)\n")
    assert run(umbrella.cli, ["--frobnicate"], capsys) == Ran(
        1, "", "specdistill: error: unrecognized arguments: --frobnicate\n")


def test_the_umbrella_refuses_with_the_exit_status_of_the_jobs(capsys):
    """A usage error exits as the jobs' own do (decode.inputs.command_line.OneLineArgumentParser), so that
    `specdistill trian` and `specdistill data promts` agree."""
    assert run(umbrella.cli, ["trian"], capsys).code == run(job_module(JOB["data"]).cli, ["promts"], capsys).code


def test_the_installed_command_answers(tmp_path):
    """The console script pip put next to this interpreter (the editable install: `pip install -e .`)."""
    command = Path(sys.executable).parent / "specdistill"
    assert command.exists(), f"{command} is missing: run `pip install --no-deps --no-build-isolation -e .`"
    done = subprocess.run([str(command), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and all(job.name in done.stdout for job in JOBS), done
    done = subprocess.run([str(command), "trian"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (1, "") and done.stderr.splitlines() == [
        "specdistill: error: unknown job 'trian'; did you mean 'train'? "
        "(jobs: data, train, eval, check, bench-serve, push)"]


# ---------------------------------------------------------------------------------------------------------------
# docs/reference/cli.md
# ---------------------------------------------------------------------------------------------------------------

def test_the_reference_page_is_current():
    page = ROOT / PAGE
    assert page.is_file(), f"{PAGE} is missing: run `{GENERATE}`"
    assert page.read_text() == reference_markdown(), f"{PAGE} is stale: run `{GENERATE}`"


def test_the_reference_page_has_every_command_and_every_argument():
    page = reference_markdown()
    assert page.startswith("# Command-line reference\n\nGenerated from the commands' own parsers by `python -m ")
    for command in HELP_COMMANDS:
        job = JOB[command[0]]
        parser = job_module(job).build_parser(job.prog)
        parser = next((sub for sub in subcommands(parser) if sub.prog.split()[-1] == command[-1]), parser)
        heading = "#" * (1 + len(command)) + " " + " ".join(["specdistill", *command])
        assert f"\n{heading}\n" in page, heading
        section = page.split(f"\n{heading}\n", 1)[1].split("\n#", 1)[0]
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            written = action.option_strings[-1] if action.option_strings else action.metavar or action.dest
            assert f"| `{written}" in section or f", {written}" in section, (heading, written)
            if action.help and "%(" not in action.help:  # expanded on the page, as --help does
                assert cell(action.help) in section, (heading, action.help)


def test_the_reference_page_does_not_depend_on_the_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    narrow = reference_markdown()
    monkeypatch.setenv("COLUMNS", "300")
    assert reference_markdown() == narrow


def test_a_table_cell_is_one_line_with_pipes_escaped():
    assert cell("exits 1 when |a / b - 1|\n  exceeds <this>") == "exits 1 when \\|a / b - 1\\| exceeds &lt;this>"


@pytest.mark.parametrize(("name", "argv", "patched", "left"), [
    ("check", ["--target", "t", "--draft", "d"], "specdistill.cli.check.run", "nothing was written"),
    ("push", ["out", "--repo-id", "me/draft"], "specdistill.cli.push.main",
     "an upload is one commit, made last: run the same command again")])
def test_ctrl_c_in_a_job_is_one_line_and_exit_130(name, argv, patched, left, monkeypatch, capsys):
    """Ctrl-C where the job is (KeyboardInterrupt from its run): one line saying what is left, exit 130 (eval's
    real process: tests/test_eval_cli.py; train and data stop at a step or shard: tests/test_preemption.py)."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    module, attribute = patched.rsplit(".", 1)
    monkeypatch.setattr(importlib.import_module(module), attribute, interrupted)
    with pytest.raises(SystemExit) as exit_info:
        umbrella.cli([name, *argv])
    assert exit_info.value.code == 130
    assert capsys.readouterr().err.strip().splitlines() == [f"specdistill {name}: interrupted; {left}"]
