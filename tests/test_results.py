"""decode.measure.results (the typed result record, the eval JSON's writer and reader) and decode.measure.table (the one
table formatter): fast, no model."""
from __future__ import annotations

import json

import pytest

from decode.loop.speedup import CostRatios
from decode.loop.stats import SpecStats
from decode.measure.evaluate import summarize
from decode.measure.results import OPTIONAL_KEYS, REQUIRED_KEYS, Result, read_eval_json, write_eval_json
from decode.measure.settings import EvalSettings
from decode.measure.table import CARD_COLUMNS, DECODE_COLUMNS, format_table, markdown_table, render
from decode.measure.tally import Tally

DOCUMENTED = {"gamma", "temperature", "num_prompts", "new_tokens", "acceptance_rate", "draft_acceptance_rate",
              "mean_accepted_tokens", "per_position_acceptance", "target_tokens_per_s", "speculative_tokens_per_s",
              "speedup", "predicted_speedup", "draft_cost_ratio", "verify_cost_ratio", "greedy_match", "compiled",
              "compile_seconds", "stats", "mean_gamma", "hf_assisted_tokens_per_s", "by_category", "concurrency",
              "host_reads_per_step"}


def tally(gamma: int = 2) -> Tally:
    stats = SpecStats(gamma)
    stats.record_step(drafted=2, accepted=2, min_pq=[0.9, 0.8], produced=3)
    stats.record_step(drafted=2, accepted=0, min_pq=[0.5], produced=1)
    stats.host_reads = 2  # one read per verify pass (decode.loop.speculative.read_step)
    t = Tally(gamma)
    t.add(stats, spec_s=1.0, plain_s=2.0, hf_s=0.5, new_tokens=4, match=True)
    return t


def test_record_fields_are_the_documented_result_keys():
    assert set(REQUIRED_KEYS) | set(OPTIONAL_KEYS) == DOCUMENTED
    assert set(OPTIONAL_KEYS) == {"compile_seconds", "mean_gamma", "hf_assisted_tokens_per_s", "by_category",
                                  "concurrency", "host_reads_per_step"}


def test_summarize_builds_the_record_and_its_dict_round_trips():
    result = summarize(tally(), EvalSettings(gammas=[2], compare_hf=True), CostRatios(0.1, 1.2))
    assert isinstance(result, Result)
    # tau = 4 new tokens / 2 verify passes; predicted = tau / (gamma * c + v) = 2 / (0.2 + 1.2)
    assert result.mean_accepted_tokens == 2.0 and result.predicted_speedup == pytest.approx(2 / 1.4)
    assert result.speedup == 2.0 and result.hf_assisted_tokens_per_s == 8.0 and result.greedy_match == 1.0
    data = result.to_dict()
    assert result.host_reads_per_step == 1.0
    # unset optional keys are not written; our decoder's results always carry host_reads_per_step
    assert set(data) == set(REQUIRED_KEYS) | {"hf_assisted_tokens_per_s", "host_reads_per_step"}
    assert Result.from_dict(json.loads(json.dumps(data))) == result
    result.by_category = {"code": summarize(tally(), EvalSettings(gammas=[2]), CostRatios(0.1, 1.2))}
    nested = Result.from_dict(result.to_dict())
    assert isinstance(nested.by_category["code"], Result) and nested == result


def test_sampling_result_keeps_greedy_match_as_none():
    data = summarize(tally(), EvalSettings(gammas=[2], temperature=0.7), CostRatios(0.1, 1.2)).to_dict()
    assert data["greedy_match"] is None and "hf_assisted_tokens_per_s" not in data


def test_from_dict_names_missing_and_unknown_keys():
    data = summarize(tally(), EvalSettings(gammas=[2]), CostRatios(0.1, 1.2)).to_dict()
    del data["speedup"], data["stats"]
    with pytest.raises(ValueError, match=r"result \(gamma=2\).*missing speedup, stats"):
        Result.from_dict(data)
    with pytest.raises(ValueError, match="unknown acceptance"):
        Result.from_dict({**summarize(tally(), EvalSettings(gammas=[2]), CostRatios(0.1, 1.2)).to_dict(),
                          "acceptance": 0.5})
    with pytest.raises(ValueError, match="must be a JSON object"):
        Result.from_dict([1, 2])


def test_eval_json_is_written_with_the_environment_and_read_back(tmp_path):
    path = tmp_path / "sub" / "eval"  # no suffix: still a file (evaluate.save alone would make it a folder)
    write_eval_json(path, {"device": "cpu", "results": [{"gamma": 2}]})
    payload = read_eval_json(path)
    assert payload["results"] == [{"gamma": 2}] and path.is_file()
    assert {"_timestamp", "_git_commit_hash", "_python_version"} <= set(payload["environment"])
    assert [p.name for p in path.parent.iterdir()] == ["eval"]
    (tmp_path / "bad.json").write_text('{"device": "cpu"}')
    with pytest.raises(ValueError, match="no 'results' list"):
        read_eval_json(tmp_path / "bad.json")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_eval_json(tmp_path / "missing.json")


def test_decode_table_leaves_out_absent_columns_and_aligns_numbers():
    rows = [{"drafter": "kl", "gamma": 4, "temperature": 0.0, "acceptance_rate": 0.81234, "speedup": 2.0789},
            {"drafter": "prompt-lookup", "gamma": "auto", "temperature": 0.7, "acceptance_rate": 0.5}]
    lines = format_table(rows, DECODE_COLUMNS).splitlines()
    assert lines[0].split() == ["drafter", "gamma", "temp", "accept", "speedup"]
    assert lines[2].split() == ["kl", "4", "0.00", "0.812", "2.08x"]
    assert lines[3].split() == ["prompt-lookup", "auto", "0.70", "0.500", "-"]
    assert lines[2].index("2.08x") + 5 == lines[0].index("speedup") + len("speedup")


def test_markdown_styles():
    card = format_table([{"gamma": 1, "temperature": 0.0, "acceptance_rate": 0.8123}], CARD_COLUMNS,
                        style="markdown", missing="n/a").splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in card]
    assert cells[0] == ["gamma", "temperature", "acceptance_rate", "mean_accepted_tokens", "speedup",
                        "predicted_speedup"]
    assert cells[1][0].endswith(":") and cells[2] == ["1", "0", "0.812", "n/a", "n/a", "n/a"]
    bench = markdown_table(["mode", "tokens/s"], [["online", 812], ["cached", "1,024"]])
    assert [[c.strip() for c in line.strip("|").split("|")] for line in bench][2:] == [["online", "812"],
                                                                                          ["cached", "1,024"]]
    with pytest.raises(ValueError, match="table style must be one of terminal, markdown"):
        render(["a"], [["1"]], style="html")
