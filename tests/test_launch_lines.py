"""Every `accelerate launch` line that README.md, docs/ and recipes/ give, run exactly as written: through bash, by
the venv's own `accelerate` command, in a folder that holds recipes/ and scripts/ as a checkout does. Only the
placeholders are filled: RECIPE.yaml is a file there (a tiny recipe), TARGET_DIR and TEXT_FILE (tiny_onpolicy.yaml's
header) a tiny target and a text file.

On a machine without a GPU (this one, CI):
- a line that launches processes for GPUs (ddp.yaml, the DeepSpeed configs, fsdp.yaml: use_cpu false, 8 processes)
  stops before anything loads with one line, printed once for all 8 processes, naming the launch that works on CPU
  processes; nothing is written;
- the CPU lines (ACCELERATE_USE_CPU=true ... --num_processes 2) and the one-process config train to the end.
On a GPU machine the GPU lines are not run here: they start one process per GPU of an 8-GPU machine.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from specdistill.cli.launch import CPU_LAUNCH

from helpers import CHILD_ENV, ROOT
from tiny import TINY_TEXT, save_and_load, tiny_model, tiny_tokenizer

pytestmark = pytest.mark.integration

PLACES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "recipes").rglob("*.md")),
          *sorted((ROOT / "recipes").rglob("*.yaml"))]
START = re.compile(r"^(ACCELERATE_USE_CPU=true )?accelerate launch ")
GPU_REFUSAL = re.compile(r"specdistill-train: error: accelerate launched 8 processes for GPUs \((DDP|DeepSpeed|FSDP): "
                         r"the accelerate config says use_cpu: false\) and this machine has no GPU; try a recipe on "
                         r"CPU processes \(DDP over gloo\) with: " + re.escape(CPU_LAUNCH) + "$")


def launch_lines() -> dict[str, list[str]]:
    """Every distinct launch line (continuations joined, a trailing # comment dropped) -> where it is written."""
    found: dict[str, list[str]] = {}
    for place in PLACES:
        lines = place.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            text = lines[i].strip().lstrip("#").strip()
            where = f"{place.relative_to(ROOT)}:{i + 1}"
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1] + " " + lines[i].strip().lstrip("#").strip()
            i += 1
            if START.match(text):
                line = " ".join(shlex.split(text, comments=True))
                found.setdefault(line, []).append(where)
    return found


LINES = launch_lines()


def runs_here(line: str) -> bool:
    """A line that trains on this machine: a CPU launch, the one-process config, or any line where a GPU is."""
    return line.startswith("ACCELERATE_USE_CPU=true ") or "single_process.yaml" in line


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A folder as a user's checkout looks for these lines: recipes/ and scripts/, RECIPE.yaml, a tiny target."""
    folder = tmp_path_factory.mktemp("launch")
    for name in ("recipes", "scripts"):
        (folder / name).symlink_to(ROOT / name)
    tok = tiny_tokenizer()
    save_and_load(tiny_model("llama", vocab_size=len(tok), hidden=32, layers=2), folder / "target", tok)
    (folder / "code.txt").write_text(TINY_TEXT)
    recipe = yaml.safe_load((ROOT / "recipes" / "tiny_distill.yaml").read_text())
    recipe["model"]["target"] = str(folder / "target")
    recipe["data"].update(dataset=str(folder / "code.txt"), num_eval_prompts=2)
    recipe["train"].update(output_dir="outputs/recipe", max_steps=4, save_steps=4, report_to=[])
    recipe["eval"].update(gammas=[2], max_new_tokens=8)
    (folder / "RECIPE.yaml").write_text(yaml.safe_dump(recipe))
    return folder


# What a user's shell holds; nothing this test process (or a test before it) set up for accelerate, torch.distributed
# or DeepSpeed (RANK, WORLD_SIZE, MASTER_PORT, ACCELERATE_*, DS_ACCELERATOR, ...) reaches the line.
SHELL_VARIABLES = ("PATH", "HOME", "USER", "SHELL", "TERM", "LANG", "TMPDIR")
SHELL_PREFIXES = ("LC_", "HF_", "XDG_")


def run_as_written(line: str, folder: Path) -> subprocess.CompletedProcess:
    filled = line.replace("TARGET_DIR", str(folder / "target")).replace("TEXT_FILE", str(folder / "code.txt"))
    shell = {k: v for k, v in os.environ.items() if k in SHELL_VARIABLES or k.startswith(SHELL_PREFIXES)}
    env = {**shell, **CHILD_ENV, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", filled], cwd=folder, env=env, capture_output=True, text=True, timeout=600)


def test_the_launch_lines_are_found_where_users_read_them():
    """The collector itself: the README's line, each shipped accelerate config's header, the CPU line."""
    assert any("README.md:" in w for where in LINES.values() for w in where)
    for config in (ROOT / "recipes" / "accelerate").glob("*.yaml"):
        assert f"accelerate launch --config_file recipes/accelerate/{config.name} scripts/train.py RECIPE.yaml" in LINES
    assert sum(runs_here(line) for line in LINES) >= 3
    for line in LINES:  # every file a line names exists (the placeholders aside)
        for word in shlex.split(line):
            if word.endswith(".yaml") and word != "RECIPE.yaml":
                assert (ROOT / word).is_file(), (line, LINES[line])


@pytest.mark.parametrize("line", sorted(LINES), ids=lambda line: LINES[line][0])
def test_a_launch_line_runs_as_written(line, checkout):
    if not runs_here(line) and torch.accelerator.is_available():
        pytest.skip("a GPU launch of 8 processes: set num_processes to your GPU count")
    done = run_as_written(line, checkout)
    ours = [x for x in done.stderr.splitlines() if x.startswith("specdistill-train:")]
    assert "distill/" not in done.stderr, done.stderr[-3000:]  # no traceback of ours
    if runs_here(line):
        assert done.returncode == 0 and not ours, (LINES[line], done.stderr[-3000:])
        out = checkout / ("outputs/tiny_onpolicy" if "tiny_onpolicy" in line else "outputs/recipe")
        assert (out / "train_results.json").is_file() and (out / "model.safetensors").is_file()
        assert (out / "acceptance.jsonl").read_text().strip()
        subprocess.run(["rm", "-rf", str(checkout / "outputs")], check=True)
        return
    assert done.returncode != 0
    assert len(ours) == 1 and GPU_REFUSAL.match(ours[0]), (LINES[line], ours, done.stderr[-3000:])
    assert not (checkout / "outputs").exists()  # stopped before anything was written
