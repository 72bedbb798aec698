"""Check that an exported draft will serve next to its target, and print the commands that serve the pair.

    python scripts/check_deploy.py --target Qwen/Qwen2.5-7B-Instruct --draft outputs/qwen2.5-7b-to-0.5b
    specdistill-check --target TARGET --draft DRAFT_DIR --json check.json
    specdistill-check --target TARGET --draft DRAFT_DIR --serve        # also load and run the pair in vLLM
    specdistill-check --target MODEL.gguf --draft DRAFT_DIR           # a .gguf: checked as its converted folder

One line per check (`ok   <check>` or `FAIL <check>: <what is wrong and what to do>`; the checks are listed in
decode/deploy/deploy_check.py), then the transformers, vLLM and SGLang commands. Exit code 1 when a check fails or the
inputs cannot be read (one line on stderr), 0 when every check passes. A draft naming no gamma is a warning (WARN).
--serve runs the pair in vLLM's offline LLM (the serving venv, `make serving`): vLLM must load it and its
speculative greedy output must equal its plain output; tau from vLLM's counters is printed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from decode.inputs.command_line import VLLM_DTYPE_CHOICES, OneLineArgumentParser
from specdistill.cli.closed_pipe import quiet_on_a_closed_pipe

PROG = "specdistill-check"  # the command's name; `specdistill check` runs the same code (specdistill.cli.main)


class ArgumentParser(OneLineArgumentParser, argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 1)."""


def build_parser(prog: str = PROG) -> ArgumentParser:
    """The command's flags (also what specdistill.cli.reference documents)."""
    p = ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True,
                   help="target model: local folder, .gguf file (checked as its converted folder) or hub id "
                        "(config + tokenizer read)")
    p.add_argument("--draft", required=True, help="exported draft folder (or a .gguf draft model)")
    p.add_argument("--json", type=Path, default=None, help="also write the findings as JSON here")
    p.add_argument("--serve", action="store_true", help="also run the pair in vLLM (greedy output = plain, tau)")
    p.add_argument("--vllm-python", default=None,
                   help="interpreter with vLLM (default: $SPECDISTILL_VLLM_PYTHON, else .venv-vllm/bin/python)")
    p.add_argument("--vllm-dtype", default="auto", choices=VLLM_DTYPE_CHOICES,
                   help="the dtype vLLM runs the pair in (--serve): auto = bfloat16 on CUDA, else float32")
    p.add_argument("--trust-remote-code", action="store_true")
    return p


def parse_args(argv: list[str] | None, prog: str = PROG) -> argparse.Namespace:
    return build_parser(prog).parse_args(argv)


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Check the pair the command line names, print the findings and the serving commands; the exit code."""
    return run(parse_args(argv, prog))


def run(args: argparse.Namespace) -> int:
    """What `main` does once the command line is parsed (the deployment checks load here, after the parse)."""
    from decode.inputs.checks import check_language_model_folder
    from decode.inputs.loading import resolve_draft_path, resolve_model_path
    from decode.inputs.writes import write_atomic
    from decode.serving.vllm_engine import find_vllm_python, resolve_vllm_dtype
    from specdistill.drafts import check_deploy, check_serve, serving_commands

    python = find_vllm_python(args.vllm_python) if args.serve else None
    # a .gguf: its converted folder (decode.inputs.gguf), which is also what vLLM serves
    target, draft = resolve_model_path(args.target, "--target"), resolve_draft_path(args.draft, "--draft")
    check_language_model_folder(target, "--target")  # a draft's folder given as the target: one line

    # ---- check ------------------------------------------------------------------------------------------------
    report = check_deploy(target, draft, trust_remote_code=args.trust_remote_code)
    if python is not None:
        report = check_serve(report, python, dtype=resolve_vllm_dtype(args.vllm_dtype))

    # ---- report: the JSON before the lines, so that a reader who leaves early (`| head`) loses nothing -----------
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.json, json.dumps(report.to_dict(), indent=2) + "\n")
    print("\n".join(report.lines()))
    verdict = "passed" if report.passed else f"FAILED ({len(report.problems)} of the checks)"
    if report.serve is not None:
        print(f"\nvLLM {report.serve['vllm_version']}: gamma {report.serve['gamma']}, tau "
              f"{report.serve['mean_accepted_tokens']:.2f}, speculative greedy output = plain on "
              f"{report.serve['greedy_match']:.0%} of the prompts")
    print(f"\ndeployment check {verdict}\n\n{serving_commands(report)}")
    return 0 if report.passed else 1


@quiet_on_a_closed_pipe
def cli(argv: list[str] | None = None, prog: str = PROG) -> None:
    """Console entry point `specdistill-check` (argv: sys.argv[1:] when None): user errors exit 1 with one line."""
    args = parse_args(argv, prog)  # --help and usage errors answer here, before torch loads
    from decode.inputs.checks import FileProblem
    from decode.inputs.command_line import interrupted_in_one_line
    from decode.inputs.loading import LoadError
    from decode.serving.vllm_engine import ServingError

    try:
        with interrupted_in_one_line(prog, "nothing was written"):
            code = run(args)
    except (LoadError, FileProblem, ServingError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    cli()
