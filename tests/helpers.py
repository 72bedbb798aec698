"""Helpers shared by the trainer's tests: runs of scripts/train.py in this process or in 2 CPU processes, and
weight comparisons (the tiny models themselves are in tiny.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specdistill.cli import train as train_script

ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPE = str(ROOT / "recipes" / "tiny_distill.yaml")
# For "N processes = 1 process" comparisons at 1e-6: a smooth loss. The recipe's lk_hybrid has TV's kink at p = q,
# where a summation-order difference of 1e-7 between the runs flips the sign of a gradient term, and Adam's
# m / sqrt(v) magnifies it on weights whose gradient is near zero (seen: one embedding entry off by 1.3e-6).
SMOOTH_LOSS = "distill.loss=forward_kl"
# a child process: one thread each (2 processes share 2 cores), nothing from the network
CHILD_ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
             "TOKENIZERS_PARALLELISM": "false",
             "PYTHONFAULTHANDLER": "1"}  # a child killed by SIGABRT/SIGSEGV prints every thread's Python stack


def run_train(workdir: Path, out: str, *overrides: str, target: str = "target") -> Path:
    """specdistill.cli.train.main() on the tiny recipe with workdir's target and code.txt, in this process; returns the
    output folder."""
    output_dir = workdir / out
    train_script.main([TINY_RECIPE, f"model.target={workdir / target}", f"data.dataset={workdir / 'code.txt'}",
                       f"train.output_dir={output_dir}", *overrides])
    return output_dir


def cli_error(monkeypatch, capsys, *argv: str) -> str:
    """The one line specdistill-train prints for a user error (exit status 1, no traceback)."""
    monkeypatch.setattr(sys, "argv", ["specdistill-train", *argv])
    with pytest.raises(SystemExit) as exit_info:
        train_script.cli()
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]  # earlier lines: progress bars and logs
    assert last.startswith("specdistill-train: error: "), err
    return last


def run_process(command: list[str], *, timeout: float, env: dict[str, str] | None = None,
                cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run `command` with this environment + CHILD_ENV + `env`; fails the test (its error lines, stderr's tail) unless
    it exits 0."""
    done = subprocess.run(command, env={**os.environ, **CHILD_ENV, **(env or {})}, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, failure_lines(done.stderr)
    return done


def failure_lines(stderr: str) -> str:
    """A failed child's error lines (the cause may be far above the tail a launcher's report fills), then the tail."""
    marks = ("Error", "error:", "Abort", "terminate called", "what():")
    lines = stderr.splitlines()
    errors = [line for line in lines if any(mark in line for mark in marks)]
    crash = []  # faulthandler's report of a crashed process: where each thread was (above "Extension modules")
    for at in (i for i, line in enumerate(lines) if line.startswith("Fatal Python error")):
        crash += [line for line in lines[at:at + 40] if not line.startswith("Extension modules")][:40]
    return "\n".join(errors[:15] + crash[:80]) + "\n---- the tail of stderr ----\n" + stderr[-3000:]


def accelerate_launch(script: Path | str, *args: str, timeout: float,
                      config_file: Path | None = None) -> subprocess.CompletedProcess:
    """`script` in 2 CPU processes under `accelerate launch` (DDP over gloo, shared/ENVIRONMENT.md; or the launch
    config `config_file` with --num_processes 2); must exit 0."""
    return run_process(accelerate_command(script, *args, config_file=config_file), timeout=timeout,
                       env={"ACCELERATE_USE_CPU": "true"})


def accelerate_command(script: Path | str, *args: str, config_file: Path | None = None) -> list[str]:
    """The `accelerate launch` command line of accelerate_launch."""
    mode = ["--config_file", str(config_file)] if config_file else ["--multi_gpu", "--num_machines", "1",
                                                                    "--mixed_precision", "no"]
    return [sys.executable, "-m", "accelerate.commands.launch", *mode, "--num_processes", "2", "--dynamo_backend",
            "no", str(script), *args]


def torchrun(script: Path | str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """`script` in 2 CPU processes under torch.distributed.run (the scripts that set DeepSpeed up themselves);
    must exit 0."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(script), *args]
    return run_process(command, timeout=timeout, env={"DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)})


def assert_same_weights(expected_file: Path, got_file: Path, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """The two safetensors files hold the same tensor names and values within rtol / atol (naming the tensor)."""
    expected, got = load_file(expected_file), load_file(got_file)
    assert set(got) == set(expected), (got_file, sorted(set(got) ^ set(expected)))
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=rtol, atol=atol,
                                   msg=lambda m: f"{got_file} {key}: {m}")


class ForwardCounter:
    """Counts the target's base-model forward passes; raises on pass number `fail_at` (an interrupted build)."""

    def __init__(self, model, fail_at: int | None = None):
        self.calls, self.fail_at = 0, fail_at
        self.handle = model.base_model.register_forward_pre_hook(self)

    def __call__(self, module, args):
        self.calls += 1
        if self.calls == self.fail_at:
            raise KeyboardInterrupt("simulated interruption")

    def remove(self):
        self.handle.remove()


def learnt_tiny_pair(root: Path) -> Path:
    """root/target (a 4-layer tiny Llama that has learnt TINY_TEXT for 60 steps; its embedding has one spare row past
    the tokenizer, for a mask token) and root/code.txt; returns root. The block drafters' whole-run tests train
    on it."""
    from tiny import TINY_TEXT, tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    target = tiny_model("llama", vocab_size=len(tokenizer) + 1, hidden=32, layers=4).train()
    ids = torch.tensor(tokenizer(TINY_TEXT)["input_ids"])
    optimizer = torch.optim.AdamW(target.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(60):
        starts = torch.randint(0, len(ids) - 65, (8,), generator=generator)
        batch = torch.stack([ids[s:s + 65] for s in starts])
        target(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    target.eval().save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    (root / "code.txt").write_text(TINY_TEXT)
    return root


def record_packing(monkeypatch, module, name: str) -> list[bool]:
    """Wrap the function ``module.name`` (first argument: a model) so that each call records whether that model's
    lm_head is a oneDNN-packed layer at that moment; returns the list the records go to."""
    from decode.loop.packed_linear import PackedLinear

    seen: list[bool] = []
    real = getattr(module, name)

    def recording(model, *args, **kwargs):
        seen.append(isinstance(model.lm_head, PackedLinear))
        return real(model, *args, **kwargs)

    monkeypatch.setattr(module, name, recording)
    return seen


def as_bash_runs_them(commands: str) -> list[list[str]]:
    """The commands a printed block (`specdistill check`'s serving commands) runs, each as the argument list bash
    hands it: the block runs in bash as printed, with vllm, python, specdistill-eval and specdistill stand-ins that
    only record their arguments."""
    record = 'printf "%s\\x1f" "$0" "$@"; printf "\\x1e"'
    stand_ins = "".join(f'{name}() {{ {record.replace("$0", name)}; }}\n'
                        for name in ("vllm", "python", "specdistill-eval", "specdistill"))
    out = subprocess.run(["bash", "-c", stand_ins + commands], capture_output=True, text=True, check=True).stdout
    return [record.split("\x1f")[:-1] for record in out.split("\x1e")[:-1]]
