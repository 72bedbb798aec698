"""Benchmark: plain vs speculative vs transformers assisted decoding, eager and compiled, one pair, printed ratios.

    python scripts/bench_decode.py                                  # synthetic pair built here (no download)
    python scripts/bench_decode.py --target T --draft D --prompts prompts.jsonl --device cuda --dtype bfloat16
    python scripts/bench_decode.py --markdown docs/benchmarks/decode.md   # append the table to a file
    python scripts/bench_decode.py --compile --gamma 2 4 auto       # eager rows, then compiled
                                                                    # rows (decode.loop.static)

The synthetic pair gives real partial acceptance at realistic cost ratios: a random Llama target whose deeper
layers write only small updates into the residual stream (``--depth-scale``), and a draft made of its first
``--draft-layers`` layers (embeddings, final norm and lm_head shared). Goals checked by the printed ratios:
speculative tokens/s >= 1.5x transformers assisted generation, measured speedup >= 0.9x the cost model.
The machine description, the command line and the markdown table come from the shared harness
(scripts/benchmark.py).
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python scripts/bench_decode.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from decode.inputs.loading import load_causal_lm, load_tokenizer, resolve_device, resolve_dtype
from decode.inputs.prompts import encode_prompt_rows, read_prompt_rows
from decode.measure.settings import EvalSettings
from decode.measure.table import format_table
from scripts import benchmark
from specdistill.cli.eval import gamma_value
from specdistill.drafts import evaluate_acceptance

CODE = ["decode/loop/speculative.py", "decode/loop/static.py", "decode/measure/cost_model.py",
        "decode/measure/evaluate.py"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target"), p.add_argument("--draft"), p.add_argument("--prompts")
    p.add_argument("--gamma", type=gamma_value, nargs="+", default=[2, 3, 4], help="integers and/or 'auto'")
    p.add_argument("--compile", action="store_true", help="also measure the static-cache, torch.compiled path")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--num-prompts", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--hidden", type=int, default=256, help="synthetic target width")
    p.add_argument("--layers", type=int, default=8, help="synthetic target depth")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--draft-layers", type=int, default=1)
    p.add_argument("--depth-scale", type=float, default=0.05, help="output scale of target layers the draft lacks")
    p.add_argument("--markdown", type=Path, help="append the measured table (with the machine) to this file")
    p.add_argument("--json", type=Path, help="write the raw results here")
    return p.parse_args(argv)


def synthetic_pair(args, device, dtype):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=int(args.hidden * 2.75),
                      num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                      num_key_value_heads=args.hidden // 64, max_position_embeddings=4096)
    target = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(4.0)  # peaked next-token distributions, like a trained LM
        for layer in target.model.layers[args.draft_layers:]:
            layer.self_attn.o_proj.weight.mul_(args.depth_scale)
            layer.mlp.down_proj.weight.mul_(args.depth_scale)
    draft = copy.deepcopy(target)
    draft.model.layers = draft.model.layers[: args.draft_layers]
    draft.config.num_hidden_layers = args.draft_layers
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, args.vocab, (48,), generator=g) for _ in range(args.num_prompts)]
    name = (f"synthetic llama {args.hidden}x{args.layers} (vocab {args.vocab}, depth scale {args.depth_scale})"
            f" / first {args.draft_layers} layer(s)")
    return target.to(device, dtype), draft.to(device, dtype), prompts, name


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    if args.target:
        tok = load_tokenizer(args.target)
        target = load_causal_lm(args.target, device, dtype)
        draft = load_causal_lm(args.draft, device, dtype)
        prompts = encode_prompt_rows(tok, read_prompt_rows(args.prompts, limit=args.num_prompts), max_prompt_tokens=256)
        name = f"{args.target} / {args.draft}"
    else:
        target, draft, prompts, name = synthetic_pair(args, device, dtype)
    results = []
    for compile in ([False, True] if args.compile else [False]):
        settings = EvalSettings(gammas=args.gamma, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                                compare_hf=True, compile=compile)
        results += evaluate_acceptance(target, draft, prompts, settings)

    rows = [{"drafter": "compiled" if r["compiled"] else "eager", **r} for r in results]
    where = benchmark.machine(device.type)
    print(f"pair: {name}\nmachine: {where}; {str(dtype).replace('torch.', '')}, greedy, batch 1")
    print(format_table(rows))
    for r in results:
        path = "compiled" if r["compiled"] else "eager"
        print(f"{path} gamma={r['gamma']}: speculative/plain = {r['speedup']:.2f}x, "
              f"speculative/hf-assisted = {r['speculative_tokens_per_s'] / r['hf_assisted_tokens_per_s']:.2f}x, "
              f"measured/predicted speedup = {r['speedup'] / r['predicted_speedup']:.2f}")
    for line in compiled_vs_eager(results):
        print(line)
    if args.markdown:
        write_markdown(args.markdown, name, device, dtype, results)
    if args.json:
        args.json.write_text(json.dumps({"pair": name, "machine": where, "results": results}, indent=2))
    return results


def compiled_vs_eager(results: list[dict]) -> list[str]:
    """compiled / eager tokens/s, plain and speculative, per gamma measured both ways."""
    eager = {r["gamma"]: r for r in results if not r["compiled"]}
    lines = []
    for r in results:
        if r["compiled"] and r["gamma"] in eager:
            e = eager[r["gamma"]]
            lines.append(f"gamma={r['gamma']}: compiled/eager plain tok/s = "
                         f"{r['target_tokens_per_s'] / e['target_tokens_per_s']:.2f}x, speculative tok/s = "
                         f"{r['speculative_tokens_per_s'] / e['speculative_tokens_per_s']:.2f}x "
                         f"(compile {r['compile_seconds']:.0f} s, excluded)")
    return lines


def write_markdown(path: Path, name: str, device: torch.device, dtype, results: list[dict]) -> None:
    """Append the pair's section: the harness's header (command, machine, code version), the load average, the
    table of every row and the compiled / eager ratios."""
    headers = ["path", "gamma", "acceptance_rate", "tau", "c", "v", "plain tok/s", "speculative tok/s",
               "hf assisted tok/s", "speedup", "predicted", "spec / hf", "measured / predicted"]
    rows = []
    for r in results:
        gamma = f"auto (mean {r['mean_gamma']:.2f})" if r["gamma"] == "auto" else r["gamma"]
        rows.append(["compiled" if r["compiled"] else "eager", gamma, f"{r['acceptance_rate']:.3f}",
                     f"{r['mean_accepted_tokens']:.2f}", f"{r['draft_cost_ratio']:.2f}",
                     f"{r['verify_cost_ratio']:.2f}", f"{r['target_tokens_per_s']:.1f}",
                     f"{r['speculative_tokens_per_s']:.1f}", f"{r['hf_assisted_tokens_per_s']:.1f}",
                     f"{r['speedup']:.2f}x", f"{r['predicted_speedup']:.2f}x",
                     f"{r['speculative_tokens_per_s'] / r['hf_assisted_tokens_per_s']:.2f}x",
                     f"{r['speedup'] / r['predicted_speedup']:.2f}"])
    lines = [f"\n### {name}\n",
             *benchmark.header(benchmark.command_line(__file__), device.type, CODE),
             f"{str(dtype).replace('torch.', '')}; greedy; batch 1; load average at the end "
             f"{benchmark.load_average()}.", "", *benchmark.markdown_table(headers, rows)]
    ratios = compiled_vs_eager(results)
    if ratios:
        lines += ["", *[f"- {line}" for line in ratios]]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write("\n".join(lines) + "\n")

if __name__ == "__main__":
    main()
