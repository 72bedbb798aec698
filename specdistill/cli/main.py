"""One command for every job: ``specdistill JOB ...`` runs the job's own console entry point.

    specdistill --help                       # the jobs, one line each
    specdistill train RECIPE.yaml key=value  # = specdistill-train RECIPE.yaml key=value
    specdistill eval --help                  # the job's full help (prog `specdistill eval`)
    specdistill data prompts --help
    specdistill --version

Each job is the `cli(argv, prog)` of the module its `specdistill-JOB` alias names in pyproject.toml: the same
parser, flags, exit codes and one-line errors, with `specdistill JOB` as the program name. The job's module is
imported only when the job runs, so `specdistill --help` loads no torch. An unknown job is a one-line usage error
naming the closest job (exit 1, as every usage error of these commands:
decode.inputs.command_line.OneLineArgumentParser).
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType
from typing import NoReturn

from specdistill.cli.closed_pipe import quiet_on_a_closed_pipe

PROG = "specdistill"


@dataclass(frozen=True)
class Job:
    """A job of the umbrella: its name, the module whose `cli(argv, prog)` and `build_parser(prog)` run and describe
    it (the `specdistill-NAME` alias's, pyproject.toml), and its line in `specdistill --help`."""

    name: str
    module: str
    summary: str

    @property
    def prog(self) -> str:
        return f"{PROG} {self.name}"

    @property
    def alias(self) -> str:
        return f"{PROG}-{self.name}"


# in the order a user meets them: data, train, measure, check, publish
JOBS = (
    Job("data", "specdistill.cli.data", "build training data once: prompts, the target's responses, hidden states"),
    Job("train", "specdistill.cli.train", "distil a draft model from a recipe (RECIPE.yaml key=value ...)"),
    Job("eval", "specdistill.cli.eval",
        "measure a draft against its target: acceptance, mean accepted tokens, speedup"),
    Job("check", "specdistill.cli.check", "check that an exported draft serves next to its target; print the commands"),
    Job("bench-serve", "specdistill.cli.bench_serve",
        "serve the target alone and with its draft, load both over HTTP: throughput, latency, ratio"),
    Job("push", "specdistill.cli.push", "upload a draft model folder with a model card built from measured numbers"),
)


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage error is one line `specdistill: error: ...` and exit status 1, as the jobs' parsers
    (decode.inputs.command_line.OneLineArgumentParser: not imported here, since any decode module loads torch)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(1)


class JobsHelpFormatter(argparse.HelpFormatter):
    """Each job and its line on one line: argparse measures the jobs' names one indent short, so a name as long as
    bench-serve would push its line below it."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=120)
        self._action_max_length = max(len(job.name) for job in JOBS) + 4  # the jobs' indent


def package_version() -> str:
    """The installed distribution's version ('unknown' when the sources run without being installed)."""
    try:
        return version(PROG)
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def build_parser() -> ArgumentParser:
    """The umbrella's own options and its list of jobs (for --help and --version: a job's arguments are parsed by
    the job itself)."""
    p = ArgumentParser(prog=PROG, description="Train draft models for speculative decoding and measure them.",
                       formatter_class=JobsHelpFormatter,
                       epilog=f"`{PROG} JOB --help` shows a job's flags. The {PROG}-JOB commands "
                              f"({', '.join(job.alias for job in JOBS)}) still work: they run the same code.")
    p.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    listing = p.add_subparsers(title="jobs", dest="job", metavar="JOB")
    for job in JOBS:
        listing.add_parser(job.name, help=job.summary, add_help=False)
    return p


def find_job(name: str, parser: argparse.ArgumentParser) -> Job:
    """The job called `name`; an unknown name is a one-line usage error naming the closest job (exit 1)."""
    names = [job.name for job in JOBS]
    if name in names:
        return JOBS[names.index(name)]
    closest = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {closest[0]!r}?" if closest else ""
    parser.error(f"unknown job {name!r}{hint} (jobs: {', '.join(names)})")


def job_module(job: Job) -> ModuleType:
    """The module that runs `job` (imported now: torch and the rest load only for the job that runs)."""
    return importlib.import_module(job.module)


@quiet_on_a_closed_pipe
def cli(argv: list[str] | None = None) -> None:
    """Console entry point `specdistill` (argv: sys.argv[1:] when None): no arguments print the help (exit 0)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv:
        parser.print_help()
        raise SystemExit(0)
    if argv[0].startswith("-"):
        parser.parse_args(argv)  # --help and --version exit here; any other option is a one-line usage error
        parser.error(f"name a job first: {PROG} JOB ... (jobs: {', '.join(job.name for job in JOBS)})")
    job = find_job(argv[0], parser)
    job_module(job).cli(argv[1:], prog=job.prog)


if __name__ == "__main__":
    cli()
