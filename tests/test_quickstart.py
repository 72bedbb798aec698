"""The real-model quickstart's wiring without its work: the commands each step runs, reuse of what a run left, the
engine choice, --tiny, and the summary line (scripts/quickstart.py;
the tiny pair's is tests/test_quickstart_tiny.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from scripts import quickstart


@pytest.fixture
def commands(monkeypatch) -> list[list[str]]:
    """The commands quickstart.run would run (nothing is run)."""
    ran: list[list[str]] = []
    monkeypatch.setattr(quickstart, "run", ran.append)
    return ran


def eval_report(tau: float, speedup: float, vllm_tau: float | None = None) -> dict:
    rows = [{"gamma": g, "category": None, "mean_accepted_tokens": tau - (4 - g) * 0.01, "target_tokens_per_s": 17.0,
             "speculative_tokens_per_s": 17.0 * (speedup - (4 - g) * 0.1), "speedup": speedup - (4 - g) * 0.1}
            for g in (2, 4)]
    report = {"results": rows + [{**rows[0], "category": "math"}]}
    if vllm_tau is not None:
        report["vllm_results"] = [{"gamma": 4, "category": None, "mean_accepted_tokens": vllm_tau}]
        report["parity"] = [{"gamma": g, "temperature": 0.0, "tau_specdistill": tau, "tau_vllm": vllm_tau}
                            for g in (2, 4)]
    return report


def test_data_steps_run_specdistill_data_with_the_chosen_engine(commands, tmp_path):
    prompts = quickstart.synthesize_prompts(tmp_path, Path("m.gguf"), "vllm")
    quickstart.answer_prompts(tmp_path, Path("m.gguf"), prompts, "specdistill")
    made, answered = commands
    build = [sys.executable, str(quickstart.ROOT / "scripts" / "build_data.py")]
    assert made[:3] == [*build, "prompts"] and answered[:3] == [*build, "responses"]
    assert made[made.index("--num") + 1] == str(quickstart.NUM_PROMPTS) and made[made.index("--engine") + 1] == "vllm"
    assert made[made.index("--exclude") + 1] == str(quickstart.EVAL_PROMPTS)  # no held-out prompt is trained on
    assert made[made.index("--categories") + 1] == "all"  # toward the held-out prompts' categories
    assert answered[answered.index("--prompts") + 1] == str(tmp_path / "data" / "prompts")
    assert answered[answered.index("--engine") + 1] == "specdistill"
    assert answered[answered.index("--max-new-tokens") + 1] == str(quickstart.MAX_NEW_TOKENS)


def test_training_runs_the_smollm2_recipes_and_reuses_finished_runs(commands, tmp_path, capsys):
    chat = tmp_path / "data" / "chat"
    quickstart.train(tmp_path / "head", "eagle3.yaml", Path("m.gguf"), chat, ["distill.hidden_state_cache=C"])
    (cmd,) = commands
    assert cmd[:3] == [sys.executable, str(quickstart.ROOT / "scripts" / "train.py"),
                       str(quickstart.ROOT / "recipes" / "smollm2" / "eagle3.yaml")]
    assert {"model.target=m.gguf", f"data.dataset={chat}", f"train.output_dir={tmp_path / 'head'}",
            *quickstart.TRAINER_EVAL} <= set(cmd)
    assert cmd[-1] == "distill.hidden_state_cache=C"  # the caller's overrides come last: they win
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "train_results.json").write_text("{}")
    quickstart.train(tmp_path / "draft", "draft.yaml", Path("m.gguf"), chat)
    assert len(commands) == 1 and f"reusing {tmp_path / 'draft'}" in capsys.readouterr().out


def test_data_steps_reuse_their_results(commands, tmp_path):
    (tmp_path / "data" / "prompts").mkdir(parents=True)
    (tmp_path / "data" / "prompts" / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    quickstart.synthesize_prompts(tmp_path, Path("m.gguf"), "specdistill")
    assert commands == []


def test_eval_runs_every_drafter_on_held_out_chat_prompts_and_reuses_it(tmp_path, monkeypatch):
    import specdistill.cli.eval as eval_cli

    seen: list[list[str]] = []

    def fake_eval(argv):
        seen.append(argv)
        Path(argv[argv.index("--output") + 1]).parent.mkdir(parents=True, exist_ok=True)
        report = eval_report(1.5, 1.1, 1.5 if "both" in argv else None)
        Path(argv[argv.index("--output") + 1]).write_text(json.dumps(report))

    monkeypatch.setattr(eval_cli, "main", fake_eval)
    (tmp_path / "head").mkdir()  # the trained head's folder
    quickstart.evaluate(tmp_path, Path("m.gguf"), "prompt_lookup", vllm=False)
    quickstart.evaluate(tmp_path, Path("m.gguf"), "head", vllm=True)
    lookup, head = seen
    assert lookup[lookup.index("--draft") + 1] == "prompt-lookup" and lookup[lookup.index("--engine") + 1] == \
        "specdistill"
    assert head[head.index("--draft") + 1] == str(tmp_path / "head") and head[head.index("--engine") + 1] == "both"
    assert head[head.index("--prompts") + 1] == str(quickstart.EVAL_PROMPTS)
    assert head[head.index("--chat-template") + 1] == "on"
    quickstart.evaluate(tmp_path, Path("m.gguf"), "head", vllm=True)  # there, with vLLM's side: reused
    assert len(seen) == 2
    quickstart.evaluate(tmp_path, Path("m.gguf"), "prompt_lookup", vllm=True)  # there without vLLM's: measured again
    assert len(seen) == 3


def test_the_held_out_prompts_take_turns_by_category():
    rows = [json.loads(line) for line in quickstart.EVAL_PROMPTS.read_text().splitlines()]
    first = [r["category"] for r in rows[:quickstart.NUM_EVAL]]
    assert len(set(first)) == 8 and all(first.count(c) == 2 for c in set(first))


def test_summary_takes_each_drafters_fastest_gamma_and_says_what_vllm_measured():
    row = quickstart.summary_row("head", eval_report(2.0, 1.3, vllm_tau=2.1))
    assert row["drafter"] == "head" and row["gamma"] == 4 and row["mean_accepted_tokens"] == 2.0
    assert row["speedup"] == 1.3 and row["vllm_tau"] == 2.1 and row["parity_tau"] == 2.0 and "category" not in row
    line = quickstart.headline(row, vllm=True)
    assert line.startswith("EAGLE-3 head on SmolLM2-135M-Instruct: tau 2.00 at gamma 4, 1.30x plain decoding")
    assert line.endswith("on the same inputs vLLM's tau is 2.10, ours 2.00 (5.0% apart)")
    alone = quickstart.headline(quickstart.summary_row("head", eval_report(2.0, 1.3)), vllm=False)
    assert alone.endswith("vLLM not installed (`make serving` adds it)")
    left_out = quickstart.headline(quickstart.summary_row("head", eval_report(2.0, 1.3)), vllm=False, installed=True)
    assert left_out.endswith("1.30x plain decoding on this machine; vLLM not used (--no-vllm)")


def test_the_summary_table_shows_tau_speedup_and_vllms_tau(capsys):
    quickstart.summarize({"head": eval_report(2.0, 1.3, vllm_tau=2.1), "prompt_lookup": eval_report(1.4, 1.1)},
                         vllm=True)
    table = capsys.readouterr().out
    assert "tau (vLLM)" in table and "2.10" in table and "1.30x" in table and "prompt_lookup" in table


def test_the_run_record_says_how_long_on_which_machine_and_what_it_ended_with(tmp_path):
    head = quickstart.summary_row("head", eval_report(1.34, 1.11))
    path = quickstart.write_run_record(tmp_path, 13.24, head, engine="specdistill", vllm=False, smoke=False)
    record = json.loads(path.read_text())
    assert path.name == "quickstart_run.json" and record["minutes"] == 13.2 and record["cores"] >= 1
    assert record["cpu"] and record["head"] == {"gamma": 4, "mean_accepted_tokens": 1.34, "speedup": 1.11}
    assert (record["data_engine"], record["vllm"], record["smoke"]) == ("specdistill", False, False)


def test_tiny_runs_the_tiny_pairs_smoke_run(monkeypatch, tmp_path):
    from scripts import quickstart_tiny

    seen = []
    monkeypatch.setattr(quickstart_tiny, "main", seen.append)
    quickstart.main(["--tiny", "--out", str(tmp_path)])
    assert seen == [["--fast", "--out", str(tmp_path)]]


def test_engine_auto_follows_the_serving_venv(monkeypatch):
    monkeypatch.setattr(quickstart, "vllm_installed", lambda: True)
    assert quickstart.data_engine("auto") == "vllm" and quickstart.data_engine("specdistill") == "specdistill"
    monkeypatch.setattr(quickstart, "vllm_installed", lambda: False)
    assert quickstart.data_engine("auto") == "specdistill"
    assert quickstart.parse_args(["--no-vllm"]).vllm is False and quickstart.parse_args([]).vllm is False


@pytest.mark.parametrize("with_draft", [False, True])
def test_the_standalone_draft_is_trained_and_measured_only_with_with_draft(with_draft, monkeypatch, tmp_path, capsys):
    """The default run trains the head and measures it and prompt lookup; --with-draft adds the standalone draft's
    training and its row, in the table's order (the head first: the headline), and the run record names them."""
    trained, measured = [], []
    monkeypatch.setattr(quickstart, "vllm_installed", lambda: False)
    monkeypatch.setattr(quickstart, "real_target", lambda: Path("m.gguf"))
    monkeypatch.setattr(quickstart, "synthesize_prompts", lambda out, target, engine, count: out / "prompts")
    monkeypatch.setattr(quickstart, "answer_prompts", lambda out, target, prompts, engine, tokens: out / "chat")
    monkeypatch.setattr(quickstart, "train", lambda output_dir, recipe, *args: trained.append(recipe))

    def measure(out, target, name, vllm, sizes):
        measured.append(name)
        return eval_report(1.4, 1.1)

    monkeypatch.setattr(quickstart, "evaluate", measure)
    quickstart.main(["--out", str(tmp_path), *(["--with-draft"] if with_draft else [])])
    names = ["head", "draft", "prompt_lookup"] if with_draft else ["head", "prompt_lookup"]
    assert trained == (["eagle3.yaml", "draft.yaml"] if with_draft else ["eagle3.yaml"]) and measured == names
    record = json.loads((tmp_path / quickstart.RUN_RECORD).read_text())
    assert record["drafters"] == names and record["head"]["mean_accepted_tokens"] == pytest.approx(1.4)
    assert f"{quickstart.STEPS}/{quickstart.STEPS} comparison" in capsys.readouterr().out
