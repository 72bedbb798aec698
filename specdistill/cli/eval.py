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
is the parser and the entry points and imports no torch (`--help` answers at once); the run is eval_run.py, the checks
made before any weight loads eval_inputs.py, what the run does to the loaded models (the draft vocabulary, packed
linear layers on CPU) eval_models.py, the printed report eval_report.py.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from decode.inputs.command_line import (
    CHAT_TEMPLATE_MODES,
    CPU_LINEAR_MODES,
    DRAFT_SAMPLE_METHODS,
    PARITY_TOLERANCE,
    VLLM_DTYPE_CHOICES,
    OneLineArgumentParser,
)
from kinds.prompt_lookup import PROMPT_LOOKUP
from specdistill.cli.closed_pipe import quiet_on_a_closed_pipe

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
    p.add_argument("--parity-tolerance", type=float, default=PARITY_TOLERANCE,
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


def main(argv: list[str] | None = None, prog: str = PROG) -> dict:
    """Parse and run (specdistill.cli.eval_run); the report. Errors propagate (`cli` turns them into one line)."""
    from specdistill.cli.eval_run import run  # torch, transformers and the decoder load here, after the parse

    return run(parse_args(argv, prog))


@quiet_on_a_closed_pipe
def cli(argv: list[str] | None = None, prog: str = PROG) -> None:
    """Console entry point `specdistill-eval` (argv: sys.argv[1:] when None): user errors exit 1 with one line."""
    args = parse_args(argv, prog)  # --help and usage errors answer here, before torch loads
    from decode.inputs.command_line import interrupted_in_one_line

    kept = f"nothing was written (--output {args.output} is written once every gamma is measured)" \
        if args.output else "nothing was written"
    with interrupted_in_one_line(prog, kept):  # Ctrl-C anywhere, torch's import included
        from decode.serving.parity import out_of_tolerance
        from specdistill.cli.eval_run import USER_ERRORS, run

        try:
            report = run(args)
        except USER_ERRORS as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(1)
    failures = out_of_tolerance(report.get("parity", []))
    if failures:
        print(f"error: tau parity beyond --parity-tolerance: {'; '.join(failures)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    cli()
