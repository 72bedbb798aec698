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
resumable shards (distill.data.target_data) and the settings they were made with.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from decode.inputs.checks import check_writable_folder, read_text
from decode.inputs.command_line import OneLineArgumentParser
from decode.inputs.loading import LoadError, load_causal_lm, load_tokenizer, resolve_device, resolve_dtype
from decode.inputs.prompts import CHAT_TEMPLATE_MODES, PromptFields, check_chat_template, read_prompt_rows
from decode.serving.vllm_engine import VLLM_DTYPE_CHOICES, ServingError, find_vllm_python, resolve_vllm_dtype
from distill.data.magpie import (
    CATEGORY_OPENERS,
    Synthesis,
    SynthesisError,
    category_openers,
    prompt_texts,
    synthesize_prompt_rows,
)
from distill.data.regenerate import Answering, answer_conversations, write_jsonl
from distill.data.shard_store import ShardBuildStopped
from distill.run.preemption import StoppedOutsideTraining, stop_signals_raise
from distill.utils import PREEMPTED_EXIT, eval_mode
from specdistill.cli.train import USER_ERRORS as RUN_ERRORS
from specdistill.pipeline import prepare_data
from specdistill.recipes import RecipeError, load_recipe

WORK_DIR = ".specdistill"  # inside OUT: shards and their settings (hidden: data.dataset reads OUT's .jsonl only)
PROMPTS_FILE, RESPONSES_FILE = "prompts.jsonl", "train.jsonl"
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
                             f"of its category ({', '.join(CATEGORY_OPENERS)}, or all)")
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
    """Run one job; returns the file written."""
    args = parse_args(argv, prog)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.job == "hidden-states":
        return recipe_hidden_states(args.recipe, args.overrides)

    # ---- inputs: the output folder, the prompts, the vLLM interpreter: every problem before a weight loads --------
    check_writable_folder(args.out, "--out")
    rows = None
    if args.job == "responses":
        fields = PromptFields(prompt_field=args.prompt_field, messages_field=args.messages_field)
        rows = read_prompt_rows(args.prompts, fields, split=args.prompts_split, limit=args.limit)
    openers = chosen_openers(args) if args.job == "prompts" else ()
    excluded = frozenset().union(*(prompt_texts(read_prompt_rows(f)) for f in args.exclude)) \
        if args.job == "prompts" else frozenset()
    vllm_python = find_vllm_python(args.vllm_python) if args.engine == "vllm" else None

    # ---- the target ------------------------------------------------------------------------------------------------
    # with --engine vllm our copy of the target is only read (the stored shards' fingerprint): it stays on the CPU, so
    # vLLM, which takes a GPU whenever there is one, has that GPU to itself
    device = resolve_device("cpu" if args.engine == "vllm" else args.device)
    vllm_dtype = resolve_vllm_dtype(args.vllm_dtype)
    tokenizer = load_tokenizer(args.target)
    if args.job == "responses":
        check_chat_template(tokenizer, args.chat_template)
    # loaded with --engine vllm too: what the stored shards depend on includes the target's weights
    target = load_causal_lm(args.target, device, resolve_dtype(args.dtype, device))
    target_id = str(getattr(target, "name_or_path", "") or args.target)  # a .gguf: its converted folder (vLLM)

    # ---- generate (resumable) and write --------------------------------------------------------------------------
    started, work = time.perf_counter(), args.out / WORK_DIR
    with eval_mode(target):
        if args.job == "prompts":
            made = synthesize_prompt_rows(
                target, tokenizer, work, Synthesis(count=args.num, seed=args.seed, temperature=args.temperature,
                                                   max_new_tokens=args.max_tokens, batch_size=args.batch_size,
                                                   openers=openers, exclude=excluded),
                target_id=target_id, progress=not args.quiet, engine=args.engine, vllm_python=vllm_python,
                vllm_dtype=vllm_dtype)
            rows_out = [{"messages": [{"role": "user", "content": row.text}]}
                        | ({"category": row.category} if row.category is not None else {}) for row in made]
            written = write_jsonl(rows_out, args.out / PROMPTS_FILE)
        else:
            answering = Answering(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                                  top_p=args.top_p, seed=args.seed, batch_size=args.batch_size,
                                  chat_template=args.chat_template, shard_size=args.shard_size)
            rows_out = answer_conversations(target, tokenizer, rows, work, answering, target_id=target_id,
                                            progress=not args.quiet, engine=args.engine, vllm_python=vllm_python,
                                            vllm_dtype=vllm_dtype)
            written = write_jsonl(rows_out, args.out / RESPONSES_FILE)
    print(f"specdistill-data {args.job}: {len(rows_out)} rows in {written} ({time.perf_counter() - started:.0f} s); "
          f"train on them with data.dataset={args.out}")
    return written


def chosen_openers(args: argparse.Namespace) -> tuple[tuple[str | None, str], ...]:
    """The (category, opener) pairs of --categories or --openers; () for neither. Raises SynthesisError (unknown
    category, unreadable or empty openers file) in one line."""
    if args.categories is not None:
        return category_openers(args.categories)
    if args.openers is None:
        return ()
    where = f"--openers {args.openers}"
    try:
        lines = [line.strip() for line in read_text(args.openers, "--openers").splitlines()]
    except OSError as err:
        raise SynthesisError(f"{where}: cannot read it ({err.strerror or type(err).__name__})") from None
    if args.openers.suffix != ".jsonl":
        pairs = tuple((None, line) for line in lines if line)
    else:
        pairs = []
        for number, line in enumerate(lines, 1):
            if not line:
                continue
            try:
                row = json.loads(line)
                opener, category = row["opener"], row.get("category")
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                raise SynthesisError(f"{where}: line {number} is not a JSON object with an \"opener\"") from None
            if not isinstance(opener, str) or not opener.strip():
                raise SynthesisError(f"{where}: line {number}: \"opener\" must be non-empty text") from None
            pairs.append((None if category is None else str(category), opener.strip()))
        pairs = tuple(pairs)
    if not pairs:
        raise SynthesisError(f"{where}: no openers in it (one per line)")
    return pairs


def recipe_hidden_states(recipe_file: str, overrides: list[str]) -> Path:
    """The recipe's distill.hidden_state_cache built (or resumed, or found complete) as its run would build it,
    with whatever the rows need first (prompts, responses); returns the cache folder."""
    recipe = load_recipe(recipe_file, overrides)
    if recipe.distill.hidden_state_cache is None:
        raise RecipeError("distill.hidden_state_cache", "is null; set it to the folder the cache goes to "
                          "(model.draft_kind eagle3 or dflash)", recipe_file)
    checked = prepare_data(recipe, recipe_file, overrides)
    folder = Path(checked.distill.hidden_state_cache)
    print(f"specdistill-data hidden-states: the cache of {recipe_file} is complete in {folder}; train with "
          f"specdistill-train {recipe_file}{''.join(' ' + o for o in overrides)}")
    return folder


USER_ERRORS = (*RUN_ERRORS, LoadError, ServingError, SynthesisError)  # a run's, and the loaders' and engines'


def cli(argv: list[str] | None = None, prog: str = PROG) -> None:
    """Console entry point `specdistill-data` (argv: sys.argv[1:] when None): user errors exit 1 with one line, no
    traceback."""
    try:
        with stop_signals_raise():  # SIGTERM & co while loading: exit 75 in one line (shard builds stop at a boundary)
            main(argv, prog)
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
