"""The run of `specdistill eval`: the arguments checked, the models loaded, the draft measured, the report printed
and written. specdistill.cli.eval parses the command line and imports this module only then, so that `--help` and
usage errors answer before torch loads."""
from __future__ import annotations

import argparse
import json
import sys

import torch

from decode.inputs.checks import check_writable_file
from decode.inputs.loading import LoadError, load_causal_lm, load_tokenizer, resolve_device, resolve_dtype
from decode.inputs.prompts import (
    PromptFields,
    check_chat_template,
    encode_prompt_rows,
    raw_prompts_note,
    read_prompt_rows,
)
from decode.inputs.vocab import TokenizerMismatchError
from decode.inputs.writes import write_atomic
from decode.loop.auto_gamma import fixed_gammas
from decode.measure.evaluate import acceptance_only, evaluate_acceptance
from decode.measure.results import write_eval_json
from decode.measure.settings import EvalSettings
from decode.serving.parity import aligned_inputs, parity_rows
from decode.serving.vllm_engine import (
    ServingError,
    evaluate_in_vllm,
    find_vllm_python,
    plain_outputs,
    resolve_vllm_dtype,
    vllm_outputs,
)
from kinds import kind_of_source
from specdistill.cli.eval_inputs import (
    check_context_fits,
    check_draft_fits,
    check_draft_tokenizer,
    check_model_paths,
    with_model_folders,
)
from specdistill.cli.eval_models import pack_for_eager_cpu, use_draft_vocab
from specdistill.cli.eval_report import describe_device, plain_match, print_report


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


def run(args: argparse.Namespace) -> dict:
    """Check, load, measure and report what the parsed command line asks; the report (the JSON --output writes)."""
    check_args(args)
    torch.manual_seed(args.seed)
    vllm_python = find_vllm_python(args.vllm_python) if args.engine != "specdistill" else None

    # ---- inputs -------------------------------------------------------------------------------------------
    fields = PromptFields(args.prompt_field, args.messages_field, args.category_field, "--prompt-field")
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
    check_context_fits(args, tokenizer, prompt_ids)
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

    # ---- report: the files before the table, so that a reader who leaves early (`| head`) loses nothing ------
    if args.output:
        write_eval_json(args.output, report)
    if args.save_outputs:
        args.save_outputs.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.save_outputs, "".join(json.dumps(o) + "\n" for o in outputs))
    print_report(args, report)
    for written in (args.output, args.save_outputs):
        if written:
            print(f"wrote {written}")
    return report


# what `specdistill eval` answers in one line (exit 1) rather than a traceback
USER_ERRORS = (LoadError, TokenizerMismatchError, ServingError, ValueError)
