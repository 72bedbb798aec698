"""Distil a draft model from a frozen target LLM, measuring speculative-decoding acceptance at every checkpoint.

One process (CPU or one GPU):
    python scripts/train.py recipes/tiny_distill.yaml model.target=TARGET_DIR data.dataset=TEXT_FILE
Several GPUs (DDP), the same code; FSDP2 (draft and target sharded) with recipes/accelerate/fsdp.yaml:
    accelerate launch --config_file recipes/accelerate/ddp.yaml scripts/train.py recipes/qwen2.5-7b-to-0.5b.yaml
Two CPU processes (gloo), e.g. to check multi-process maths without GPUs:
    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \
        --mixed_precision no --dynamo_backend no scripts/train.py RECIPE.yaml key=value ...
Installed: specdistill-train RECIPE.yaml key=value ...; accelerate launch ... -m specdistill.cli.train RECIPE.yaml ...

Training rows come from the dataset, the target's responses (data.target_weight, generated once into
data.target_data_dir) and the draft's own samples (distill.on_policy_fraction); distill.teacher_cache caches the
target's top-k once so that training never runs it (recipes/README.md).

The run itself is specdistill.pipeline.run_recipe: check, load, tokenise, distil, measure, export (README, "What a run
does"); this script parses the command line, loads the recipe, calls it and reports.

OUTPUT_DIR (train.output_dir) ends up holding the best draft (distill.outputs.acceptance_log.best_checkpoint: cost-model
speedup from measured acceptance, cost ratios measured once per run) as a model folder,
recipe.yaml (the resolved recipe), acceptance.jsonl, train_results.json, checkpoint-*/ and runs/ (TensorBoard).

Exit status: 0 done; 1 a mistake in what was given (one line); 75 stopped by SIGTERM, SIGINT, SIGUSR1 or SIGHUP (the
terminal closed; not under nohup) after saving a checkpoint of the step in progress (preempted.json says which;
train.resume_from_checkpoint=true continues). 1 too when train.output_dir is in use by another live run.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from decode.inputs.command_line import OneLineArgumentParser
from specdistill.cli.closed_pipe import quiet_on_a_closed_pipe
from specdistill.cli.launch import check_launch, leave_launch_directly, print_once

# The module stays light (argparse, no torch) until it runs a recipe: `specdistill train --help` answers at once;
# the trainer's modules are imported by main() and _run_cli(), USER_ERRORS on first use (__getattr__ below).
LOST_PEER_EXIT = 76  # another process of the run died or hung (distill.models.distributed.lost_peer)
PROG = "specdistill-train"  # the command's name; `specdistill train` runs the same code (specdistill.cli.main)


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors in what the user gave us (or the machine: a full disk): reported as one line, exit status 1, no
    traceback."""
    from decode.inputs.checks import FileProblem
    from decode.inputs.vocab import TokenizerMismatchError
    from distill.data.rows import DataError
    from distill.data.shard_store import CacheMismatchError
    from distill.models.distributed import UnsupportedModeError
    from distill.outputs.acceptance_log import AcceptanceLogError
    from distill.publish.export import PushError
    from distill.utils import ModelSetupError, OutOfSpaceError
    from specdistill.recipes import RecipeError

    return (RecipeError, DataError, ModelSetupError, TokenizerMismatchError, UnsupportedModeError,
            FileNotFoundError, PushError, CacheMismatchError, FileProblem, AcceptanceLogError, OutOfSpaceError)


def __getattr__(name: str):
    if name == "USER_ERRORS":  # what specdistill.cli.data adds its own errors to
        return user_errors()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ArgumentParser(OneLineArgumentParser, argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 1)."""


def build_parser(prog: str = PROG) -> ArgumentParser:
    """The command's help: its arguments (also what specdistill.cli.reference documents) and this module's docstring.
    Only --help is read with it: the recipe loader reads the arguments themselves (every key=value checked)."""
    summary, _, details = __doc__.partition("\n\n")
    p = ArgumentParser(prog=prog, description=summary, epilog=details,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recipe", metavar="RECIPE.yaml", help="the recipe (recipes/README.md lists every key)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="recipe overrides, e.g. train.max_steps=100 (checked as the recipe's own keys)")
    return p


def main(argv: list[str] | None = None, prog: str = PROG) -> dict:
    """Run the recipe given as argv = [RECIPE.yaml, key=value, ...]; returns the exported draft's summary."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        build_parser(prog).print_help()
        return {}
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from distill.outputs.run_folder import RESULTS_FILE
    from distill.run.preemption import StoppedOutsideTraining, resume_hint
    from specdistill.pipeline import run_recipe
    from specdistill.recipes import load_recipe

    # ---- parse: the recipe with its key=value overrides, every key checked ------------------------------------
    recipe = load_recipe(argv[0], argv[1:])

    # ---- run: check, load, tokenise, distil, measure, export (specdistill.pipeline) -------------------------------
    started = time.time()
    try:
        outcome = run_recipe(recipe, source=argv[0], overrides=argv[1:])
    except StoppedOutsideTraining as stopped:  # say how to go on: resume, or the same command again
        stopped.resume = resume_hint(recipe.train.output_dir, since=started)
        raise

    # ---- report ------------------------------------------------------------------------------------------------
    if outcome.finished_before is not None:
        print(f"specdistill-train: nothing to do: {recipe.train.output_dir} holds a run that finished at step "
              f"{outcome.finished_before} ({RESULTS_FILE} written); nothing was changed")
    return outcome.summary


@quiet_on_a_closed_pipe
def cli(argv: list[str] | None = None, prog: str = PROG) -> None:
    """Console entry point `specdistill-train` (argv: sys.argv[1:] when None): user errors exit 1 with one line, no
    traceback; an error every process of a launch meets alike is printed once; each process of a launch that is
    done or preempted ends without the interpreter's teardown (specdistill.cli.launch)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):  # the help alone: nothing of the trainer imported
        build_parser(prog).print_help()
        return
    if not Path(argv[0]).is_file():  # a typo answers at once, as the recipe loader would after the trainer's imports
        print_once(f"{prog}: error: recipe file not found: {argv[0]}")
        raise SystemExit(1)
    check_launch(prog)
    from distill.utils import PREEMPTED_EXIT

    with leave_launch_directly(statuses=(0, PREEMPTED_EXIT)):
        _run_cli(argv, prog)


def _run_cli(argv: list[str], prog: str) -> None:
    from distill.data.shard_store import ShardBuildStopped
    from distill.models.distributed import lost_peer
    from distill.run.preemption import Preempted, StoppedOutsideTraining, stop_signals_raise
    from distill.utils import PREEMPTED_EXIT

    try:
        with stop_signals_raise():  # SIGTERM & co before or after training: exit 75 in one line
            main(argv, prog)
    except (Preempted, ShardBuildStopped, StoppedOutsideTraining) as stopped:  # a signal: resume goes on
        print_once(f"{prog}: {stopped}")
        raise SystemExit(PREEMPTED_EXIT) from None
    except user_errors() as err:
        first, *details = [line.strip() for line in str(err).splitlines() if line.strip()] or [""]
        message = " ".join([first, "; ".join(details)]).strip()  # one line, details (if any) separated by ;
        print_once(f"{prog}: error: {message}")
        raise SystemExit(1) from None
    except RuntimeError as err:  # a collective that lost a peer: one line on every surviving rank
        message = lost_peer(err)
        if message is None:
            raise
        print_once(f"{prog}: error: {message}")
        raise SystemExit(LOST_PEER_EXIT) from None


if __name__ == "__main__":
    cli()
