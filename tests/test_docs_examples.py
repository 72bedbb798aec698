"""Every runnable example in README.md and docs/ runs, on a tiny pair (docs/developer/testing.md).

A ```bash or ```python fence is runnable unless the line before it is `<!-- not run: REASON -->`; `<!-- exit: N -->`
says it must exit with N. A page's fences run in order in one scratch folder that holds `recipes/` and `scripts/`,
so an example may use what an earlier one on the same page wrote. The variables the examples use (TARGET, DRAFT,
PROMPTS, CORPUS) point to a tiny pair built here; `specdistill` is the venv's command; the folder also holds
`.venv-vllm` when `make serving` made one. Pages whose examples run the real model (SmolLM2's GGUF) or vLLM run in
tests/test_docs_examples_heavy.py, so that the test workers share them out; converted GGUF folders are cached once
per file.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import CHILD_ENV
from tiny import TINY_TEXT, perturbed_copy, save_and_load, tiny_model, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = {"bash", "python"}
MARKER = re.compile(r"<!--\s*(not run|exit):\s*(.*?)\s*-->")
FENCE = re.compile(r"^(\s*)```(\S*)")
TIMEOUT = 600  # seconds per example (a real-model page's on a slow 2-core machine: ~3x its time on a quick one)


@dataclass
class Example:
    page: str
    line: int            # 1-based line of the opening fence
    language: str
    code: str
    skip_reason: str | None = None
    exit_code: int = 0


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def examples_of(page: Path) -> list[Example]:
    """The fenced code blocks of a Markdown page, with the marker of the line before each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, language = opening.groups()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
        code = "\n".join(line[len(indent):] for line in lines[i + 1:end]) + "\n"
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.search(before)
        example = Example(str(page.relative_to(ROOT)), i + 1, language, code)
        if marker and marker.group(1) == "not run":
            example.skip_reason = marker.group(2)
        elif marker:
            example.exit_code = int(marker.group(2))
        found.append(example)
        i = end + 1
    return found


def runnable(page: Path) -> list[Example]:
    return [e for e in examples_of(page) if e.language in RUNNABLE and e.skip_reason is None]


# what a runnable example needs beyond the tiny pair: vLLM (the serving venv), or the real model (minutes of CPU)
NEEDS_VLLM = re.compile(r"--engine (vllm|both)|--serve\b|bench-serve|serving_engine=vllm|scripts/bench_serv(ing|ed)\.py"
                        r"|--engines .*vllm|--vllm\b")
# (a benchmark script takes minutes even at the smoke size its page gives it)
NEEDS_REAL_MODEL = re.compile(r"smollm2_gguf|scripts/quickstart\.py|scripts/bench_")


def heavy(page: Path) -> bool:
    """Whether the page's examples run vLLM or the real model (tests/test_docs_examples_heavy.py runs those)."""
    return any(NEEDS_VLLM.search(e.code) or NEEDS_REAL_MODEL.search(e.code) for e in runnable(page))


def runnable_pages(heavy_ones: bool = False) -> list[Path]:
    return [page for page in doc_pages() if runnable(page) and heavy(page) == heavy_ones]


def page_params(pages: list[Path]) -> list:
    """The pages as test parameters, each with a time limit that fits its examples (each one killed at TIMEOUT, the
    tiny pair built first) in place of the suite's 900 s per test (pyproject.toml)."""
    return [pytest.param(page, id=str(page.relative_to(ROOT)),
                         marks=pytest.mark.timeout(len(runnable(page)) * TIMEOUT + 300)) for page in pages]


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory) -> dict[str, str]:
    """The variables the examples use: a tiny target (4 layers: a head reads 3; head_dim 32, the smallest vLLM's CPU
    attention runs) and draft, prompts, a corpus, and one cache for converted GGUF folders."""
    root = tmp_path_factory.mktemp("docs_world")
    tok = tiny_tokenizer()
    target = tiny_model("llama", seed=0, vocab_size=len(tok), layers=4, hidden=128)  # head_dim 32: vLLM's CPU kernels
    save_and_load(target, root / "target", tok)
    save_and_load(perturbed_copy(target, 0.1), root / "draft", tok)
    prompts = [("def add(a, b):", "code"), ("class Point:", "code"), ("for i in range(10):", "loops"),
               ("import os", "imports")]
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p, "category": c}) + "\n" for p, c in prompts))
    (root / "corpus.txt").write_text(TINY_TEXT * 8)
    return {"TARGET": str(root / "target"), "DRAFT": str(root / "draft"), "PROMPTS": str(root / "prompts.jsonl"),
            "CORPUS": str(root / "corpus.txt"), "SPECDISTILL_CACHE": str(root / "cache")}


def run_example(example: Example, workdir: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run one example in a process group of its own: on a timeout the whole group is killed, the scripts and
    trainers the example started included (left running, they would slow every page after it into a timeout too)."""
    if example.language == "bash":
        command = ["bash", "-euo", "pipefail", "-c", example.code]
    else:
        command = [sys.executable, "-c", example.code]
    with subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            try:  # a process that left the group (a server on a session of its own) may still hold the pipes
                stdout, stderr = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                stdout, stderr = "", "(its output unread: a process outside its group held the pipes)"
            pytest.fail(f"{example.page}:{example.line} ran past {TIMEOUT} s (its process group killed)\n"
                        f"--- code\n{example.code}--- stdout (end)\n{stdout[-3000:]}--- stderr (end)\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def test_every_fence_is_closed_and_every_marker_names_a_reason():
    for page in doc_pages():
        text = page.read_text(encoding="utf-8")
        assert len(re.findall(r"^\s*```", text, flags=re.M)) % 2 == 0, f"{page}: an unclosed code fence"
        for example in examples_of(page):
            assert example.skip_reason != "", f"{example.page}:{example.line}: `not run` without a reason"


BARE_COMMAND = re.compile(r"^\s*(\.venv/bin/|python3? |specdistill|make |accelerate |vllm |OMP_NUM_THREADS=)")


def test_no_command_hides_in_a_fence_without_a_language():
    """A command goes in a ```bash fence, which the docs test runs (or a `not run` marker excuses): a bare ``` fence
    would leave it untested."""
    for page in doc_pages():
        for example in examples_of(page):
            if example.language == "":
                lines = [line for line in example.code.splitlines() if BARE_COMMAND.match(line)]
                assert not lines, f"{example.page}:{example.line}: a command in a bare fence: {lines[0]}"


def test_the_readme_has_runnable_examples_and_the_collector_finds_markers():
    """The collector itself: it finds the README's runnable fences and honours both markers."""
    readme = examples_of(ROOT / "README.md")
    assert any(e.language == "bash" and e.skip_reason is None for e in readme)
    assert any(e.skip_reason for e in readme)
    reliability = examples_of(ROOT / "docs" / "guides" / "reliability.md")
    assert any(e.exit_code == 1 for e in reliability)


def run_page(page: Path, world: dict[str, str], tmp_path: Path, deadline: float | None = None) -> None:
    """Every runnable example of ``page``, in order, in one scratch folder that holds recipes/ and scripts/ (and
    .venv-vllm when there is one), as a checkout does, the interpreter's venv as `.venv` and a copy of docs/ (a
    benchmark's `--json` / `--doc` / `--plot` write there, not into the checkout's pages). Past ``deadline`` (a Unix
    time) no further example starts: the page is reported skipped, naming the first example left out."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    for name in ("recipes", "scripts", ".venv-vllm"):
        if (ROOT / name).exists():
            (workdir / name).symlink_to(ROOT / name)
    venv = Path(sys.prefix)
    if (venv / "pyvenv.cfg").exists():
        (workdir / ".venv").symlink_to(venv)
    shutil.copytree(ROOT / "docs", workdir / "docs")
    env = {**os.environ, **CHILD_ENV, **world,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT)}
    for example in runnable(page):
        if deadline is not None and time.time() > deadline:
            pytest.skip(f"time budget spent: {example.page}:{example.line} and the examples after it not run")
        done = run_example(example, workdir, env)
        assert done.returncode == example.exit_code, (
            f"{example.page}:{example.line} exited {done.returncode}, expected {example.exit_code}\n"
            f"--- code\n{example.code}--- stdout (end)\n{done.stdout[-3000:]}--- stderr (end)\n{done.stderr[-3000:]}")


@pytest.mark.parametrize("page", page_params(runnable_pages()))
def test_the_examples_of_a_page_run(page, tiny_world, tmp_path):
    run_page(page, tiny_world, tmp_path)


def test_past_the_deadline_a_page_starts_no_further_example(tmp_path, monkeypatch):
    """CI's time budget for the heavy pages: an example that starts before the deadline runs whole; after it, the page
    is skipped with the first example left out named, and that example never runs."""
    examples = [Example("docs/budget.md", 3, "bash", "touch first\n"),
                Example("docs/budget.md", 7, "bash", "sleep 1.2; touch second\n"),
                Example("docs/budget.md", 11, "bash", "touch third\n")]
    monkeypatch.setattr(sys.modules[__name__], "runnable", lambda page: examples)
    with pytest.raises(pytest.skip.Exception, match=r"docs/budget.md:11 and the examples after it not run"):
        run_page(ROOT / "docs" / "budget.md", {}, tmp_path, deadline=time.time() + 1)
    work = tmp_path / "work"
    assert (work / "first").exists() and (work / "second").exists() and not (work / "third").exists()
    (tmp_path / "again").mkdir()
    run_page(ROOT / "docs" / "budget.md", {}, tmp_path / "again", deadline=time.time() + 600)
    assert (tmp_path / "again" / "work" / "third").exists()


def test_an_example_past_its_timeout_fails_and_leaves_nothing_running(tmp_path, monkeypatch):
    """A timed-out example's whole process group is killed: what it started in the background too."""
    monkeypatch.setitem(run_example.__globals__, "TIMEOUT", 2)
    example = Example("page.md", 1, "bash", "sleep 60 &\necho $! > child.pid\nwait\n")
    with pytest.raises(pytest.fail.Exception, match="page.md:1 ran past 2 s"):
        run_example(example, tmp_path, dict(os.environ))
    child = int((tmp_path / "child.pid").read_text())
    for _ in range(50):  # the kill is sent; the child is gone once the kernel has reaped it
        if not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the example's background child {child} still runs")
