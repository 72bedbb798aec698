"""scripts/bench_real_target.py: its tables come from the eval reports of each section (every row the report's
numbers, vLLM's tau beside ours with --vllm), and --doc writes them between the page's markers, keeping the
hand-written text around them, or refuses a page without markers before it measures anything."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts import bench_real_target, benchmark

ROOT = Path(__file__).resolve().parents[1]


def report(gammas: list[int], temperature: float = 0.0, tau: float = 1.5) -> dict:
    """An eval report as specdistill-eval writes it: the overall row per gamma, then a per-category row."""
    rows = [{"category": None, "num_prompts": 16, "gamma": g, "temperature": temperature, "acceptance_rate": 0.25,
             "mean_accepted_tokens": tau + g / 100, "draft_cost_ratio": 0.06, "verify_cost_ratio": 1.02,
             "target_tokens_per_s": 20.0, "speculative_tokens_per_s": 25.0, "speedup": 1.25,
             "predicted_speedup": 1.3, "per_position_acceptance": [0.3] * g} for g in gammas]
    return {"results": rows + [{**rows[0], "category": "math", "mean_accepted_tokens": 9.0}],
            "vllm_results": [{"category": None, "gamma": g, "mean_accepted_tokens": tau + g / 100 + 0.001}
                             for g in gammas]}


def fake_evaluate(calls: list):
    """specdistill-eval's stand-in: the report written into --out as NAME.json, its name returned."""
    def evaluate(args, name, draft, *extra, prompts):
        calls.append((name, draft, extra, prompts))
        gammas = [int(x) for x in extra[extra.index("--gamma") + 1:] if x.isdigit()]
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{name}.json").write_text(json.dumps(report(gammas, 1.0 if "--temperature" in extra else 0.0)))
        return f"{name}.json"
    return evaluate


def test_tables_from_reports_written_between_markers(tmp_path, monkeypatch, capsys):
    begin, end = benchmark.doc_markers("bench_real_target")
    assert begin in (ROOT / "docs/benchmarks/real_target.md").read_text()  # the page the script writes into
    doc = tmp_path / "real_target.md"
    doc.write_text(f"# Real\n\nsetup\n\n{begin}\nold tables\n{end}\n\nnotes\n")
    calls = []
    monkeypatch.setattr(bench_real_target, "evaluate", fake_evaluate(calls))
    bench_real_target.main(["--target", "t.gguf", "--drafter", "head=h", "prompt_lookup", "--gammas", "2", "4",
                            "--prompts", "16", "--vllm", "--sections", "gammas", "sampled", "--out",
                            str(tmp_path / "out"), "--doc", str(doc)])
    assert [c[0] for c in calls] == ["head_gammas", "head_vllm", "prompt_lookup_gammas", "prompt_lookup_vllm",
                                     "head_sampled", "prompt_lookup_sampled"]
    text = doc.read_text()
    assert text.startswith("# Real\n\nsetup\n\n" + begin + "\n") and text.endswith(end + "\n\nnotes\n")
    assert "old tables" not in text
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]
    assert ["head", "16", "4", "0", "0.250", "1.54", "0.060", "1.02", "20.0", "25.0", "1.25x", "1.30x",
            "1.54"] in cells
    assert ["prompt_lookup", "16", "4", "1", "0.250", "1.54", "0.060", "1.02", "20.0", "25.0", "1.25x",
            "1.30x"] in cells  # the sampled table, no vLLM column
    assert not any(row[5] == "9.00" for row in cells)  # per-category rows stay out of the tables
    assert text.split(begin, 1)[1].split(end, 1)[0].strip() in capsys.readouterr().out


def test_doc_without_markers_refused_before_measuring(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("hand-written\n")
    calls = []
    monkeypatch.setattr(bench_real_target, "evaluate", fake_evaluate(calls))
    with pytest.raises(SystemExit) as stopped:
        bench_real_target.main(["--target", "t.gguf", "--sections", "gammas", "--out", str(tmp_path / "out"),
                                "--doc", str(page)])
    message = str(stopped.value.code)
    assert message.startswith(f"bench_real_target: --doc {page} exists without") and "\n" not in message
    assert calls == [] and page.read_text() == "hand-written\n"
    new = tmp_path / "new.md"  # a new file gets the tables alone
    bench_real_target.main(["--target", "t.gguf", "--drafter", "prompt_lookup", "--gammas", "4", "--sections",
                            "gammas", "--out", str(tmp_path / "out"), "--doc", str(new)])
    assert new.read_text().startswith("### Gamma 4, greedy, eager (16 prompts)")  # the count the eval JSON holds


def test_the_record_writes_the_same_tables_again_without_measuring(tmp_path, monkeypatch):
    """--out gets the record (the machine, the load average, each table's eval JSONs by name); --from-json writes the
    same tables from it and the eval JSONs beside it, measuring nothing."""
    out = tmp_path / "out"
    monkeypatch.setattr(bench_real_target, "evaluate", fake_evaluate([]))
    doc = tmp_path / "first.md"
    bench_real_target.main(["--target", "t.gguf", "--drafter", "head=h", "--gammas", "2", "4", "--prompts", "16",
                            "--vllm", "--sections", "gammas", "compiled", "--out", str(out), "--doc", str(doc)])
    record = json.loads((out / bench_real_target.RECORD).read_text())
    assert record["sections"] == [
        {"section": "gammas", "drafters": {"head": {"eval": "head_gammas.json", "vllm": "head_vllm.json"}}},
        {"section": "compiled", "drafters": {"head": {"eval": "head_compiled.json"}}}]
    assert f"load average at the end {record['load_average']}." in doc.read_text()
    monkeypatch.setattr(bench_real_target, "evaluate", lambda *a, **k: pytest.fail("measured"))
    again = tmp_path / "again.md"
    bench_real_target.main(["--from-json", str(out / bench_real_target.RECORD), "--doc", str(again)])
    assert again.read_text() == doc.read_text()
