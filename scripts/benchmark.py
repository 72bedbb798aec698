"""What every benchmark script shares: the machine it ran on, timers and memory readings, worker processes, the
tiny random models and data they run on, and the markdown they write.

    from scripts import benchmark
    parser = benchmark.arguments(__doc__, rows=128, steps=12)       # --device --rows --seq-len --batch-size ...
    result = benchmark.run_worker(__file__, "train", args, mode="online")   # one fresh process, JSON back
    text = benchmark.header(command, args.device, files) + benchmark.markdown_table(headers, rows)

Each measured mode runs in its own process (`run_worker`), so its peak memory is its own; the worker side calls
`worker_args` and prints one JSON line. Numbers depend on the machine: `header` records it with the command
and sha256 prefixes of the files under test; `write_doc` puts a script's tables into a page between its markers.
The benchmarks themselves are scripts/bench_*.py (run from a checkout, never installed).
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import itertools
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import torch
import transformers
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig, TrainerCallback

from decode.measure.table import markdown_table  # noqa: F401  (the benchmarks' tables: the project's one formatter)
from scripts.doc_blocks import (  # noqa: F401  (the page blocks, as every script has reached them: benchmark.X)
    DOC_BLOCK,
    block_options,
    check_doc,
    doc_blocks,
    doc_markers,
    doc_scripts,
    record_block,
    record_of,
    record_options,
    write_doc,
)

ROOT = Path(__file__).resolve().parents[1]  # the checkout: code_version's paths are relative to it
PAD, BOS, EOS = 0, 1, 2


# ---------------------------------------------------------------------------------------------------------------
# The machine and the code
# ---------------------------------------------------------------------------------------------------------------

def machine(device: str, packages: Sequence[str] = ()) -> str:
    """CPU model and cores (or the GPU's name), torch threads, and the versions of Python, torch, transformers and
    `packages` (import names, e.g. "trl")."""
    if device == "cuda":
        what = torch.cuda.get_device_name(0)
    else:
        cpuinfo = Path("/proc/cpuinfo")
        lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []

        def field(name: str) -> str:
            return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(name)), "")
        model = field("model name") or platform.processor() or "unknown CPU"
        # a VM may name only the vendor ("AMD EPYC"): the family and bfloat16 instructions tell its generation
        flags = [f for f in ("avx512_bf16", "amx_bf16") if f in field("flags").split()]
        details = ", ".join(([f"CPU family {field('cpu family')}"] if field("cpu family") else []) + flags)
        what = (f"{model}{f' ({details})' if details else ''}, {os.cpu_count()} cores visible, "
                f"{torch.get_num_threads()} torch threads")
    versions = [f"Python {platform.python_version()}", f"torch {torch.__version__}",
                f"transformers {transformers.__version__}"]
    versions += [f"{name} {__import__(name).__version__}" for name in packages]
    return f"{what}; " + ", ".join(versions)


def code_version(files: Sequence[str]) -> str:
    """sha256 prefixes of the files under test (paths relative to the repository): numbers belong to them."""
    return ", ".join(f"{f} {hashlib.sha256((ROOT / f).read_bytes()).hexdigest()[:12]}" for f in files)


def load_average() -> str:
    """The 1, 5 and 15 minute load averages: other work on shared cores shows here."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def header(command: str, device: str, files: Sequence[str], packages: Sequence[str] = ()) -> list[str]:
    """The opening lines of a result file: the command, the machine and the code version, blank-line separated."""
    return [f"Command: `{command}`", "", f"Machine: {machine(device, packages)}", "",
            f"Code (sha256): {code_version(files)}", ""]


def command_line(script: str) -> str:
    """The command that ran this benchmark, as a user would type it from the repository root."""
    return " ".join([".venv/bin/python", f"scripts/{Path(script).name}", *sys.argv[1:]])


# ---------------------------------------------------------------------------------------------------------------
# Time and memory
# ---------------------------------------------------------------------------------------------------------------

def sync(device: str) -> None:
    """Wait for queued GPU work, so that a clock read after it counts it."""
    if device == "cuda":
        torch.cuda.synchronize()


@dataclass
class Elapsed:
    wall: float = 0.0  # seconds
    cpu: float = 0.0  # CPU seconds of this process, all threads


@contextmanager
def timed(device: str) -> Iterator[Elapsed]:
    """Wall and CPU seconds of the block (GPU work synchronised at both ends), filled in when it exits."""
    elapsed = Elapsed()
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    yield elapsed
    sync(device)
    elapsed.wall, elapsed.cpu = time.perf_counter() - wall, time.process_time() - cpu


def peak_memory_mib(device: str) -> float:
    """High-water mark of the process: torch.cuda.max_memory_allocated, or max RSS (Linux reports KiB)."""
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2 ** 20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_memory_mib(device: str) -> float:
    """Memory held now: torch.cuda.memory_allocated, or the resident set size."""
    if device == "cuda":
        return torch.cuda.memory_allocated() / 2 ** 20
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2 ** 20


# ---------------------------------------------------------------------------------------------------------------
# Worker processes
# ---------------------------------------------------------------------------------------------------------------

def arguments(doc: str, **defaults: Any) -> argparse.ArgumentParser:
    """A parser with the options every benchmark has (defaults overridable by keyword, e.g. steps=8) and the hidden
    ones that tell a worker process its role and mode."""
    values = {**dict(device="cpu", rows=128, seq_len=256, batch_size=8, k=32, steps=8, warmup=2, repeats=2,
                     chunk_size=1024), **defaults}
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--device", default=values["device"], choices=["cpu", "cuda"])
    parser.add_argument("--rows", type=int, default=values["rows"], help="training rows")
    parser.add_argument("--seq-len", type=int, default=values["seq_len"])
    parser.add_argument("--batch-size", type=int, default=values["batch_size"])
    parser.add_argument("--k", type=int, default=values["k"], help="top-k width of the cached teacher")
    parser.add_argument("--steps", type=int, default=values["steps"], help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=values["warmup"], help="untimed optimizer steps before them")
    parser.add_argument("--repeats", type=int, default=values["repeats"],
                        help="runs per mode, alternating modes; the best is shown")
    parser.add_argument("--chunk-size", type=int, default=values["chunk_size"], help="DistillConfig.chunk_size")
    parser.add_argument("--role", default="driver", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-args", default=None, help=argparse.SUPPRESS)
    return parser


def worker_args(args: argparse.Namespace) -> argparse.Namespace:
    """In a worker: the driver's parsed arguments (sent as JSON), with this worker's role and mode."""
    return argparse.Namespace(**{**json.loads(args.worker_args), "role": args.role, "mode": args.mode})


def run_worker(script: str, role: str, args: argparse.Namespace, mode: str | None = None,
               env: dict[str, str] | None = None) -> dict:
    """Run `script` again as a worker (--role, --mode, the driver's arguments as JSON) in a fresh process and return
    the JSON object it prints last. Raises RuntimeError with the worker's stderr when it fails."""
    settings = {k: v for k, v in vars(args).items() if k not in ("role", "mode", "worker_args")}
    command = [sys.executable, str(Path(script).resolve()), "--role", role, "--worker-args",
               json.dumps(settings, default=str)]  # paths as text
    if mode is not None:
        command += ["--mode", mode]
    environment = {**os.environ, **(env or {})}
    if args.device == "cpu":
        environment["CUDA_VISIBLE_DEVICES"] = ""  # trainers pick the CPU
    done = subprocess.run(command, capture_output=True, text=True, env=environment)
    if done.returncode != 0:
        raise RuntimeError(f"{role} worker ({mode}) failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------------
# Tiny random models and data
# ---------------------------------------------------------------------------------------------------------------

def random_llama(hidden: int, layers: int, seed: int, vocab: int) -> nn.Module:
    """A randomly initialised Llama with `hidden` width and `layers` decoder layers over `vocab` tokens."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=int(2.75 * hidden),
                         num_hidden_layers=layers, num_attention_heads=max(hidden // 64, 1),
                         num_key_value_heads=max(hidden // 128, 1), max_position_embeddings=4096,
                         bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=False)
    return AutoModelForCausalLM.from_config(config)


def sharpen(model: nn.Module, factor: float) -> nn.Module:
    """Scale the lm_head (in place) so that a random model's near-uniform distributions look like a trained LM's."""
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(factor)
    return model


def random_rows(rows: int, seq_len: int, seed: int, vocab: int, lowest_id: int = 3) -> datasets.Dataset:
    """{input_ids, labels} rows of exactly seq_len random tokens in [lowest_id, vocab); every position trains."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(lowest_id, vocab, (rows, seq_len), generator=generator).tolist()
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})


# ---------------------------------------------------------------------------------------------------------------
# Inside a transformers.Trainer: step times, the tensor peak of one step, a profile of the timed steps
# ---------------------------------------------------------------------------------------------------------------

class StepTimer(TrainerCallback):
    """Wall and CPU seconds of every optimizer step, taken between consecutive on_step_end calls (the first
    interval starts at on_train_begin), so data loading is included. Also vetoes checkpoint saving."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self._last = (0.0, 0.0)

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        sync(self.device)
        self._last = (time.perf_counter(), time.process_time())

    def on_step_end(self, args, state, control, **kwargs) -> None:
        sync(self.device)
        now = (time.perf_counter(), time.process_time())
        self.wall.append(now[0] - self._last[0])
        self.cpu.append(now[1] - self._last[1])
        self._last = now
        control.should_save = False  # the final-step checkpoint would land outside the timing anyway


def tensor_bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


class TensorMemoryProbe(TrainerCallback):
    """Peak bytes held by tensors during one optimizer step (step `at`), as the allocator sees them.

    CUDA: torch.cuda.max_memory_allocated over that step. CPU: the step is run under torch.profiler with
    profile_memory=True and its allocation events are replayed, so the peak is exact and free of malloc's habit
    of keeping freed pages (which makes RSS depend on tensor sizes); the bytes live at the step's start are counted
    as the weights, gradients and optimizer state then alive. Run after the timed steps (the profiler slows it).
    """

    def __init__(self, device: str, at: int, models: list[nn.Module]) -> None:
        self.device, self.at, self.models = device, at, models
        self.optimizer: torch.optim.Optimizer | None = None
        self.resident_mib = self.step_peak_mib = 0.0
        self._profiler: torch.profiler.profile | None = None

    def _resident_bytes(self) -> int:
        tensors = [t for m in self.models for t in itertools.chain(m.parameters(), m.buffers())]
        tensors += [p.grad for m in self.models for p in m.parameters() if p.grad is not None]
        if self.optimizer is not None:
            tensors += [v for s in self.optimizer.state.values() for v in s.values()]
        return tensor_bytes({id(t): t for t in tensors}.values())

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs) -> None:
        if state.global_step + 1 != self.at:
            return
        self.optimizer = optimizer
        self.resident_mib = self._resident_bytes() / 2 ** 20
        if self.device == "cuda":
            sync(self.device)
            torch.cuda.reset_peak_memory_stats()
            self._start_cuda = torch.cuda.memory_allocated()
            return
        self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
        self._profiler.__enter__()

    def on_step_end(self, args, state, control, **kwargs) -> None:
        if state.global_step != self.at:
            return
        if self.device == "cuda":
            sync(self.device)
            self.step_peak_mib = (torch.cuda.max_memory_allocated() - self._start_cuda) / 2 ** 20
            return
        self._profiler.__exit__(None, None, None)
        events = [e for e in self._profiler.profiler.kineto_results.events()
                  if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
        live = peak = 0
        for event in sorted(events, key=lambda e: e.start_ns()):
            live += event.nbytes()
            peak = max(peak, live)
        self.step_peak_mib = peak / 2 ** 20


def labelled(name: str, fn):
    """`fn` inside a torch.profiler record_function range called `name`."""
    @functools.wraps(fn)
    def wrapper(*a, **k):
        with torch.profiler.record_function(name):
            return fn(*a, **k)
    return wrapper


class ProfileSteps(TrainerCallback):
    """torch.profiler over the timed steps (after the warm-up ones)."""

    def __init__(self, device: str, start: int, stop: int) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(activities=activities)
        self.start, self.stop = start, stop

    def on_step_begin(self, args, state, control, **kwargs) -> None:
        if state.global_step == self.start:  # steps done so far: the warm-up ones (none with --warmup 0)
            self.profiler.__enter__()

    def on_step_end(self, args, state, control, **kwargs) -> None:
        if state.global_step == self.stop:
            self.profiler.__exit__(None, None, None)

    def table(self, device: str, rows: int) -> str:
        key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
        averages = self.profiler.key_averages()
        ranges = [e for e in averages if e.key.startswith("## ")]
        ranges.sort(key=lambda e: -e.cpu_time_total)
        lines = ["phase | total ms (CPU, incl. children) | calls", "---|---|---"]
        lines += [f"{e.key[3:]} | {e.cpu_time_total / 1e3:.0f} | {e.count}" for e in ranges]
        ops = averages.table(sort_by=key, row_limit=rows, max_name_column_width=48)
        return "\n".join(lines) + "\n\n" + ops


# ---------------------------------------------------------------------------------------------------------------
# Writing results
# ---------------------------------------------------------------------------------------------------------------

def write_result(text: str, path: str | None) -> None:
    """Print `text`, and also write it to `path` when one is given."""
    print(text)
    if path:
        Path(path).write_text(text + "\n")
