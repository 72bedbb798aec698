"""Load on a served endpoint with GuideLLM (vllm-project/guidellm, installed beside vLLM by `make serving`): requests
over HTTP at fixed concurrency levels (or request rates), each level's output throughput, time to first token and
inter-token latency read back from GuideLLM's JSON.

    data = write_dataset(folder / "prompts.jsonl", texts, output_tokens=64)   # every request asks 64 tokens
    levels = run_load(guidellm, server.url, tokenizer_folder, data, streams=[1, 4, 8], requests=16,
                      out=folder / "plain.json")
    # -> [{"level": "concurrent@1", "streams": 1, "output_tokens_per_s": ..., "ttft_ms_p50": ..., ...}, ...]

Throughput is the level's output tokens over its duration (what a server delivers), TTFT and ITL the percentiles
GuideLLM measured per request (streaming). Requests carry `ignore_eos`, a fixed max_tokens (GuideLLM's
output_tokens_count column) and the temperature asked (0: greedy), so both servers are asked the same work.
"""
from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Sequence
from pathlib import Path

from decode.inputs.checks import read_text
from decode.inputs.command_line import REQUEST_TIMEOUT_S
from decode.serving.http_server import ServerError, last_line, stop

PERCENTILES = ("p50", "p99")
START_S = 120.0  # GuideLLM's own start (its worker processes, the tokenizer) and end, beyond the requests' time


def find_guidellm(python: Path) -> Path:
    """GuideLLM's command beside the vLLM interpreter; ServerError (one line) when it is not installed there."""
    command = Path(python).parent / "guidellm"
    if not command.is_file():
        raise ServerError(f"GuideLLM is not installed beside {python}: run `make serving` (it installs guidellm "
                          "into .venv-vllm)")
    return command


def write_dataset(path: Path, texts: Sequence[str], output_tokens: int) -> Path:
    """A GuideLLM json_file dataset: one row per prompt text, each asking ``output_tokens`` tokens."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": text, "output_tokens_count": output_tokens}) + "\n"
                            for text in texts), encoding="utf-8")
    return path


def guidellm_command(guidellm: Path, url: str, tokenizer: str, data: Path, out: Path, requests: int,
                     streams: Sequence[int] = (), rates: Sequence[float] = (), temperature: float = 0.0,
                     request_timeout: float = REQUEST_TIMEOUT_S) -> list[str]:
    """`guidellm run` over /v1/completions: one sub-benchmark per concurrency level (`concurrent`, streams) or request
    rate (`constant`, requests/s), each stopped after ``requests`` requests, every request sampled at ``temperature``
    (GuideLLM sends none of its own: the server's default, 1.0 in vLLM, would apply) and counted failed when its
    answer stalls ``request_timeout`` seconds (GuideLLM's own default waits for ever)."""
    if rates:
        profile, override = "kind=constant,rate=" + str(rates[0]), ["--override", "profile.rate",
                                                                    ",".join(f"{r:g}" for r in rates)]
    else:
        profile, override = "kind=concurrent,streams=" + str(streams[0]), ["--override", "profile.streams",
                                                                           ",".join(str(s) for s in streams)]
    backend = {"kind": "openai_http", "target": url, "request_format": "/v1/completions",
               "timeout": float(request_timeout), "extras": {"body": {"temperature": float(temperature)}}}
    return [str(guidellm), "run", "--backend", json.dumps(backend),
            "--profile", profile, *override, "--constraint", f"kind=max_requests,count={requests}",
            "--data", f"kind=json_file,path={data}", "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
            "--output", f"kind=json,path={out}", "--disable-console-interactive"]


def level_metrics(benchmark: dict) -> dict:
    """One GuideLLM sub-benchmark as a level: its strategy, completed and failed requests, output tokens/s over the
    level's duration, TTFT and ITL at the PERCENTILES (ms)."""
    metrics, strategy = benchmark["metrics"], benchmark["config"]["strategy"]
    totals = metrics["request_totals"]
    output_tokens = metrics["output_token_count"]["successful"]["total_sum"]
    level = {"level": f"{strategy['type_']}@{strategy.get('streams') or strategy.get('rate')}",
             "streams": strategy.get("streams"), "rate": strategy.get("rate"),
             "requests": totals["successful"], "errored": totals["errored"], "output_tokens": output_tokens,
             "seconds": benchmark["duration"], "output_tokens_per_s": output_tokens / benchmark["duration"]}
    for name, key in (("ttft_ms", "time_to_first_token_ms"), ("itl_ms", "inter_token_latency_ms")):
        percentiles = metrics[key]["successful"]["percentiles"]
        level.update({f"{name}_{p}": percentiles[p] for p in PERCENTILES})
    return level


def load_bound_s(requests: int, streams: Sequence[int] = (), rates: Sequence[float] = (),
                 request_timeout: float = REQUEST_TIMEOUT_S) -> float:
    """The longest a load may legitimately take: every request of every level as slow as it may be before it counts
    failed (at concurrency c, ceil(requests / c) waves of them; at a rate, arrivals over requests / rate seconds, then
    the last one's answer), plus GuideLLM's start. Past it GuideLLM itself is stuck."""
    waves = [math.ceil(requests / c) * request_timeout for c in streams]
    arrivals = [requests / r + request_timeout for r in rates]
    return START_S + sum(waves) + sum(arrivals)


def run_load(guidellm: Path, url: str, tokenizer: str, data: Path, out: Path, requests: int,
             streams: Sequence[int] = (), rates: Sequence[float] = (), temperature: float = 0.0,
             log: Path | None = None, request_timeout: float = REQUEST_TIMEOUT_S) -> list[dict]:
    """Drive the server at ``url`` with GuideLLM; the levels in the order given. ServerError (one line) when GuideLLM
    fails, runs past load_bound_s (it is stopped, with the processes it started), or a level's requests failed."""
    command = guidellm_command(guidellm, url, tokenizer, data, out, requests, streams, rates, temperature,
                               request_timeout)
    log = log or out.with_suffix(".log")
    bound = load_bound_s(requests, streams, rates, request_timeout)
    with open(log, "w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = process.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            raise ServerError(f"guidellm did not finish within {bound:.0f} s, the most its requests may take "
                              f"(stopped; log: {log})") from None
        finally:
            stop(process)  # its worker processes too, however the wait ended
    if returncode or not out.is_file():
        raise ServerError(f"guidellm exited with code {returncode}: {last_line(log)} (log: {log})")
    levels = [level_metrics(b) for b in json.loads(read_text(out))["benchmarks"]]
    failed = [level["level"] for level in levels if level["errored"] or not level["requests"]]
    if failed:
        raise ServerError(f"requests failed at {', '.join(failed)} (GuideLLM's report: {out}; its log: {log})")
    return levels
