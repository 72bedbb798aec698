"""distill.publish.report (with decode.measure.table's report columns): table, plots and report.md from synthetic
acceptance.jsonl / eval JSON files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from decode.measure.table import REPORT_COLUMNS, format_table
from distill.outputs.acceptance_log import read_records
from distill.publish.report import POSITION_PLOT, SPEEDUP_PLOT, STEP_PLOT, choose_setting, write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def result(gamma: int, rate: float, temperature: float = 0.0, per_position: list[float] | None = None) -> dict:
    tau = 1 + gamma * rate
    return {"gamma": gamma, "temperature": temperature, "acceptance_rate": rate, "draft_acceptance_rate": rate - 0.05,
            "mean_accepted_tokens": tau, "per_position_acceptance": per_position if per_position is not None
            else [rate - 0.02 * i for i in range(gamma)], "speedup": tau / 1.3, "predicted_speedup": tau / 1.2}


def write_run(folder: Path, steps: list[int], gammas: list[int]) -> Path:
    folder.mkdir(parents=True)
    rows = [{"step": s, "checkpoint": f"checkpoint-{s}", **result(g, 0.4 + s / 1000)} for s in steps for g in gammas]
    (folder / "acceptance.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    return folder


def write_eval(path: Path, results: list[dict]) -> Path:
    path.write_text(json.dumps({"device": "cpu", "dtype": "float32", "torch_version": "2.13.0",
                                "target": "tiny-target", "draft": path.stem, "results": results}))
    return path


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 1024


def test_format_table_aligns_columns_and_marks_missing_values():
    rows = [{"drafter": "kl", "gamma": 4, "temperature": 0.0, "acceptance_rate": 0.81234,
             "mean_accepted_tokens": 3.2109, "speedup": 2.0789, "predicted_speedup": None},
            {"drafter": "prompt-lookup", "gamma": 2, "temperature": 0.7, "acceptance_rate": 0.5}]
    lines = format_table(rows, REPORT_COLUMNS).splitlines()
    assert lines[0].split() == ["drafter", "gamma", "temperature", "acceptance_rate", "mean_accepted_tokens",
                                "speedup", "predicted_speedup"]
    assert lines[2].split() == ["kl", "4", "0", "0.812", "3.21", "2.08x", "-"]
    assert lines[3].split() == ["prompt-lookup", "2", "0.7", "0.500", "-", "-", "-"]
    assert len({len(line) for line in lines[:2]}) == 1  # header and rule have the same width
    assert lines[2].index("0.812") + len("0.812") == lines[0].index("acceptance_rate") + len("acceptance_rate")


def test_choose_setting_prefers_the_setting_most_runs_share():
    runs = {"a": [{"gamma": 2, "temperature": 0.0}, {"gamma": 4, "temperature": 0.0}],
            "b": [{"gamma": 4, "temperature": 0.0}, {"gamma": 4, "temperature": 1.0}]}
    assert choose_setting(runs) == (4, 0.0)
    assert choose_setting({"empty": []}) is None


def test_write_report_writes_markdown_and_three_pngs(tmp_path):
    runs = {"forward_kl": write_run(tmp_path / "kl", steps=[100, 200, 300], gammas=[1, 2, 4]),
            "single": write_run(tmp_path / "one", steps=[50], gammas=[4])}
    evals = {"forward_kl": write_eval(tmp_path / "kl.json", [result(g, 0.7) for g in (1, 2, 4)]),
             "prompt_lookup": write_eval(tmp_path / "pl.json", [result(g, 0.3, per_position=[]) for g in (1, 2, 4)])}
    report = write_report(tmp_path / "report", runs=runs, evals=evals, machine="CI runner, 2 CPU cores")
    assert report == tmp_path / "report" / "report.md"
    for name in (STEP_PLOT, POSITION_PLOT, SPEEDUP_PLOT):
        assert_png(report.parent / name)
    text = report.read_text()
    assert "Machine: **CI runner, 2 CPU cores**" in text
    for name in (STEP_PLOT, POSITION_PLOT, SPEEDUP_PLOT):
        assert f"]({name})" in text
    assert "No per-position acceptance data for: prompt_lookup." in text
    assert "gamma=4, temperature=0" in text  # the setting both runs share
    assert "forward_kl @ step 300" in text and "single @ step 50" in text
    # forward_kl at gamma 4: tau = 1 + 4 * 0.7 = 3.8, speedup 3.8 / 1.3, predicted 3.8 / 1.2
    assert any(line.split() == ["forward_kl", "4", "0", "0.700", "3.80", "2.92x", "3.17x"]
               for line in text.splitlines())
    assert "- **single**: 1 checkpoint(s) logged" in text


def test_write_report_without_any_per_position_data_or_runs(tmp_path):
    evals = {"prompt_lookup": write_eval(tmp_path / "pl.json", [result(2, 0.3, per_position=[])])}
    report = write_report(tmp_path / "r", runs={}, evals=evals, machine="laptop")
    assert not (report.parent / POSITION_PLOT).exists() and not (report.parent / STEP_PLOT).exists()
    assert_png(report.parent / SPEEDUP_PLOT)  # one gamma still gives a (single-point) plot
    text = report.read_text()
    assert "No per-position acceptance data for: prompt_lookup." in text and "No training run was given." in text


def test_write_report_explicit_setting_missing_from_a_run(tmp_path):
    runs = {"a": write_run(tmp_path / "a", steps=[1, 2], gammas=[2]), "b": write_run(tmp_path / "b", [1], [4])}
    text = write_report(tmp_path / "r", runs=runs, evals={}, machine="m", gamma=2, temperature=0.0).read_text()
    assert "- **b**: 1 checkpoint(s) logged; none at gamma=2, temperature=0" in text
    assert "No eval_acceptance JSON was given." in text
    assert_png(tmp_path / "r" / STEP_PLOT)


def test_missing_or_malformed_inputs_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="acceptance.jsonl does not exist"):
        write_report(tmp_path / "r", runs={"x": tmp_path}, evals={}, machine="m")
    log = tmp_path / "acceptance.jsonl"
    log.write_text('{"step": 1}\n{"gamma": 2}\n')
    with pytest.raises(ValueError, match=r"acceptance.jsonl:2 has no integer 'step'"):
        read_records(log)
    bad = tmp_path / "bad.json"
    bad.write_text('{"device": "cpu"}')
    with pytest.raises(ValueError, match="no 'results' list"):
        write_report(tmp_path / "r", runs={}, evals={"x": bad}, machine="m")


def test_report_shows_per_category_rows_for_evals_and_runs(tmp_path):
    with_categories = {**result(4, 0.7), "by_category": {"code": {**result(4, 0.9), "num_prompts": 3},
                                                         "prose": {**result(4, 0.5), "num_prompts": 2}}}
    evals = {"kl": write_eval(tmp_path / "kl.json", [with_categories])}
    run = tmp_path / "run"
    run.mkdir()
    (run / "acceptance.jsonl").write_text(json.dumps({"step": 10, "checkpoint": "checkpoint-10", **with_categories}))
    text = write_report(tmp_path / "report", runs={"kl": run}, evals=evals, machine="m").read_text()
    lines = [line.split() for line in text.splitlines()]
    # drafter, category, num_prompts, gamma, temperature, acceptance_rate, tau (1 + 4 * rate), speedup (tau / 1.3)
    assert ["kl", "code", "3", "4", "0", "0.900", "4.60", "3.54x"] in lines
    assert ["kl", "prose", "2", "4", "0", "0.500", "3.00", "2.31x"] in lines
    assert ["kl", "@", "step", "10", "code", "3", "4", "0", "0.900", "4.60", "3.54x"] in lines
    assert text.count("By prompt category") == 2


def test_report_without_categories_has_no_category_table(tmp_path):
    evals = {"kl": write_eval(tmp_path / "kl.json", [result(4, 0.7)])}
    assert "By prompt category" not in write_report(tmp_path / "r", runs={}, evals=evals, machine="m").read_text()


def test_report_names_local_models_relative_to_the_run_folder(tmp_path):
    run = tmp_path / "quickstart_out"
    (run / "draft_kd").mkdir(parents=True)
    (run / "target").mkdir()
    path = run / "kd.json"
    path.write_text(json.dumps({"device": "cpu", "target": str(run / "target"), "draft": str(run / "draft_kd"),
                                "results": [result(2, 0.5)]}))
    prompt_lookup = write_eval(run / "pl.json", [result(2, 0.3)])
    prompt_lookup.write_text(prompt_lookup.read_text().replace('"draft": "pl"', '"draft": "prompt-lookup"'))
    text = write_report(run / "report", runs={}, evals={"kd": path, "pl": prompt_lookup}, machine="m").read_text()
    assert "- **kd**: draft `draft_kd`, target `target`," in text
    assert "- **pl**: draft `prompt-lookup`, target `tiny-target`," in text  # not local paths: as given
    assert str(tmp_path) not in text
    elsewhere = write_report(tmp_path / "r", runs={}, evals={"kd": path}, machine="m", root=run / "report")
    assert "draft `../draft_kd`, target `../target`" in elsewhere.read_text()


def test_report_of_two_seeds_shows_mean_spread_and_each_seed(tmp_path):
    runs = {"kl": {1: write_run(tmp_path / "kl1", steps=[10, 20], gammas=[4]),
                   2: write_run(tmp_path / "kl2", steps=[10, 20], gammas=[4])}}
    evals = {"kl": {1: write_eval(tmp_path / "kl1.json", [result(4, 0.5)]),
                    2: write_eval(tmp_path / "kl2.json", [result(4, 0.6)])},
             "ce": {1: write_eval(tmp_path / "ce1.json", [result(4, 0.4)]),
                    2: write_eval(tmp_path / "ce2.json", [result(4, 0.45)])},
             "prompt_lookup": write_eval(tmp_path / "pl.json", [result(4, 0.3, per_position=[])])}
    report = write_report(tmp_path / "r", runs=runs, evals=evals, machine="m", margin=("kl", "ce", 4))
    for name in (STEP_PLOT, POSITION_PLOT, SPEEDUP_PLOT):
        assert_png(report.parent / name)
    text = report.read_text()
    lines = [line.split() for line in text.splitlines()]
    # kl: tau 1 + 4 * 0.5 = 3.0 and 3.4 -> mean 3.2, spread 0.4; speedup tau / 1.3 -> 2.46, spread 0.31
    assert ["kl", "2", "4", "0", "0.550", "0.100", "3.20", "0.40", "2.46x", "0.31", "2.67x"] in lines
    assert ["prompt_lookup", "1", "4", "0", "0.300", "0.000", "2.20", "0.00", "1.69x", "0.00", "1.83x"] in lines
    assert ["kl", "seed", "2", "4", "0", "0.600", "3.40", "2.62x", "2.83x"] in lines
    # ce: 2.6 and 2.8 -> 2.7, spread 0.2; margin 3.2 - 2.7 = 0.5 > max(0.4, 0.2)
    assert ("kl vs ce, mean_accepted_tokens at gamma 4, temperature 0, mean of 2 seed(s): 3.20 vs 2.70, margin "
            "+0.50 (1.19x); seed spread (max - min, the larger of the two) 0.40: the margin is larger than the "
            "spread, so it holds.") in text
    assert "- **kl seed 1**: 2 checkpoint(s) logged" in text and "kl seed 2 @ step 20" in text
    with pytest.raises(ValueError, match="no mean_accepted_tokens for kl at gamma 2"):
        write_report(tmp_path / "r2", runs={}, evals=evals, machine="m", margin=("kl", "ce", 2))
