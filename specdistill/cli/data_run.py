"""The run of `specdistill data`: each job's inputs checked, the target loaded, the rows generated (resumable) and
written. specdistill.cli.data parses the command line and imports this module only then, so that `--help` and usage
errors answer before torch loads."""
from __future__ import annotations

import argparse
import json
import logging
import shlex
import time
from pathlib import Path

from decode.inputs.checks import check_language_model_folder, check_writable_folder, read_text
from decode.inputs.loading import LoadError, load_causal_lm, load_tokenizer, resolve_device, resolve_dtype
from decode.inputs.prompts import PromptFields, check_chat_template, read_prompt_rows
from decode.serving.vllm_engine import ServingError, find_vllm_python, resolve_vllm_dtype
from distill.data.magpie import Synthesis, SynthesisError, category_openers, prompt_texts, synthesize_prompt_rows
from distill.data.regenerate import Answering, answer_conversations, write_jsonl
from distill.utils import eval_mode
from specdistill.cli.train import USER_ERRORS as RUN_ERRORS
from specdistill.pipeline import prepare_data
from specdistill.recipes import RecipeError, load_recipe

WORK_DIR = ".specdistill"  # inside OUT: shards and their settings (hidden: data.dataset reads OUT's .jsonl only)
PROMPTS_FILE, RESPONSES_FILE = "prompts.jsonl", "train.jsonl"


def run(args: argparse.Namespace) -> Path:
    """Run the parsed command line's job; returns the file written."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.job == "hidden-states":
        return recipe_hidden_states(args.recipe, args.overrides)

    # ---- inputs: the output folder, the prompts, the vLLM interpreter: every problem before a weight loads --------
    check_writable_folder(args.out, "--out")
    rows = None
    if args.job == "responses":
        fields = PromptFields(prompt_field=args.prompt_field, messages_field=args.messages_field,
                              prompt_flag="--prompt-field")
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
    check_language_model_folder(args.target, "--target")  # a draft's folder given as the target: one line
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
          f"{shlex.join(['specdistill-train', str(recipe_file), *overrides])}")
    return folder


USER_ERRORS = (*RUN_ERRORS, LoadError, ServingError, SynthesisError)  # a run's, and the loaders' and engines'
