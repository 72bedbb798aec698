"""The command-line reference page, docs/reference/cli.md, generated from the commands' own argparse parsers.

    python -m specdistill.cli.reference > docs/reference/cli.md

One section per job of `specdistill` (specdistill.cli.main.JOBS) and per subcommand of `specdistill data`: its
description, its usage line and a table of its arguments (default and help, as `--help` shows them). The text does
not depend on the terminal: usage lines wrap at WIDTH columns. tests/test_cli_umbrella.py fails when the page
differs from what this prints.
"""
from __future__ import annotations

import argparse

from specdistill.cli.main import JOBS, build_parser, job_module

PAGE = "docs/reference/cli.md"
WIDTH = 100  # usage lines wrap here, whatever the terminal
GENERATE = f"python -m specdistill.cli.reference > {PAGE}"


def cell(text: str) -> str:
    """Text for one markdown table cell (or paragraph): one line, `|` escaped, no HTML tags."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def is_required(action: argparse.Action) -> bool:
    """Whether the command refuses to run without it (a `*` or `?` positional may be left out, whatever argparse's
    version marks it)."""
    return action.required and action.nargs not in (argparse.ZERO_OR_MORE, argparse.OPTIONAL)


def default_text(action: argparse.Action) -> str:
    """The default column: `required`, the default value, or empty (no value: None, an off switch)."""
    if is_required(action):
        return "required"
    default = action.default
    if default is None or default is False or default == argparse.SUPPRESS:
        return ""
    shown = " ".join(map(str, default)) if isinstance(default, list) else str(default)
    return f"`{cell(shown)}`"


def argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    """One table row per argument of `parser`: how it is written, its default, its help (argparse's own formatting
    of both, %(default)s and the like expanded); --help and the subcommand choice left out."""
    formatter = argparse.HelpFormatter(parser.prog, width=WIDTH)
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        written = formatter._format_action_invocation(action)
        meaning = formatter._expand_help(action) if action.help else ""
        rows.append(f"| `{cell(written)}` | {default_text(action)} | {cell(meaning)} |")
    return rows


def usage(parser: argparse.ArgumentParser) -> str:
    """The usage block `--help` opens with, wrapped at WIDTH columns."""
    formatter = argparse.HelpFormatter(parser.prog, width=WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def subcommands(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers of `parser`'s subcommands (`specdistill data prompts`, ...), in the order they were added."""
    return [sub for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for sub in action.choices.values()]


def parser_section(parser: argparse.ArgumentParser, level: int) -> list[str]:
    """Heading, description, usage and argument table of one parser (its subcommands not included)."""
    lines = ["#" * level + f" {parser.prog}", ""]
    lines += [cell(parser.description), ""] if parser.description else []
    lines += ["```text", usage(parser), "```", ""]
    rows = argument_rows(parser)
    lines += ["| argument | default | meaning |", "|---|---|---|", *rows, ""] if rows else []
    return lines


def command_sections(parser: argparse.ArgumentParser, level: int) -> list[str]:
    """A parser's section, then each of its subcommands' one level below."""
    lines = parser_section(parser, level)
    for sub in subcommands(parser):
        lines += command_sections(sub, level + 1)
    return lines


def reference_markdown() -> str:
    """The whole page: the umbrella and its jobs, then every job from the parser its command runs."""
    umbrella = build_parser()
    lines = ["# Command-line reference", "",
             f"Generated from the commands' own parsers by `{GENERATE}`: change a flag's help there, not here.", "",
             "Every job runs as `specdistill JOB ...`, as `python -m specdistill JOB ...` or as its alias "
             "`specdistill-JOB ...`: the same code, flags, exit codes and errors. A reader that leaves early "
             "(`specdistill check ... | head`) ends a command with exit 141 and no traceback.", ""]
    lines += parser_section(umbrella, 2)
    lines += ["| job | what it does | alias |", "|---|---|---|"]
    lines += [f"| `{job.name}` | {cell(job.summary)} | `{job.alias}` |" for job in JOBS]
    lines.append("")
    for job in JOBS:
        lines += command_sections(job_module(job).build_parser(job.prog), 2)
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
