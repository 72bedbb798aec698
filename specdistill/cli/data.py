"""Build training data once, as its own step: the target's answers to a prompt set, prompts written by the target,
the hidden states an EAGLE-3 head trains on. Each writes a folder that a recipe's `data.dataset` (or
`distill.hidden_state_cache`) reads directly, resumes after a kill (rerun the same command), and shows a progress
bar with rows/s and ETA.

    specdistill-data prompts --target MODEL --num 2000 --out data/prompts                 # Magpie
    specdistill-data prompts --target MODEL --num 800 --out data/prompts --categories all # toward 8 categories
    specdistill-data responses --target MODEL --prompts data/prompts --out data/chat      # answered turn by turn
    specdistill-data responses --target MODEL.gguf --prompts prompts.jsonl --out data/chat --engine vllm
    specdistill-data hidden-states RECIPE.yaml key=value ...      # the recipe's distill.hidden_state_cache

Layout: OUT/prompts.jsonl ({"messages": [one user turn]}) or OUT/train.jsonl ({"messages": [...]} with the target's
answers, "category" kept; {"text"} for prompts rendered without a chat template); OUT/.specdistill/ holds the
resumable shards (distill.data.target_data) and the settings they were made with. This module is the parser and
the entry points and imports no torch (`--help` answers at once); the jobs run in data_run.py.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from decode.inputs.command_line import CHAT_TEMPLATE_MODES, VLLM_DTYPE_CHOICES, OneLineArgumentParser
from distill.recipe.data_config import PROMPT_CATEGORIES
from specdistill.cli.closed_pipe import quiet_on_a_closed_pipe

ENGINES = ("specdistill", "vllm")
PROG = "specdistill-data"  # the command's name; `specdistill data` runs the same code (specdistill.cli.main)


class ArgumentParser(OneLineArgumentParser, argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 1)."""


def build_parser(prog: str = PROG) -> ArgumentParser:
    """The command's jobs and their flags (also what specdistill.cli.reference documents)."""
    p = ArgumentParser(prog=prog, description=" ".join(__doc__.split(".")[0].split()) + ".")  # the first sentence
    jobs = p.add_subparsers(dest="job", required=True, metavar="{prompts,responses,hidden-states}")
    for name, text in (("prompts", "prompts written by the target (Magpie)"),
                       ("responses", "the target's answers to a prompt set, turn by turn")):
        job = jobs.add_parser(name, help=text, description=text)
        job.add_argument("--target", required=True, help="target model: local folder, .gguf file or hub id")
        job.add_argument("--out", required=True, type=Path, help="output folder (a rerun resumes it)")
        job.add_argument("--seed", type=int, default=0, help="row i is sampled with seed + i")
        job.add_argument("--batch-size", type=int, default=16, help="prompts decoded at once (our engine)")
        job.add_argument("--engine", default="specdistill", choices=ENGINES,
                         help="specdistill = our batched decoder; vllm = vLLM in the serving venv (`make serving`)")
        job.add_argument("--vllm-python", default=None, help="interpreter with vLLM (default: .venv-vllm)")
        job.add_argument("--vllm-dtype", default="auto", choices=VLLM_DTYPE_CHOICES,
                         help="the dtype vLLM holds the target in (--engine vllm): auto = bfloat16 when vLLM runs on "
                              "CUDA, else float32; an 8B target in float32 needs twice the memory")
        job.add_argument("--device", default="auto",
                         help="auto, cpu, cuda, cuda:1, ... (our engine; with --engine vllm the target is only read, "
                              "on the CPU)")
        job.add_argument("--dtype", default="auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16")
        job.add_argument("--quiet", action="store_true", help="no progress bar")
        job.add_argument("--shard-size", type=int, default=None,
                         help="prompts per stored shard: what a kill can lose (default 64, vLLM 4096)")
    prompts, responses = jobs.choices["prompts"], jobs.choices["responses"]
    prompts.add_argument("--num", type=int, required=True, help="how many distinct prompts")
    prompts.add_argument("--temperature", type=float, default=1.0)
    prompts.add_argument("--max-tokens", type=int, default=128, help="longest prompt (longer ones are dropped)")
    toward = prompts.add_mutually_exclusive_group()
    toward.add_argument("--categories", nargs="+", default=None, metavar="CATEGORY",
                        help="prompts toward these categories, taking turns: each begins with a built-in opener "
                             f"of its category ({', '.join(PROMPT_CATEGORIES)}, or all)")
    toward.add_argument("--openers", type=Path, default=None,
                        help="prompts beginning with your own openers, taking turns: a .txt (one opener per line) "
                             "or .jsonl ({\"opener\": ..., \"category\": ...} per line)")
    prompts.add_argument("--exclude", nargs="+", default=[], metavar="PROMPTS",
                         help="prompt files never to write (your held-out eval prompts, e.g. "
                              "recipes/prompts/chat_eval.jsonl): a candidate equal to one of them is dropped")
    responses.add_argument("--prompts", required=True,
                           help=".jsonl ('prompt' or 'messages' per line), .txt (one per line), a dataset folder "
                                "(e.g. the OUT of `specdistill-data prompts`) or a hub dataset id")
    responses.add_argument("--prompts-split", default="train")
    responses.add_argument("--messages-field", default=None, help="field holding a conversation (default: messages)")
    responses.add_argument("--prompt-field", default=None, help="field holding a plain prompt (default: prompt)")
    responses.add_argument("--limit", type=int, default=None, help="answer only the first N rows")
    responses.add_argument("--chat-template", default="auto", choices=CHAT_TEMPLATE_MODES,
                           help="auto/on: answer as a chat (the target's template); off: continue raw text")
    responses.add_argument("--max-new-tokens", type=int, default=256)
    responses.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    responses.add_argument("--top-k", type=int, default=None)
    responses.add_argument("--top-p", type=float, default=None)
    hidden = jobs.add_parser("hidden-states", help="the hidden-state cache of an EAGLE-3 head recipe",
                             description="build distill.hidden_state_cache of RECIPE (the same cache a run builds "
                                         "at its start)")
    hidden.add_argument("recipe", help="recipe .yaml with model.draft_kind eagle3 or dflash and "
                                       "distill.hidden_state_cache")
    hidden.add_argument("overrides", nargs="*", help="key=value recipe overrides")
    return p


def parse_args(argv: list[str] | None, prog: str = PROG) -> argparse.Namespace:
    """The parsed command line, numbers checked (a bad one: one-line usage error, exit 1)."""
    p = build_parser(prog)
    args = p.parse_args(argv)
    for flag in ("num", "batch_size", "max_tokens", "max_new_tokens", "limit", "shard_size"):
        if getattr(args, flag, None) is not None and getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    lowest = 0.0 if args.job == "responses" else 1e-6  # prompts are sampled: a positive temperature
    if getattr(args, "temperature", None) is not None and args.temperature < lowest:
        p.error(f"--temperature must be {'>= 0' if args.job == 'responses' else '> 0'}, got {args.temperature}")
    return args


def main(argv: list[str] | None = None, prog: str = PROG) -> Path:
    """Parse and run one job (specdistill.cli.data_run); returns the file written."""
    from specdistill.cli.data_run import run  # torch, transformers and the trainer load here, after the parse

    return run(parse_args(argv, prog))


@quiet_on_a_closed_pipe
def cli(argv: list[str] | None = None, prog: str = PROG) -> None:
    """Console entry point `specdistill-data` (argv: sys.argv[1:] when None): user errors exit 1 with one line, no
    traceback."""
    args = parse_args(argv, prog)  # --help and usage errors answer here, before torch loads
    from distill.data.shard_store import ShardBuildStopped
    from distill.run.preemption import StoppedOutsideTraining, stop_signals_raise
    from distill.utils import PREEMPTED_EXIT
    from specdistill.cli.data_run import USER_ERRORS, run

    try:
        with stop_signals_raise():  # SIGTERM & co while loading: exit 75 in one line (shard builds stop at a boundary)
            run(args)
    except ShardBuildStopped as stopped:  # a signal: the shards written are kept, the same command resumes
        print(f"{prog}: {stopped}", file=sys.stderr)
        raise SystemExit(PREEMPTED_EXIT) from None
    except StoppedOutsideTraining as stopped:
        print(f"{prog}: stopped by {stopped.signal_name} outside a shard build (loading or finishing): every file "
              "written so far is complete; run the same command again to resume", file=sys.stderr)
        raise SystemExit(PREEMPTED_EXIT) from None
    except USER_ERRORS as err:
        message = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
        print(f"{prog}: error: {message}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    cli()
