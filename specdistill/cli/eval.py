"""Measure a draft against its target: acceptance, mean accepted tokens, wall-clock speedup.

    python scripts/eval_acceptance.py --target Qwen/Qwen2.5-7B-Instruct --draft Qwen/Qwen2.5-0.5B-Instruct \
        --prompts prompts.jsonl --gamma 2 4 6 --max-new-tokens 128 --output eval.json
    specdistill-eval --target TARGET --draft prompt-lookup --prompts prompts.txt --gamma 4
    specdistill-eval --target SmolLM2-135M-Instruct.Q4_1.gguf --draft DRAFT --prompts prompts.txt   # converted once
    specdistill-eval --target TARGET --draft DRAFT --prompts question.jsonl --messages-field turns \
        --category-field category --chat-template auto        # Spec-Bench's 480 prompts, by category
    specdistill-eval --target TARGET --draft DRAFT --prompts prompts.txt --gamma 2 4 auto --compile
    specdistill-eval --target TARGET --draft prompt-lookup --prompts prompts.txt --cpu-linear plain   # A/B kernels
    specdistill-eval --target TARGET --draft HEAD_DIR --prompts prompts.txt --gamma 2 4 6   # an EAGLE-3 head
    specdistill-eval --target TARGET --draft HEAD_DIR --prompts prompts.txt --gamma 2 4 --acceptance-only   # tau alone
    specdistill-eval --target TARGET --draft DRAFT --prompts prompts.txt --gamma 2 4 --engine vllm   # inside vLLM
    specdistill-eval --target TARGET --draft DRAFT --prompts prompts.txt --gamma 2 4 --engine both   # tau parity
    specdistill-eval --target TARGET --draft DRAFT --prompts prompts.txt --gamma 2 4 --engine both \
        --device cuda --dtype bfloat16 --vllm-dtype bfloat16      # on a GPU: both engines in bfloat16
    specdistill-eval --target TARGET --draft DRAFT --prompts prompts.txt --gamma 2 4 --engine vllm \
        --concurrency 1 4 16    # vLLM throughput, plain vs speculative, at max_num_seqs 1, 4, 16

The same code path (decode.measure.evaluate.evaluate_acceptance) scores every checkpoint during training. This module
is the parser and the run; the checks made before any weight loads are eval_inputs.py, what the run does to the loaded
models (the draft vocabulary, packed linear layers on CPU) eval_models.py, the printed report eval_report.py.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from decode.inputs.checks import check_writable_file
from decode.inputs.command_line import OneLineArgumentParser
from decode.inputs.loading import LoadError, load_causal_lm, load_tokenizer, resolve_device, resolve_dtype
from decode.inputs.prompts import (
    CHAT_TEMPLATE_MODES,
    PromptFields,
    check_chat_template,
    encode_prompt_rows,
    raw_prompts_note,
    read_prompt_rows,
)
from decode.inputs.vocab import TokenizerMismatchError
from decode.inputs.writes import write_atomic
from decode.loop.auto_gamma import fixed_gammas
from decode.loop.packed_linear import CPU_LINEAR_MODES
from decode.measure.evaluate import acceptance_only, evaluate_acceptance
from decode.measure.results import write_eval_json
from decode.measure.settings import EvalSettings
from decode.serving.parity import DEFAULT_TOLERANCE, aligned_inputs, out_of_tolerance, parity_rows
from decode.serving.vllm_engine import (
    DRAFT_SAMPLE_METHODS,
    VLLM_DTYPE_CHOICES,
    ServingError,
    evaluate_in_vllm,
    find_vllm_python,
    plain_outputs,
    resolve_vllm_dtype,
    vllm_outputs,
)
from kinds import kind_of_source
from kinds.prompt_lookup import PROMPT_LOOKUP
from specdistill.cli.eval_inputs import check_draft_fits, check_draft_tokenizer, check_model_paths, with_model_folders
from specdistill.cli.eval_models import pack_for_eager_cpu, use_draft_vocab
from specdistill.cli.eval_report import describe_device, plain_match, print_report

ENGINES = ("specdistill", "vllm", "both")
PROG = "specdistill-eval"  # the command's name; `specdistill eval` runs the same code (specdistill.cli.main)


class ArgumentParser(OneLineArgumentParser, argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 1)."""


DRAFT_VOCAB_MODES = ("auto", "full")


def build_parser(prog: str = PROG) -> ArgumentParser:
    """The command's flags (also what specdistill.cli.reference documents)."""
    p = ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="target model: local folder, .gguf file or hub id")
    p.add_argument("--draft", required=True,
                   help=f"draft model (local folder, .gguf file or hub id), an EAGLE-3 head folder (recognised by its "
                        f"config), or '{PROMPT_LOOKUP}'")
    p.add_argument("--prompts", required=True,
                   help=".jsonl (a 'prompt' or 'messages' field per line), .txt (one prompt per line), a local dataset "
                        "folder, or a hub dataset id")
    p.add_argument("--prompts-split", default="train", help="split of a dataset given to --prompts")
    p.add_argument("--prompts-config", default=None, help="configuration name of a hub dataset (e.g. main)")
    p.add_argument("--prompt-field", default=None, help="field holding a plain prompt (default: prompt)")
    p.add_argument("--messages-field", default=None,
                   help="field holding a conversation: [{role, content}] or the user's turns (default: messages)")
    p.add_argument("--category-field", default=None, help="field holding each prompt's category (default: category)")
    p.add_argument("--chat-template", default="auto", choices=CHAT_TEMPLATE_MODES,
                   help="render prompts with the target tokenizer's chat template: auto = conversations only")
    p.add_argument("--gamma", type=gamma_value, nargs="+", default=[4],
                   help="draft tokens per step (several values sweep); 'auto' chooses it at every step")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--num-prompts", type=int, default=None, help="use only the first N prompts")
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="keep only the last N tokens of each prompt")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1, help="timed repeats per prompt (medians are reported)")
    p.add_argument("--stop-at-eos", action="store_true", help="stop each generation at the tokenizer's EOS")
    p.add_argument("--output", type=Path, default=None, help="write the results JSON here")
    p.add_argument("--save-outputs", type=Path, default=None,
                   help="write per-prompt token ids of the plain and speculative continuations (.jsonl)")
    p.add_argument("--compare-hf", action="store_true", help="also time transformers assisted generation")
    p.add_argument("--acceptance-only", action="store_true",
                   help="acceptance and tau alone: one speculative decode per prompt and gamma, no plain decoding "
                        "and nothing timed (the same acceptance as a full run)")
    p.add_argument("--compile", action="store_true",
                   help="static KV caches and torch.compiled steps (CUDA graphs on GPU); compile time is reported "
                        "as compile_seconds, apart from tokens/s")
    p.add_argument("--cpu-linear", default="auto", choices=CPU_LINEAR_MODES,
                   help="eager decoding on CPU: packed = the target's and draft's linear layers multiply by "
                        "oneDNN-packed weights (decode.loop.packed_linear: cheaper verify passes), plain = as loaded, "
                        "auto = packed, then F.linear at the token counts (1 to gamma + 1) where it measured faster on "
                        "this CPU (a few seconds); no effect on GPU or with --compile")
    p.add_argument("--draft-vocab", default="auto", choices=DRAFT_VOCAB_MODES,
                   help="a standalone or PARD draft with a draft vocabulary (draft_vocab.json, from "
                        "model.draft_vocab_size): auto = our decoder reads out only those lm_head rows, except under "
                        "--engine both, where both engines read out every row (vLLM has no such option: the same "
                        "drafter on both sides); full = every row")
    p.add_argument("--engine", default="specdistill", choices=ENGINES,
                   help="where to measure: our decoder, vLLM's offline LLM (the serving venv), or both side by side "
                        "(tau(ours), tau(vLLM) and their ratio per gamma)")
    p.add_argument("--vllm-python", default=None,
                   help="interpreter with vLLM (default: $SPECDISTILL_VLLM_PYTHON, else .venv-vllm/bin/python from "
                        "`make serving`)")
    p.add_argument("--vllm-draft-sampling", default=None, choices=DRAFT_SAMPLE_METHODS,
                   help="vLLM's draft_sample_method at temperature > 0: greedy (vLLM's default: argmax drafts, "
                        "accepted with p(d)) or probabilistic (d ~ q, min(1, p/q), as ours); default: vLLM's own for "
                        "--engine vllm, probabilistic for --engine both")
    p.add_argument("--vllm-dtype", default="float32", choices=VLLM_DTYPE_CHOICES,
                   help="the dtype vLLM runs the target and the draft in (--engine vllm, or the vLLM side of --engine "
                        "both): auto = bfloat16 when --device is CUDA, else float32 (as --dtype auto); the default, "
                        "float32, matches our float32 run on CPU")
    p.add_argument("--concurrency", type=int, nargs="+", default=None, metavar="N",
                   help="vLLM throughput under load (--engine vllm, or the vLLM side of --engine both): at each N, "
                        "max_num_seqs = N and every prompt submitted at once; plain and speculative tokens/s and "
                        "their ratio (speedup) per N and gamma, rows marked `concurrency`; with two or more N and "
                        "prompt lookup, the batch cost model's prediction (docs/concepts/cost-model.md)")
    p.add_argument("--parity-tolerance", type=float, default=DEFAULT_TOLERANCE,
                   help="--engine both exits 1 when |tau(vLLM) / tau(ours) - 1| exceeds this")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def parse_args(argv: list[str] | None, prog: str = PROG) -> argparse.Namespace:
    return build_parser(prog).parse_args(argv)


def gamma_value(text: str) -> int | str:
    """A --gamma value: an integer, or 'auto'."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 or 'auto', got {text!r}") from None


def dtype_name(dtype: torch.dtype) -> str:
    """A resolved dtype as the JSON and vLLM name it: torch.bfloat16 -> "bfloat16"."""
    return str(dtype).replace("torch.", "")


def check_args(args: argparse.Namespace) -> None:
    """Every number and output path, before anything is read or loaded (an unwritable --output would otherwise
    fail after the whole measurement)."""
    positive = {"--gamma": min(fixed_gammas(args.gamma), default=None), "--max-new-tokens": args.max_new_tokens,
                "--repeats": args.repeats, "--num-prompts": args.num_prompts,
                "--max-prompt-tokens": args.max_prompt_tokens, "--top-k": args.top_k,
                "--concurrency": min(args.concurrency or [], default=None)}
    for flag, value in positive.items():
        if value is not None and value < 1:
            raise LoadError(f"{flag} must be >= 1" + (" or 'auto'" if flag == "--gamma" else "") +
                            f", got {args.gamma if flag == '--gamma' else value}")
    if args.temperature < 0:
        raise LoadError(f"--temperature must be >= 0, got {args.temperature}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise LoadError(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.parity_tolerance < 0:
        raise LoadError(f"--parity-tolerance must be >= 0, got {args.parity_tolerance}")
    if args.engine != "specdistill" and "auto" in args.gamma:
        raise LoadError(f"--engine {args.engine} needs integer --gamma values: vLLM drafts a fixed number of tokens")
    if args.concurrency is not None and args.engine == "specdistill":
        raise LoadError("--concurrency needs --engine vllm or --engine both: it sets vLLM's max_num_seqs (our "
                        "decoder decodes one sequence at a time)")
    if args.engine == "both" and args.max_new_tokens < 2:
        raise LoadError(f"--engine both needs --max-new-tokens >= 2, got {args.max_new_tokens}")
    if args.acceptance_only:
        clash = [flag for flag, on in (("--engine " + args.engine, args.engine != "specdistill"),
                                       ("--compare-hf", args.compare_hf), ("--save-outputs", args.save_outputs),
                                       ("--compile", args.compile)) if on]
        if clash:
            raise LoadError(f"--acceptance-only measures acceptance alone with our decoder, eagerly: drop {clash[0]}")
    if args.output is not None:
        check_writable_file(args.output, "--output")
    if args.save_outputs is not None:
        check_writable_file(args.save_outputs, "--save-outputs")


def main(argv: list[str] | None = None, prog: str = PROG) -> dict:
    args = parse_args(argv, prog)
    check_args(args)
    torch.manual_seed(args.seed)
    vllm_python = find_vllm_python(args.vllm_python) if args.engine != "specdistill" else None

    # ---- inputs -------------------------------------------------------------------------------------------
    fields = PromptFields(args.prompt_field, args.messages_field, args.category_field)
    rows = read_prompt_rows(args.prompts, fields, split=args.prompts_split, config=args.prompts_config,
                            limit=args.num_prompts)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    given = args  # the report names the models as given; a .gguf loads from its converted folder from here on
    args = with_model_folders(args)
    kind = kind_of_source(args.draft)  # the draft's kind, chosen once and handed down
    check_model_paths(args, kind)
    check_draft_fits(args, kind)
    tokenizer = load_tokenizer(args.target)
    check_draft_tokenizer(args, tokenizer, kind)
    check_chat_template(tokenizer, args.chat_template)
    prompt_ids = encode_prompt_rows(tokenizer, rows, args.chat_template, args.max_prompt_tokens)
    if note := raw_prompts_note(tokenizer, rows, args.chat_template):
        print(note, file=sys.stderr)
    categories = [row.category for row in rows]
    settings = EvalSettings(gammas=args.gamma, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                            top_k=args.top_k, top_p=args.top_p, seed=args.seed, repeats=args.repeats,
                            compare_hf=args.compare_hf, compile=args.compile,
                            eos_token_id=tokenizer.eos_token_id if args.stop_at_eos else None)
    report = {"engine": args.engine, "device": describe_device(device), "dtype": dtype_name(dtype),
              "torch_version": torch.__version__, "target": given.target, "draft": given.draft,
              "draft_kind": kind.name, "prompts": args.prompts, "chat_template": args.chat_template,
              "compiled": args.compile}

    # ---- measure ------------------------------------------------------------------------------------------
    outputs: list[dict] | None = [] if args.save_outputs or args.engine == "both" else None
    if args.engine != "specdistill":  # vLLM first: --engine both starts our side from its prefill token
        stop = [tokenizer.eos_token_id] if args.stop_at_eos else None
        sampling = args.vllm_draft_sampling or ("probabilistic" if args.engine == "both" else None)
        vllm_dtype = resolve_vllm_dtype(args.vllm_dtype, device)
        vllm, response = evaluate_in_vllm(vllm_python, args.target, args.draft, prompt_ids, settings, kind,
                                          categories, stop, draft_sample_method=sampling,
                                          concurrency=args.concurrency, dtype=vllm_dtype)
        report.update(vllm_version=response["vllm_version"], vllm_dtype=vllm_dtype,
                      vllm_draft_sampling=sampling or "greedy",
                      vllm_cpu_expand_patched=response.get("cpu_expand_patched", False),
                      vllm_in_process=response.get("in_process", False), compile_seconds=None, results=vllm)
        if args.engine == "vllm":
            outputs = vllm_outputs(response, prompt_ids, settings) if outputs is not None else None
            report.update(device=f"{report['device']}, vLLM {response['vllm_version']}", dtype=vllm_dtype,
                          compiled=False)
    if args.engine != "vllm":
        if args.engine == "both":
            prompt_ids, settings = aligned_inputs(prompt_ids, [o[0] for o in plain_outputs(response)], settings)
        target = load_causal_lm(args.target, device, dtype, args.trust_remote_code)
        # vLLM's ngram takes the earliest occurrence: so does our prompt lookup when comparing (--engine both)
        draft = kind.load(args.draft, target, device, dtype, args.trust_remote_code, earliest=args.engine == "both")
        report.update(draft_vocab=use_draft_vocab(args, draft), acceptance_only=args.acceptance_only)
        report.update(cpu_linear=pack_for_eager_cpu(args, target, draft))
        if args.acceptance_only:
            results = acceptance_only(target, draft, prompt_ids, settings, kind=kind)
            report.update(compile_seconds=None, results=results)
        else:
            results = evaluate_acceptance(target, draft, prompt_ids, settings, progress=not args.quiet,
                                          outputs=outputs, categories=categories, kind=kind)
            report.update(compile_seconds=results[0]["compile_seconds"], results=results)
        if args.engine == "both":
            report.update(vllm_results=vllm, parity_tolerance=args.parity_tolerance,
                          parity=parity_rows(results, vllm, args.parity_tolerance),
                          target_match_vllm=plain_match(response, outputs, settings))

    # ---- report -------------------------------------------------------------------------------------------
    print_report(args, report)
    if args.output:
        write_eval_json(args.output, report)
        print(f"wrote {args.output}")
    if args.save_outputs:
        args.save_outputs.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.save_outputs, "".join(json.dumps(o) + "\n" for o in outputs))
        print(f"wrote {args.save_outputs}")
    return report


def cli(argv: list[str] | None = None, prog: str = PROG) -> None:
    """Console entry point `specdistill-eval` (argv: sys.argv[1:] when None): user errors exit 1 with one line."""
    try:
        report = main(argv, prog)
    except (LoadError, TokenizerMismatchError, ServingError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    failures = out_of_tolerance(report.get("parity", []))
    if failures:
        print(f"error: tau parity beyond --parity-tolerance: {'; '.join(failures)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    cli()
