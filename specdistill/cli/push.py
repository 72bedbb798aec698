"""Publish a trained draft model to the Hugging Face Hub with a model card built from measured numbers.

    python scripts/push_to_hub.py outputs/draft --repo-id you/qwen2.5-0.5b-draft --eval-json eval.json
    python scripts/push_to_hub.py outputs/draft --repo-id you/qwen2.5-0.5b-draft --dry-run   # card, no upload

(installed: ``specdistill-push outputs/draft --repo-id you/qwen2.5-0.5b-draft``). The card is written to
OUTPUT_DIR/README.md and the listed files of OUTPUT_DIR are uploaded (distill.publish.hub). The token comes from
HF_TOKEN or ``hf auth login``; it is never printed. Errors print one line ``error: ...`` and exit 1.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from decode.inputs.command_line import OneLineArgumentParser
from specdistill.cli.closed_pipe import quiet_on_a_closed_pipe

PROG = "specdistill-push"  # the command's name; `specdistill push` runs the same code (specdistill.cli.main)


class ArgumentParser(OneLineArgumentParser, argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 1)."""


def build_parser(prog: str = PROG) -> ArgumentParser:
    """The command's flags (also what specdistill.cli.reference documents)."""
    parser = ArgumentParser(prog=prog, description="Upload a draft model folder with a generated model card.")
    parser.add_argument("output_dir", type=Path, help="training OUTPUT_DIR holding the exported draft")
    parser.add_argument("--repo-id", required=True, help="model repository, e.g. you/qwen2.5-0.5b-draft")
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    parser.add_argument("--dry-run", action="store_true",
                        help="write the card and list the files that would be uploaded; upload nothing")
    parser.add_argument("--eval-json", type=Path, help="eval_acceptance JSON (default: OUTPUT_DIR/acceptance.jsonl)")
    parser.add_argument("--staging-dir", type=Path,
                        help="no longer used (the model folder is uploaded in place, nothing is staged); accepted so "
                             "that existing commands keep working")
    parser.add_argument("--target", help="target model id (default: from the eval JSON or recipe.yaml)")
    parser.add_argument("--step", type=int,
                        help="acceptance.jsonl step to report (default: the exported checkpoint's, else the last)")
    return parser


def parse_args(argv: list[str] | None, prog: str = PROG) -> argparse.Namespace:
    return build_parser(prog).parse_args(argv)


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    args = parse_args(argv, prog)  # --help and usage errors answer here, before torch loads
    from distill.publish.hub import HubError
    from specdistill.drafts import push_to_hub

    if args.staging_dir is not None:
        print(f"note: --staging-dir is no longer used: {args.output_dir} is uploaded in place, nothing is staged")
    # ---- write the card (and upload) ----
    try:
        plan = push_to_hub(args.output_dir, repo_id=args.repo_id, private=args.private, dry_run=args.dry_run,
                           eval_json=args.eval_json, target=args.target, step=args.step)
    except (HubError, ValueError, OSError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    # ---- tell the user what happened ----
    if args.dry_run:
        print(f"dry run: would upload {plan.folder} (nothing uploaded); files:")
        for name in plan.files:
            print(f"  {name}  {(plan.folder / name).stat().st_size} bytes")
    else:
        print(f"uploaded {len(plan.files)} files of {plan.folder} to https://huggingface.co/{args.repo_id}")
    return 0


@quiet_on_a_closed_pipe
def cli(argv: list[str] | None = None, prog: str = PROG) -> None:
    """Console entry point `specdistill-push` (argv: sys.argv[1:] when None): exit 1 with one line on an error."""
    from decode.inputs.command_line import interrupted_in_one_line

    with interrupted_in_one_line(prog, "an upload is one commit, made last: run the same command again"):
        code = main(argv, prog)
    raise SystemExit(code)


if __name__ == "__main__":
    cli()
