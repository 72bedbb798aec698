"""scripts/bench_revisions.py: a revision's files and its own eval entry point, the drafters named on the command
line, the block written from a record (medians, the after / before ratio, a greedy mismatch shown), and one clear line
for a revision git does not know. The measurement itself runs in the docs test (docs/benchmarks/decode.md)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from scripts import bench_revisions as bench


def results(tau: float, spec: float, speedup: float, greedy: float = 1.0) -> list[dict]:
    return [{"gamma": 2, "mean_accepted_tokens": tau, "acceptance_rate": (tau - 1) / 2, "target_tokens_per_s": 40.0,
             "speculative_tokens_per_s": spec, "speedup": speedup, "greedy_match": greedy}]


def record(greedy_after: float = 1.0) -> dict:
    return {"before": {"revision": "v1", "sha": "a" * 40}, "after": {"revision": "HEAD", "sha": "b" * 40},
            "target": "t.gguf", "prompts": "p.jsonl", "num_prompts": 4, "max_new_tokens": 8, "rounds": 3,
            "drafters": ["head"], "machine": "a CPU", "load_average": "0.1 0.1 0.1",
            "runs": {"head": {"before": [results(1.5, 40.0, 1.0), results(1.5, 44.0, 1.1), results(1.5, 10.0, 0.3)],
                              "after": [results(1.5, 48.0, 1.2), results(1.5, 50.0, 1.25),
                                        results(1.5, 60.0, 1.5, greedy_after)]}}}


def test_block_holds_medians_and_their_ratio():
    text = bench.render(record())
    row = next(line for line in text.splitlines() if line.startswith("| head"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    # medians: before 40.0 (of 40, 44, 10), after 50.0 (of 48, 50, 60): 1.25x
    assert cells == ["head", "2", "1.500", "1.500", "40.0 / 50.0", "1.25x", "1.00x / 1.25x", "yes"]
    assert "`v1` (aaaaaaaaaa)" in text and "medians of 3 rounds" in text


def test_a_greedy_mismatch_shows():
    row = next(line for line in bench.render(record(0.9)).splitlines() if line.startswith("| head"))
    assert row.rstrip("| ").endswith("NO")


def test_drafters_by_name_or_path(tmp_path):
    head = tmp_path / "my_head"
    head.mkdir()
    assert bench.drafters([f"h={head}", "prompt-lookup", str(head), "hub=org/draft"]) == {
        "h": str(head), "prompt-lookup": "prompt-lookup", "my_head": str(head), "hub": "org/draft"}


def test_a_revision_runs_its_own_eval_entry_point(tmp_path):
    sha, tree = bench.revision_tree("HEAD", tmp_path)
    assert len(sha) == 40 and (tree / "scripts" / "train.py").is_file()
    command = bench.eval_command(tree)
    assert command[0] == sys.executable and "import cli" in command[-1]
    help_text = subprocess.run([*command, "--help"], cwd=tree, capture_output=True, text=True,
                               env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})
    assert help_text.returncode == 0 and "--draft" in help_text.stdout
    (tree / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    with pytest.raises(SystemExit, match="names no specdistill-eval entry point"):
        bench.eval_command(tree)


def test_an_unknown_revision_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="git knows no revision 'no-such-rev'"):
        bench.revision_tree("no-such-rev", tmp_path)
