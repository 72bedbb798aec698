"""The vLLM engine without vLLM: counters, counting on one basis, parity, the request, the missing interpreter.

(tests/test_serving_vllm.py runs vLLM itself, as an integration test.)"""
import functools
import importlib.util
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from decode.loop.stats import SpecStats
from decode.measure.results import EVAL_JSON_KEYS, Result
from decode.measure.settings import EvalSettings
from decode.measure.table import format_table
from decode.serving import vllm_engine
from decode.serving.counters import SpecCounters
from decode.serving.parity import PARITY_COLUMNS, aligned_inputs, out_of_tolerance, parity_columns, parity_rows
from decode.serving.vllm_engine import (
    ServingError,
    build_request,
    find_vllm_python,
    plain_outputs,
    vllm_outputs,
    vllm_results,
)
from kinds import STANDALONE
from kinds.prompt_lookup.drafter import PromptLookupDrafter
from specdistill.cli import eval as eval_acceptance
from specdistill.drafts import speculative_generate, vllm_method

from tiny import TINY_TEXT, perturbed_copy, save_and_load, tiny_model, tiny_tokenizer

request_of = functools.partial(build_request, kind=STANDALONE)  # the worker's request for a standalone draft


def load_worker():
    """decode/serving/vllm_worker.py imported by path, as vLLM's interpreter runs it (stdlib only at import)."""
    spec = importlib.util.spec_from_file_location("vllm_worker", vllm_engine.WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- counters ---------------------------------------------------------------------------------------------------
def test_worker_reads_vllm_metrics_counters_and_vector():
    metrics = [SimpleNamespace(name="vllm:spec_decode_num_drafts", value=374),
               SimpleNamespace(name="vllm:spec_decode_num_draft_tokens", value=1496),
               SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens", value=397),
               SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=[176, 117, 69, 35]),
               SimpleNamespace(name="vllm:num_requests_running", value=3)]
    counters = load_worker().read_counters(metrics)
    assert counters == {"num_drafts": 374, "num_draft_tokens": 1496, "num_accepted_tokens": 397,
                        "num_accepted_tokens_per_pos": [176, 117, 69, 35]}
    parsed = SpecCounters.from_dict(counters)
    assert parsed.mean_accepted_tokens == pytest.approx(1 + 397 / 374)  # the 2.06
    assert parsed.draft_acceptance_rate == pytest.approx(397 / 1496)
    assert parsed.per_position_acceptance == pytest.approx([176 / 374, 117 / 176, 69 / 117, 35 / 69])


def test_bad_counters_are_a_clear_error():
    with pytest.raises(ValueError, match="incomplete"):
        SpecCounters.from_dict({"num_drafts": 3})
    with pytest.raises(ValueError, match="disagree"):
        SpecCounters.from_dict({"num_drafts": 3, "num_draft_tokens": 12, "num_accepted_tokens": 9,
                                "num_accepted_tokens_per_pos": [3, 3, 2, 0]})


def test_per_request_histogram_gives_the_same_counters():
    # steps keeping 0, 2, 4, 1, 2 drafts of 4
    hist = [1, 1, 2, 0, 1]
    counters = SpecCounters.from_histogram(hist, num_draft_tokens=20)
    assert counters == SpecCounters(5, 20, 9, [4, 3, 1, 1])
    assert (counters + counters).num_accepted_tokens_per_pos == [8, 6, 2, 2]


def test_our_counts_on_vllms_basis_skip_steps_without_drafts():
    """Difference 2: a step that drafted nothing is a target pass for us, no draft for vLLM."""
    ours = SpecStats(3)
    for drafted, accepted in ((3, 3), (0, 0), (3, 1), (0, 0), (2, 2)):
        ours.record_step(drafted, accepted, [1.0] * min(accepted + 1, drafted), accepted + 1)
    assert ours.mean_accepted_tokens == pytest.approx(11 / 5)         # ours: new tokens / target passes
    counters = SpecCounters.from_spec_stats(ours)
    assert counters == SpecCounters(3, 8, 6, [3, 2, 1])
    assert counters.mean_accepted_tokens == pytest.approx(1 + 6 / 3)  # vLLM: 1 + accepted / drafts
    vllm_histogram = [0, 1, 1, 1]  # the same three drafting steps, as vLLM's per-request histogram
    assert SpecCounters.from_histogram(vllm_histogram, 8) == counters


# ---- the systematic differences ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def models():
    target = tiny_model("llama", seed=0)
    return target, perturbed_copy(target, 0.05)


def test_draft_past_end_drafts_gamma_always_and_keeps_the_output(models):
    """Difference 1: vLLM drafts gamma tokens at the end too; draft_past_end does so with the same output."""
    target, draft = models
    prompt = torch.tensor([[1, 5, 9, 13]])
    capped = speculative_generate(target, draft, prompt, max_new_tokens=13, gamma=4)
    full = speculative_generate(target, draft, prompt, max_new_tokens=13, gamma=4, draft_past_end=True)
    assert full.new_tokens == capped.new_tokens and len(full.new_tokens) == 13
    assert full.stats.per_position_drafted == [full.stats.target_calls] * 4  # every step drafted 4
    assert capped.stats.per_position_drafted[3] < capped.stats.target_calls  # capped near the end
    assert full.stats.new_tokens == 13 and full.stats.accepted_tokens >= capped.stats.accepted_tokens


def test_aligned_inputs_start_from_vllms_prefill_token():
    """Difference 3: vLLM's prefill emits token 1; our side starts after it, one token fewer, drafting to the end."""
    prompts = [torch.tensor([1, 7, 8]), torch.tensor([1, 9])]
    settings = EvalSettings(gammas=[2, 4], max_new_tokens=16)
    aligned, ours = aligned_inputs(prompts, [42, 43], settings)
    assert [p.tolist() for p in aligned] == [[1, 7, 8, 42], [1, 9, 43]]
    assert ours.max_new_tokens == 15 and ours.draft_past_end and settings.max_new_tokens == 16
    with pytest.raises(ValueError, match=">= 2"):
        aligned_inputs(prompts, [42, 43], EvalSettings(gammas=[2], max_new_tokens=1))


def test_request_carries_our_token_ids_so_no_bos_is_added_or_lost(tmp_path):
    """Difference 4: vLLM gets our ids (BOS once, template applied by us), never text it would tokenise again."""
    prompts = [torch.tensor([1, 40, 41]), torch.tensor([1, 50])]  # 1 = BOS
    request = request_of(str(tmp_path), str(tmp_path), prompts, EvalSettings(gammas=[2, 4], max_new_tokens=8))
    assert request["prompts"] == [[1, 40, 41], [1, 50]]
    assert [(r["method"], r["gamma"]) for r in request["runs"]] == [("draft_model", 2), ("draft_model", 4)]
    assert request["stop_token_ids"] is None and request["max_model_len"] >= 3 + 8 + 4
    assert request["runs"][0]["draft_sample_method"] is None  # vLLM's default unless asked


def test_draft_sampling_as_ours_is_asked_for_by_name(tmp_path):
    """Difference 6: at T > 0 vLLM drafts argmax tokens by default; --engine both asks for probabilistic drafts."""
    prompts, settings = [torch.tensor([1, 40])], EvalSettings(gammas=[2], temperature=1.0)
    request = request_of(str(tmp_path), str(tmp_path), prompts, settings, draft_sample_method="probabilistic")
    worker = load_worker()
    assert worker.speculative_config(request["runs"][0]) == {
        "method": "draft_model", "num_speculative_tokens": 2, "model": str(tmp_path.resolve()),
        "draft_sample_method": "probabilistic"}
    assert "draft_sample_method" not in worker.speculative_config({**request["runs"][0], "draft_sample_method": None})
    with pytest.raises(ServingError, match="draft sample method"):
        request_of(str(tmp_path), str(tmp_path), prompts, settings, draft_sample_method="top1")
    with pytest.raises(ServingError, match="integer gammas"):
        request_of(str(tmp_path), str(tmp_path), prompts, EvalSettings(gammas=["auto"]))


def test_request_carries_the_dtype_asked_for(tmp_path):
    """vLLM runs in float32 unless asked (our CPU runs are float32); any of vLLM's dtypes is sent as named."""
    prompts, settings = [torch.tensor([1, 40])], EvalSettings(gammas=[2], max_new_tokens=4)
    assert request_of(str(tmp_path), str(tmp_path), prompts, settings)["dtype"] == "float32"
    for dtype in vllm_engine.VLLM_DTYPES:
        assert request_of(str(tmp_path), str(tmp_path), prompts, settings, dtype=dtype)["dtype"] == dtype
    for bad in ("auto", "int8", "torch.bfloat16"):  # "auto" is resolved by the command before the request
        with pytest.raises(ServingError, match="vLLM dtype must be one of float32, bfloat16, float16"):
            request_of(str(tmp_path), str(tmp_path), prompts, settings, dtype=bad)


@pytest.mark.parametrize(("flags", "sent"), [([], "float32"), (["--vllm-dtype", "bfloat16"], "bfloat16"),
                                             (["--vllm-dtype", "float16"], "float16"),
                                             (["--vllm-dtype", "auto", "--device", "cpu"], "float32")])
def test_vllm_dtype_flag_reaches_the_request_and_the_json(tmp_path, monkeypatch, flags, sent):
    """--engine vllm --vllm-dtype: the request the worker would get carries it (auto resolved by the device, as
    --dtype auto), and the JSON's dtype and vllm_dtype report it; nothing of vLLM runs."""
    tok = tiny_tokenizer()
    save_and_load(tiny_model("llama", seed=0, vocab_size=len(tok)), tmp_path / "target", tok)
    (tmp_path / "prompts.txt").write_text(TINY_TEXT.splitlines()[0] + "\n")
    requests = []
    monkeypatch.setattr(vllm_engine, "run_worker", plain_worker(requests))
    report = eval_acceptance.main(["--target", str(tmp_path / "target"), "--draft", "prompt-lookup", "--prompts",
                                   str(tmp_path / "prompts.txt"), "--gamma", "2", "--max-new-tokens", "4",
                                   "--engine", "vllm", "--vllm-python", sys.executable, "--quiet", *flags])
    assert [r["dtype"] for r in requests] == [sent]
    assert report["dtype"] == report["vllm_dtype"] == sent
    documented = {name for name, key in EVAL_JSON_KEYS.items() if "vllm" in key.engines}
    assert set(report) == documented - {"environment"}  # evaluate.save adds environment when it writes the file


def test_a_run_past_the_targets_context_is_one_line_before_vllm_starts(tmp_path, monkeypatch, capsys):
    """A prompt and --max-new-tokens past the target's max_position_embeddings: vLLM would refuse the max_model_len
    after its engine starts; --engine vllm stops before it with the most new tokens that fit, which then run with
    max_model_len = the context; VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (vLLM's switch) lets it through. Our decoder runs
    it after a note."""
    tok = tiny_tokenizer()
    target = tiny_model("llama", seed=0, vocab_size=len(tok))
    target.config.max_position_embeddings = 48
    save_and_load(target, tmp_path / "target", tok)
    (tmp_path / "prompts.txt").write_text(TINY_TEXT.splitlines()[0] + "\n")
    requests = []
    monkeypatch.setattr(vllm_engine, "run_worker", plain_worker(requests))
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)

    def run(max_new_tokens, *flags):
        return eval_acceptance.main(["--target", str(tmp_path / "target"), "--draft", "prompt-lookup", "--prompts",
                                     str(tmp_path / "prompts.txt"), "--gamma", "2", "--max-new-tokens",
                                     str(max_new_tokens), "--quiet", "--vllm-python", sys.executable, *flags])

    with pytest.raises(ServingError, match=r"past the target's context of 48 positions: vLLM refuses it; "
                                           r"--max-new-tokens (\d+) at most") as refused:
        run(60, "--engine", "vllm")
    assert requests == []
    most = int(re.search(r"--max-new-tokens (\d+) at most", str(refused.value)).group(1))
    run(most, "--engine", "vllm")
    assert requests[-1]["max_model_len"] == 48
    with pytest.raises(ServingError, match="past the target's context"):
        run(most + 1, "--engine", "both")
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    run(60, "--engine", "vllm")
    assert requests[-1]["max_model_len"] > 48
    capsys.readouterr()
    report = run(60, "--acceptance-only")
    assert report["results"][0]["mean_accepted_tokens"] >= 1
    assert "past the target's context of 48: it generates where it was not trained" in capsys.readouterr().err


def test_context_length_is_vllms_least_key_unless_rope_is_scaled():
    from transformers import LlamaConfig

    from decode.inputs.checks import context_length

    assert context_length(LlamaConfig(max_position_embeddings=64)) == 64
    assert context_length(LlamaConfig(max_position_embeddings=64), SimpleNamespace(model_max_length=32)) == 32
    assert context_length(LlamaConfig(max_position_embeddings=64), SimpleNamespace(model_max_length=10**30)) == 64
    scaled = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}  # vLLM multiplies: left to it
    assert context_length(LlamaConfig(max_position_embeddings=64, rope_parameters=scaled)) is None
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 32, "rope_theta": 10000.0}
    assert context_length(LlamaConfig(max_position_embeddings=64, rope_parameters=llama3)) == 64
    assert context_length(SimpleNamespace(n_positions=128, seq_length=96)) == 96
    assert context_length(SimpleNamespace(hidden_size=8)) is None


def test_a_failed_worker_is_told_by_its_last_error_line_with_pydantics_reason():
    log = ("INFO starting\nTraceback (most recent call last):\n  File x\n"
           "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
           "  Value error, User-specified max_model_len (2117) is greater than the derived max_model_len\n"
           "    For further information visit https://errors.pydantic.dev/2.14/v/value_error\n")
    assert vllm_engine.last_error(log) == ("pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                                           "ModelConfig: Value error, User-specified max_model_len (2117) is "
                                           "greater than the derived max_model_len")
    assert vllm_engine.last_error("RuntimeError: out of memory\nshutting down\n") == "RuntimeError: out of memory"
    assert vllm_engine.last_error("just a line\n") == "just a line"
    assert vllm_engine.last_error("") == "no output"


def test_bad_vllm_dtype_is_argparses_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        eval_acceptance.main(["--target", "t", "--draft", "d", "--prompts", "p.txt", "--engine", "vllm",
                              "--vllm-dtype", "int8"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and len(err.strip().splitlines()) == 1
    assert "--vllm-dtype" in err and "invalid choice: 'int8'" in err


def test_prompt_lookup_earliest_occurrence_as_vllm_ngram():
    """Difference 5: vLLM's ngram proposes after the earliest occurrence of the longest suffix n-gram."""
    history = [5, 6, 1, 5, 6, 2, 9, 5, 6]
    assert PromptLookupDrafter().lookup(history, 2) == [2, 9]
    assert PromptLookupDrafter(earliest=True).lookup(history, 2) == [1, 5]


def test_vllm_method_is_chosen_from_the_draft(tmp_path):
    eagle = tmp_path / "eagle"
    eagle.mkdir()
    (eagle / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert vllm_method(str(eagle)) == "eagle3"
    assert vllm_method(str(plain)) == "draft_model"
    assert vllm_method("prompt-lookup") == "ngram"
    assert vllm_method("Qwen/Qwen2.5-0.5B-Instruct") == "draft_model"


# ---- results and parity -----------------------------------------------------------------------------------------
RESPONSE = {"vllm_version": "0.32.0",
            "plain": {"outputs": [[4, 5, 6, 7], [8, 9, 10, 11]], "seconds": 2.0},
            "speculative": [{"method": "draft_model", "gamma": 2, "outputs": [[4, 5, 6, 7], [8, 9, 10, 12]],
                             "seconds": 1.0,
                             "counters": {"num_drafts": 4, "num_draft_tokens": 8, "num_accepted_tokens": 4,
                                          "num_accepted_tokens_per_pos": [3, 1]},
                             "per_prompt": [{"histogram": [0, 1, 1], "num_draft_tokens": 4},
                                            {"histogram": [1, 1, 0], "num_draft_tokens": 4}]}]}


def test_vllm_results_have_our_keys_and_vllms_numbers():
    settings = EvalSettings(gammas=[2], max_new_tokens=4)
    [result] = vllm_results(RESPONSE, settings, categories=["code", "chat"])
    assert Result.from_dict(result).to_dict() == result
    assert result["mean_accepted_tokens"] == pytest.approx(2.0) and result["draft_acceptance_rate"] == 0.5
    assert result["per_position_acceptance"] == pytest.approx([3 / 4, 1 / 3])
    assert result["greedy_match"] == 0.5 and result["speedup"] == pytest.approx(2.0)
    assert result["predicted_speedup"] is None and result["stats"]["num_drafts"] == 4
    assert result["by_category"]["code"]["mean_accepted_tokens"] == pytest.approx(2.5)
    assert result["by_category"]["chat"]["greedy_match"] == 0.0
    rows = vllm_outputs(RESPONSE, [torch.tensor([1, 2]), torch.tensor([1, 3])], settings)
    assert rows[1]["speculative_ids"] == [8, 9, 10, 12] and rows[1]["plain_ids"] == [8, 9, 10, 11]


def test_parity_rows_and_tolerance():
    stats = SpecStats(2)
    for accepted in (2, 1, 0, 1):
        stats.record_step(2, accepted, [1.0], accepted + 1)
    ours = [{"gamma": 2, "temperature": 0.0, "stats": stats.to_dict()}]
    theirs = [{"gamma": 2, "temperature": 0.0, "mean_accepted_tokens": 2.09, "greedy_match": 1.0}]
    [row] = parity_rows(ours, theirs, tolerance=0.05)
    assert row["tau_specdistill"] == pytest.approx(2.0) and row["ratio"] == pytest.approx(1.045)
    assert row["within_tolerance"] and out_of_tolerance([row]) == []
    [row] = parity_rows(ours, theirs, tolerance=0.04)
    assert not row["within_tolerance"] and "1.045" in out_of_tolerance([row])[0]
    with pytest.raises(ValueError, match="no result for gamma 4"):
        parity_rows([{**ours[0], "gamma": 4}], theirs)


# ---- concurrency (--concurrency): a result per (level, gamma) -----------------------------------------------------
def level(max_num_seqs: int, plain_s: float, spec_s: float, accepted_per_pos: list[int]) -> dict:
    """RESPONSE's runs at one max_num_seqs, with other seconds and accepted counts (4 drafts of 2 tokens)."""
    spec = RESPONSE["speculative"][0]
    counters = {**spec["counters"], "num_accepted_tokens": sum(accepted_per_pos),
                "num_accepted_tokens_per_pos": accepted_per_pos}
    return {"max_num_seqs": max_num_seqs, "plain": {**RESPONSE["plain"], "seconds": plain_s},
            "speculative": [{**spec, "seconds": spec_s, "counters": counters}]}


LEVELS = {"vllm_version": "0.32.0", "levels": [level(1, 2.0, 1.0, [3, 1]), level(4, 0.5, 0.4, [4, 2])]}


def test_concurrency_levels_are_asked_for_and_checked(tmp_path):
    prompts, settings = [torch.tensor([1, 40])], EvalSettings(gammas=[2], max_new_tokens=4)
    assert request_of(str(tmp_path), str(tmp_path), prompts, settings, concurrency=[1, 4])["concurrency"] == [1, 4]
    assert "concurrency" not in request_of(str(tmp_path), str(tmp_path), prompts, settings)  # as before
    for bad in ([0], [4, -1], []):
        with pytest.raises(ServingError, match="concurrency levels must be >= 1"):
            request_of(str(tmp_path), str(tmp_path), prompts, settings, concurrency=bad)


def test_each_level_gives_throughputs_and_their_ratio():
    """8 tokens per run: level 1 plain 8 / 2 s, speculative 8 / 1 s; level 4 plain 8 / 0.5 s, speculative 8 / 0.4 s."""
    settings = EvalSettings(gammas=[2], max_new_tokens=4)
    rows = vllm_results(LEVELS, settings, categories=["code", "chat"])
    assert [(r["concurrency"], r["gamma"]) for r in rows] == [(1, 2), (4, 2)]
    assert [(r["target_tokens_per_s"], r["speculative_tokens_per_s"]) for r in rows] == [(4.0, 8.0), (16.0, 20.0)]
    for r in rows:
        assert r["speedup"] == pytest.approx(r["speculative_tokens_per_s"] / r["target_tokens_per_s"])
        assert r["predicted_speedup"] is None  # no batch form of the cost model
        assert Result.from_dict(r).to_dict() == r
        assert {c["concurrency"] for c in r["by_category"].values()} == {r["concurrency"]}
    assert [r["mean_accepted_tokens"] for r in rows] == [pytest.approx(2.0), pytest.approx(2.5)]  # each level's own
    assert "concurrency" not in vllm_results(RESPONSE, settings)[0]  # without levels: today's keys
    outputs = vllm_outputs(LEVELS, [torch.tensor([1, 2]), torch.tensor([1, 3])], settings)
    assert [(o["concurrency"], o["prompt_index"]) for o in outputs] == [(1, 0), (1, 1), (4, 0), (4, 1)]
    assert "concurrency" not in vllm_outputs(RESPONSE, [torch.tensor([1, 2]), torch.tensor([1, 3])], settings)[0]
    assert plain_outputs(LEVELS) == plain_outputs(RESPONSE) == RESPONSE["plain"]["outputs"]
    table = format_table(rows).splitlines()
    assert "concurrency" in table[0].split() and table[2].split()[1] == "1" and table[3].split()[1] == "4"
    assert "concurrency" not in format_table(vllm_results(RESPONSE, settings))


def test_parity_compares_every_level_with_our_batch_1_result():
    stats = SpecStats(2)
    for accepted in (2, 1, 0, 1):
        stats.record_step(2, accepted, [1.0], accepted + 1)
    ours = [{"gamma": 2, "temperature": 0.0, "stats": stats.to_dict()}]  # tau 2.0 on vLLM's basis
    theirs = [{"gamma": 2, "temperature": 0.0, "mean_accepted_tokens": tau, "greedy_match": 1.0, "concurrency": n}
              for n, tau in ((1, 2.0), (4, 2.5))]
    rows = parity_rows(ours, theirs)
    assert [(r["concurrency"], r["ratio"]) for r in rows] == [(1, 1.0), (4, 1.25)]
    assert out_of_tolerance(rows) == ["concurrency 4 gamma 2 temperature 0.0: tau(vLLM) / tau(ours) = 1.250"]
    assert parity_columns(rows) == PARITY_COLUMNS
    without = parity_rows(ours, [{k: v for k, v in theirs[0].items() if k != "concurrency"}])
    assert "concurrency" not in without[0] and "concurrency" not in [c.key for c in parity_columns(without)]


def test_engine_both_with_levels_compares_each_level_with_ours(tmp_path, monkeypatch, capsys):
    """--engine both --concurrency 1 2, with the worker replaced by our own target's greedy decoding (one drafted
    token per prompt, never accepted): levels apply to the vLLM side only, parity has a row per level."""
    from decode import autoregressive_generate

    tok = tiny_tokenizer()
    target = save_and_load(tiny_model("llama", seed=0, vocab_size=len(tok)), tmp_path / "target", tok)
    (tmp_path / "prompts.txt").write_text("\n".join(TINY_TEXT.splitlines()[:2]) + "\n")

    def fake_worker(python, request, timeout=None):
        outputs = [autoregressive_generate(target, torch.tensor([ids]), max_new_tokens=request["max_new_tokens"])
                   .new_tokens for ids in request["prompts"]]
        counters = {"num_drafts": 2, "num_draft_tokens": 4, "num_accepted_tokens": 0,
                    "num_accepted_tokens_per_pos": [0, 0]}
        runs = [{**run, "outputs": outputs, "seconds": 2.0, "counters": counters} for run in request["runs"]]
        return {"vllm_version": "fake", "levels": [{"max_num_seqs": n, "plain": {"outputs": outputs, "seconds": 1.0},
                                                    "speculative": runs} for n in request["concurrency"]]}

    monkeypatch.setattr(vllm_engine, "run_worker", fake_worker)
    report = eval_acceptance.main(["--target", str(tmp_path / "target"), "--draft", "prompt-lookup", "--prompts",
                                   str(tmp_path / "prompts.txt"), "--gamma", "2", "--max-new-tokens", "6",
                                   "--engine", "both", "--concurrency", "1", "2", "--vllm-python", sys.executable,
                                   "--quiet", "--vllm-dtype", "bfloat16"])
    assert (report["dtype"], report["vllm_dtype"]) == ("float32", "bfloat16")  # ours by --dtype, vLLM's by its own
    assert [r["concurrency"] for r in report["vllm_results"]] == [1, 2]
    assert [r["speedup"] for r in report["vllm_results"]] == [0.5, 0.5]  # 1 s plain, 2 s speculative
    # prompt lookup drafts with no model: the batch cost model's prediction at each level. The plain calls take 1 s
    # at both levels, so T(n) = n * T(1): a step carrying 1 + 4 / new drafted tokens per sequence costs that much more
    new = report["vllm_results"][0]["new_tokens"]
    assert [r["predicted_speedup"] for r in report["vllm_results"]] == [pytest.approx(1 / (1 + 4 / new))] * 2
    assert "concurrency" not in report["results"][0]  # ours: batch 1
    assert [r["concurrency"] for r in report["parity"]] == [1, 2] and report["target_match_vllm"] == 1.0
    printed = capsys.readouterr().out
    assert printed.count("concurrency") == 2  # the vLLM table's column and the parity table's


def test_engine_both_by_category_prints_vllms_counts_without_the_runs_timings(tmp_path, monkeypatch, capsys):
    """One vLLM call times every prompt, so its by-category table shows counts (tau, acceptance) and leaves out the
    tokens/s and speedup that every category would repeat; ours keeps its own per-category timings, and the JSON
    keeps both."""
    from decode import autoregressive_generate

    tok = tiny_tokenizer()
    target = save_and_load(tiny_model("llama", seed=0, vocab_size=len(tok)), tmp_path / "target", tok)
    lines = TINY_TEXT.splitlines()[:2]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": text, "category": name}) + "\n"
                                                    for text, name in zip(lines, ("code", "loops"))))

    def fake_worker(python, request, timeout=None):
        outputs = [autoregressive_generate(target, torch.tensor([ids]), max_new_tokens=request["max_new_tokens"])
                   .new_tokens for ids in request["prompts"]]
        counters = {"num_drafts": 2, "num_draft_tokens": 4, "num_accepted_tokens": 1,
                    "num_accepted_tokens_per_pos": [1, 0]}
        per_prompt = [{"histogram": [1, 0, 0], "num_draft_tokens": 2}, {"histogram": [0, 1, 0], "num_draft_tokens": 2}]
        runs = [{**run, "outputs": outputs, "seconds": 2.0, "counters": counters, "per_prompt": per_prompt}
                for run in request["runs"]]
        return {"vllm_version": "fake", "plain": {"outputs": outputs, "seconds": 1.0}, "speculative": runs}

    monkeypatch.setattr(vllm_engine, "run_worker", fake_worker)
    report = eval_acceptance.main(["--target", str(tmp_path / "target"), "--draft", "prompt-lookup", "--prompts",
                                   str(tmp_path / "prompts.jsonl"), "--gamma", "2", "--max-new-tokens", "6",
                                   "--engine", "both", "--vllm-python", sys.executable])
    (theirs,) = report["vllm_results"]
    assert [theirs["by_category"][c]["mean_accepted_tokens"] for c in ("code", "loops")] == [1.0, 2.0]
    assert {c["speedup"] for c in theirs["by_category"].values()} == {0.5}  # the JSON: the run's, as documented
    printed = capsys.readouterr().out
    ours_part, vllm_part = printed.split("vllm:")
    ours_categories = ours_part.split("by category:")[1]
    vllm_categories = vllm_part.split("are the run's):")[1].split("tau parity")[0]
    assert "spec tok/s" in ours_categories and "speedup" in ours_categories
    assert "tau" in vllm_categories and "code" in vllm_categories and "loops" in vllm_categories
    assert "spec tok/s" not in vllm_categories and "speedup" not in vllm_categories
    assert "plain tok/s" not in vllm_categories and "0.50x" in vllm_part.split("by category")[0]


# ---- no interpreter ---------------------------------------------------------------------------------------------
def test_without_a_vllm_interpreter_the_error_names_make_serving(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(vllm_engine.VLLM_PYTHON_ENV, raising=False)
    with pytest.raises(ServingError, match="make serving"):
        find_vllm_python()
    with pytest.raises(ServingError, match="make serving"):
        find_vllm_python(tmp_path / "no-python")
    monkeypatch.setattr(sys, "argv", ["specdistill-eval", "--target", "t", "--draft", "d", "--prompts", "p.txt",
                                      "--engine", "vllm"])
    with pytest.raises(SystemExit) as exit_info:
        eval_acceptance.cli()
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and "make serving" in err and len(err.strip().splitlines()) == 1


# ---- the trainer: eval.serving_engine ---------------------------------------------------------------------------
def test_serving_engine_needs_an_integer_gamma():
    from specdistill.recipes import EvalConfig, RecipeError

    assert EvalConfig(gammas=[2, "auto"], serving_engine="vllm").serving_engine == "vllm"
    with pytest.raises(RecipeError, match="serving_engine"):
        EvalConfig(gammas=["auto"], serving_engine="vllm")


def test_export_without_vllm_records_the_error_and_the_card_says_so(tmp_path, monkeypatch):
    from distill.publish.export import serving_check, vllm_tau
    from distill.publish.model_card import serving_section
    from specdistill.recipes import DataConfig, EvalConfig, ModelConfig, Recipe, TrainConfig

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(vllm_engine.VLLM_PYTHON_ENV, raising=False)
    recipe = Recipe(model=ModelConfig(target="t", draft="d"), data=DataConfig(dataset="d.txt"),
                    train=TrainConfig(output_dir=str(tmp_path / "out")), eval=EvalConfig(serving_engine="vllm"))
    serving = serving_check(recipe, [torch.tensor([1, 2, 3])], None)
    assert serving["engine"] == "vllm" and "make serving" in serving["error"]
    (tmp_path / "train_results.json").write_text(json.dumps({"serving": serving}))
    assert "could not measure" in serving_section(tmp_path, [])
    measured = {"engine": "vllm", "vllm_version": "0.32.0",
                "results": vllm_results(RESPONSE, EvalSettings(gammas=[2], max_new_tokens=4))}
    (tmp_path / "train_results.json").write_text(json.dumps({"serving": measured}))
    card = serving_section(tmp_path, [{"gamma": 2, "temperature": 0.0, "mean_accepted_tokens": 1.9}])
    assert "| 2 " in card and "1.90" in card and "2.00" in card and "vLLM 0.32.0" in card
    assert vllm_tau(measured, {"gamma": 2}) == pytest.approx(2.0) and vllm_tau(measured, {"gamma": 4}) is None


# ---- target responses by vLLM (data.target_engine: vllm) ---------------------------------------------------------
def test_vllm_target_data_request_keeps_our_seeds_and_eos():
    from distill.data.target_data import Sampling
    from distill.data.target_vllm import vllm_request

    sampling = Sampling(max_new_tokens=16, temperature=1.0, top_k=None, top_p=None, seed=7, gamma=1)
    request = vllm_request("target", [[1, 2, 3], [1, 4]], sampling, eos_token_id=2, first_index=64)
    assert request["seed"] == 7 + 64  # the worker seeds prompt j with seed + j: prompt 64 + j gets 7 + 64 + j
    assert request["stop_token_ids"] == [2] and request["runs"] == [] and request["max_model_len"] >= 3 + 16
    assert vllm_request("target", [[1]], sampling, None, 0)["stop_token_ids"] is None


def test_vllm_target_data_without_interpreter_names_make_serving(tmp_path, monkeypatch):
    from distill.data.target_data import generate_target_data

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(vllm_engine.VLLM_PYTHON_ENV, raising=False)
    with pytest.raises(ServingError, match="make serving"):
        generate_target_data(None, None, [[1, 2]], tmp_path / "out", max_new_tokens=4, engine="vllm")
    with pytest.raises(ValueError, match="engine"):
        generate_target_data(None, None, [[1, 2]], tmp_path / "out", max_new_tokens=4, engine="sglang")


def test_target_data_past_the_context_is_one_line_before_vllm_and_a_warning_with_ours(tmp_path, monkeypatch,
                                                                                         caplog):
    """Responses whose longest prompt and max_new_tokens pass the target's context: with vLLM one line before its
    engine starts (no worker run), naming the most new tokens that fit; our decoder writes them after a warning."""
    from distill.data import target_data

    tok = tiny_tokenizer()
    target = tiny_model("llama", seed=0, vocab_size=len(tok))
    target.config.max_position_embeddings = 24
    monkeypatch.setattr(target_data, "find_vllm_python", lambda given=None: Path(sys.executable))
    monkeypatch.setattr(vllm_engine, "run_worker", lambda *a, **k: pytest.fail("vLLM was started"))
    prompts = [[1, 5, 6, 7], [1, 5]]
    with pytest.raises(ServingError, match=r"^answers: the longest prompt \(4 tokens\) and max_new_tokens 16 need "
                                           r"vLLM's max_model_len 28 \(8 spare\), past the target's context of 24 "
                                           r"positions: vLLM refuses it; max_new_tokens 12 at most$"):
        target_data.generate_target_data(target, tok, prompts, tmp_path / "vllm", max_new_tokens=16, engine="vllm",
                                         target_id="t", progress=False, desc="answers")
    with caplog.at_level("WARNING", logger="distill.data.target_data"):
        out = target_data.generate_target_data(target, tok, prompts, tmp_path / "ours", max_new_tokens=22,
                                               progress=False, desc="answers")
    assert [r.getMessage() for r in caplog.records] == [
        "answers: the longest prompt (4 tokens) and max_new_tokens 22 reach position 26, past the target's context of "
        "24: it writes where it was not trained"]
    assert len(out) == 2
    caplog.clear()
    with caplog.at_level("WARNING", logger="distill.data.target_data"):
        target_data.generate_target_data(target, tok, prompts, tmp_path / "fits", max_new_tokens=20, progress=False)
    assert not caplog.records


# ---- vLLM's dtype wherever vLLM runs: eval, data, check, a recipe --------------------------------------------------
def test_vllm_dtype_auto_is_bfloat16_on_cuda_and_float32_elsewhere():
    resolve = vllm_engine.resolve_vllm_dtype
    assert resolve("auto", torch.device("cpu")) == "float32"
    assert resolve("auto", torch.device("cuda", 1)) == "bfloat16"
    assert resolve("auto") == ("bfloat16" if torch.cuda.is_available() else "float32")  # the device vLLM takes
    assert [resolve(name, torch.device("cpu")) for name in vllm_engine.VLLM_DTYPES] == list(vllm_engine.VLLM_DTYPES)
    with pytest.raises(ServingError, match="vLLM dtype must be one of auto, float32, bfloat16, float16"):
        resolve("fp8", torch.device("cpu"))


def test_vllm_target_data_request_carries_the_dtype_and_rejects_a_bad_one():
    from distill.data.target_data import Sampling
    from distill.data.target_vllm import vllm_request

    sampling = Sampling(max_new_tokens=4, temperature=0.0, top_k=None, top_p=None, seed=0, gamma=1)
    assert vllm_request("t", [[1, 2]], sampling, None, 0)["dtype"] == "float32"  # our CPU decoder's
    assert vllm_request("t", [[1, 2]], sampling, None, 0, dtype="bfloat16")["dtype"] == "bfloat16"
    with pytest.raises(ServingError, match="vLLM dtype must be one of float32, bfloat16, float16, got 'auto'"):
        vllm_request("t", [[1, 2]], sampling, None, 0, dtype="auto")  # resolved by the command first


def plain_worker(requests: list[dict]):
    """A stand-in for vLLM's worker: records each request and answers every prompt with tokens 5 6 7 8."""
    def worker(python, request, timeout=None):
        requests.append(request)
        outputs = [[5, 6, 7, 8] for _ in request["prompts"]]
        counters = {"num_drafts": 2, "num_draft_tokens": 4, "num_accepted_tokens": 2,
                    "num_accepted_tokens_per_pos": [1, 1]}
        runs = [{**run, "outputs": outputs, "seconds": 1.0, "counters": counters} for run in request["runs"]]
        return {"vllm_version": "fake", "plain": {"outputs": outputs, "seconds": 1.0}, "speculative": runs}
    return worker


def test_data_vllm_dtype_reaches_vllm_and_a_rerun_in_another_dtype_is_refused(tmp_path, monkeypatch):
    """`specdistill data responses --engine vllm --vllm-dtype bfloat16`: the worker is asked for bfloat16 (auto:
    float32 on this CPU) and the stored answers record it, so resuming them in another dtype is a mismatch. Our copy
    of the target is only read, on the CPU, whatever --device says (vLLM has the GPU to itself)."""
    from distill.data.shard_store import CacheMismatchError
    from specdistill.cli import data as data_cli

    tok = tiny_tokenizer()
    save_and_load(tiny_model("llama", seed=0, vocab_size=len(tok)), tmp_path / "target", tok)
    (tmp_path / "prompts.txt").write_text("def add(a, b):\nimport os\n")
    requests = []
    monkeypatch.setattr(vllm_engine, "run_worker", plain_worker(requests))
    command = ["responses", "--target", str(tmp_path / "target"), "--prompts", str(tmp_path / "prompts.txt"),
               "--engine", "vllm", "--vllm-python", sys.executable, "--max-new-tokens", "4", "--quiet",
               "--chat-template", "off", "--device", "cuda"]
    data_cli.main([*command, "--out", str(tmp_path / "bf16"), "--vllm-dtype", "bfloat16"])
    data_cli.main([*command, "--out", str(tmp_path / "auto")])
    assert [r["dtype"] for r in requests] == ["bfloat16", "float32"]
    with pytest.raises(CacheMismatchError, match="vllm_dtype"):
        data_cli.main([*command, "--out", str(tmp_path / "bf16"), "--vllm-dtype", "float16"])


def test_check_serve_runs_vllm_in_the_dtype_asked_for(tmp_path, monkeypatch, capsys):
    from specdistill.cli import check as check_cli

    tok = tiny_tokenizer()
    target = tiny_model("llama", seed=0, vocab_size=len(tok))
    save_and_load(target, tmp_path / "target", tok)
    save_and_load(perturbed_copy(target, 0.1), tmp_path / "draft", tok)
    requests = []
    monkeypatch.setattr(vllm_engine, "run_worker", plain_worker(requests))
    for flags, sent in (([], "float32"), (["--vllm-dtype", "bfloat16"], "bfloat16")):
        check_cli.main(["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"), "--serve",
                        "--vllm-python", sys.executable, *flags])
        assert requests[-1]["dtype"] == sent
    assert "vLLM fake" in capsys.readouterr().out


def test_recipe_vllm_dtype_is_what_the_data_job_and_the_export_give_vllm():
    from distill.data.sources import vllm_dtype_of
    from specdistill.recipes import load_recipe

    recipe = functools.partial(load_recipe, "recipes/tiny_distill.yaml")
    assert vllm_dtype_of(recipe(["model.target=t", "data.dataset=d.txt"])) == "float32"  # auto on this CPU
    assert vllm_dtype_of(recipe(["model.target=t", "data.dataset=d.txt", "eval.vllm_dtype=bfloat16"])) == "bfloat16"
