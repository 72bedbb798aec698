"""docs/reference/eval-json.md lists exactly the keys the eval JSON has: the page is the generated tables of
decode/measure/results.py, and those tables hold every key a real tiny `specdistill-eval` run writes, and no other."""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from decode.loop.stats import SpecStats
from decode.measure.results import (
    ALL_KEYS,
    ENVIRONMENT_KEYS,
    EVAL_JSON_KEYS,
    PARITY_KEYS,
    RESULT_KEYS,
    STATS_KEYS,
    VLLM_STATS_KEYS,
    environment,
    reference_markdown,
)
from decode.serving.counters import SpecCounters
from decode.serving.parity import parity_rows
from specdistill.cli import eval as eval_cli

from tiny import perturbed_copy, save_and_load, tiny_model, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "eval-json.md"
BEGIN, END = "<!-- BEGIN EVAL JSON KEYS (python -m decode.measure.results) -->", "<!-- END EVAL JSON KEYS -->"


def test_the_page_holds_the_generated_tables():
    text = PAGE.read_text()
    assert BEGIN in text and END in text, f"{PAGE} lacks the generated key table markers"
    tables = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert tables == reference_markdown().strip(), f"{PAGE} is stale: paste `python -m decode.measure.results`"


def test_the_tables_name_every_field_of_the_records():
    assert list(RESULT_KEYS) == list(ALL_KEYS)  # decode.measure.results.Result, in its field order
    assert list(STATS_KEYS) == [f.name for f in fields(SpecStats)]
    assert list(VLLM_STATS_KEYS) == [f.name for f in fields(SpecCounters)]
    assert set(environment()) == set(ENVIRONMENT_KEYS)


def test_parity_rows_hold_the_documented_keys():
    stats = SpecStats(2)
    stats.record_step(drafted=2, accepted=1, min_pq=[0.9, 0.4], produced=2)
    ours = [{"gamma": 2, "temperature": 0.0, "stats": stats.to_dict()}]
    theirs = [{"gamma": 2, "temperature": 0.0, "mean_accepted_tokens": 2.0, "greedy_match": 1.0},
              {"gamma": 2, "temperature": 0.0, "mean_accepted_tokens": 2.0, "greedy_match": 1.0, "concurrency": 4}]
    plain, loaded = parity_rows(ours, theirs)
    assert set(loaded) == set(PARITY_KEYS) and set(plain) == set(PARITY_KEYS) - {"concurrency"}


def test_a_real_eval_writes_exactly_the_documented_keys(tmp_path):
    """Every optional result key our decoder can write is asked for: gamma "auto" (mean_gamma), --compare-hf
    (hf_assisted_tokens_per_s) and prompt categories (by_category); only `concurrency` is vLLM's alone."""
    tok = tiny_tokenizer()
    target = tiny_model("llama", seed=0, vocab_size=len(tok))
    save_and_load(target, tmp_path / "target", tok)
    save_and_load(perturbed_copy(target, 0.1), tmp_path / "draft", tok)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):", "category": "code"}) + "\n"
                       + json.dumps({"prompt": "for i in range(10):"}) + "\n")
    out = tmp_path / "eval.json"
    eval_cli.main(["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"), "--prompts",
                   str(prompts), "--gamma", "2", "auto", "--max-new-tokens", "6", "--compare-hf", "--quiet",
                   "--output", str(out)])
    report = json.loads(out.read_text())

    assert set(report) == {name for name, key in EVAL_JSON_KEYS.items() if "specdistill" in key.engines}
    results = report["results"]
    entries = [entry for r in results for entry in r["by_category"].values()]
    assert set().union(*map(set, results)) == set(RESULT_KEYS) - {"concurrency"}
    assert all(set(entry) <= set(RESULT_KEYS) for entry in entries)
    assert all(set(r["stats"]) == set(STATS_KEYS) for r in results + entries)
    assert set(report["environment"]) == set(ENVIRONMENT_KEYS)
