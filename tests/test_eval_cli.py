"""specdistill-eval (specdistill/cli/eval.py) end to end: valid JSON with every documented key;
bad input is one line."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from decode.measure.results import Result, read_eval_json
from specdistill.cli import eval as eval_acceptance
from specdistill.cli import eval_run
from specdistill.cli.closed_pipe import CLOSED_PIPE_EXIT, quiet_on_a_closed_pipe

from tiny import TINY_TEXT, perturbed_copy, save_and_load, tiny_model, tiny_tokenizer

RESULT_KEYS = {"gamma", "temperature", "num_prompts", "new_tokens", "acceptance_rate", "draft_acceptance_rate",
               "mean_accepted_tokens", "per_position_acceptance", "target_tokens_per_s",
               "speculative_tokens_per_s", "speedup", "predicted_speedup", "draft_cost_ratio",
               "verify_cost_ratio", "greedy_match", "hf_assisted_tokens_per_s"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    tok = tiny_tokenizer()
    target = tiny_model("llama", seed=0, vocab_size=len(tok))
    save_and_load(target, root / "target", tok)
    save_and_load(perturbed_copy(target, 0.1), root / "draft", tok)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in
                                                ["def add(a, b):", "class Point:", "for i in range(10):"]))
    (root / "prompts.txt").write_text("import os\nprint(i)\n")
    return root


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sys.argv = ["specdistill-eval", *argv]
        eval_acceptance.cli()
        raise SystemExit(0)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def test_cli_writes_valid_json_with_every_key(pair, tmp_path, capsys):
    out = tmp_path / "eval.json"
    outputs = tmp_path / "outputs.jsonl"
    code, stdout, _ = run_cli(["--target", str(pair / "target"), "--draft", str(pair / "draft"),
                               "--prompts", str(pair / "prompts.jsonl"), "--gamma", "1", "3",
                               "--max-new-tokens", "12", "--output", str(out), "--save-outputs", str(outputs),
                               "--compare-hf", "--quiet"], capsys)
    assert code == 0
    report = json.loads(out.read_text())
    assert {"device", "dtype", "torch_version", "target", "draft", "results"} <= set(report)
    assert read_eval_json(out) == report and "_git_commit_hash" in report["environment"]  # evaluate.save's record
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.json", "outputs.jsonl"]  # nothing else written
    assert [r["gamma"] for r in report["results"]] == [1, 3]
    for r in report["results"]:
        assert RESULT_KEYS <= set(r)
        assert Result.from_dict(r).to_dict() == r  # the typed record holds exactly the written keys
        assert r["num_prompts"] == 3 and r["new_tokens"] == 36
        assert r["greedy_match"] == 1.0
        assert 0.0 <= r["acceptance_rate"] <= 1.0 and 1.0 <= r["mean_accepted_tokens"] <= r["gamma"] + 1
        assert len(r["per_position_acceptance"]) == r["gamma"]
        assert r["speedup"] > 0 and r["predicted_speedup"] > 0 and r["hf_assisted_tokens_per_s"] > 0
    rows = [json.loads(line) for line in outputs.read_text().splitlines()]
    assert len(rows) == 6 and all(row["plain_ids"] == row["speculative_ids"] for row in rows)
    assert "acceptance" in stdout.splitlines()[0] or "accept" in stdout  # the table


@pytest.mark.parametrize("temperature", ["0", "0.8"])
def test_acceptance_only_is_the_full_runs_acceptance(temperature, pair, tmp_path, capsys):
    """--acceptance-only: the same acceptance, tau, per-position acceptance and counts as a full run (same prompts,
    seeds), with no timing, no plain decoding and no greedy check in the JSON."""
    common = ["--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompts",
              str(pair / "prompts.jsonl"), "--gamma", "1", "3", "--max-new-tokens", "12", "--temperature",
              temperature, "--quiet"]
    full, alone = tmp_path / "full.json", tmp_path / "alone.json"
    assert run_cli([*common, "--output", str(full)], capsys)[0] == 0
    code, stdout, _ = run_cli([*common, "--acceptance-only", "--output", str(alone)], capsys)
    assert code == 0 and "speedup" not in stdout and "tau" in stdout
    report = json.loads(alone.read_text())
    assert report["acceptance_only"] is True
    for row, reference in zip(report["results"], json.loads(full.read_text())["results"], strict=True):
        for key in ("gamma", "num_prompts", "acceptance_rate", "draft_acceptance_rate", "mean_accepted_tokens",
                    "per_position_acceptance", "stats"):
            assert row[key] == reference[key], key
        assert not {"speedup", "target_tokens_per_s", "speculative_tokens_per_s", "greedy_match"} & set(row)


@pytest.mark.parametrize("flag", [["--compare-hf"], ["--engine", "vllm"], ["--compile"]])
def test_acceptance_only_refuses_what_it_cannot_measure(flag, pair, capsys):
    code, _, err = run_cli(["--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompts",
                            str(pair / "prompts.txt"), "--acceptance-only", *flag], capsys)
    assert code == 1 and err.strip().splitlines() == [
        f"error: --acceptance-only measures acceptance alone with our decoder, eagerly: drop {' '.join(flag)}"]


def test_prompt_lookup_and_txt_prompts_and_sampling(pair, tmp_path, capsys):
    out = tmp_path / "eval.json"
    code, _, _ = run_cli(["--target", str(pair / "target"), "--draft", "prompt-lookup", "--prompts",
                          str(pair / "prompts.txt"), "--gamma", "2", "--max-new-tokens", "10",
                          "--temperature", "0.8", "--top-k", "20", "--top-p", "0.9", "--num-prompts", "1",
                          "--output", str(out), "--quiet"], capsys)
    assert code == 0
    result = json.loads(out.read_text())["results"][0]
    assert result["num_prompts"] == 1 and result["greedy_match"] is None and result["temperature"] == 0.8


def test_chat_prompts_by_category(pair, tmp_path, capsys):
    """Conversations rendered with the target's chat template, and by_category results that add up to the whole."""
    import shutil

    from transformers import AutoTokenizer

    from scripts.quickstart_tokenizer import CHAT_TEMPLATE

    target = Path(shutil.copytree(pair / "target", tmp_path / "target"))
    tok = AutoTokenizer.from_pretrained(target)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(target)
    turn = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    rows = [{"messages": turn("def add(a, b):"), "category": "code"},
            {"messages": turn("class Point:"), "category": "code"},
            {"prompt": "for i in range(10):", "category": "loops"}, {"prompt": "import os"}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out, outputs = tmp_path / "eval.json", tmp_path / "outputs.jsonl"
    code, stdout, err = run_cli(["--target", str(target), "--draft", str(pair / "draft"), "--prompts",
                                 str(tmp_path / "p.jsonl"), "--gamma", "2", "--max-new-tokens", "8",
                                 "--output", str(out), "--save-outputs", str(outputs), "--quiet"], capsys)
    assert code == 0
    assert "note: 2 of 4 prompts are plain text and go to the target raw" in err  # auto, said once
    report = json.loads(out.read_text())
    (result,) = report["results"]
    by_category = result["by_category"]
    assert sorted(by_category) == ["code", "loops", "uncategorized"] and report["chat_template"] == "auto"
    assert [by_category[c]["num_prompts"] for c in ("code", "loops", "uncategorized")] == [2, 1, 1]
    for entry in by_category.values():
        assert RESULT_KEYS - {"hf_assisted_tokens_per_s"} <= set(entry) and entry["greedy_match"] == 1.0
    # raw counts of the categories add up to the whole run's
    for key in ("target_calls", "new_tokens", "drafted_tokens", "accepted_tokens"):
        assert sum(c["stats"][key] for c in by_category.values()) == result["stats"][key]
    saved = [json.loads(line) for line in outputs.read_text().splitlines()]
    assert tok.decode(saved[0]["prompt_ids"]) == "<|user|>\ndef add(a, b):</s><|assistant|>\n"
    assert tok.decode(saved[2]["prompt_ids"]) == "for i in range(10):"  # auto: plain prompts stay raw text
    assert [row["category"] for row in saved] == ["code", "code", "loops", "uncategorized"]
    assert "by category" in stdout and "uncategorized" in stdout
    # --chat-template on without a template is one line, before any model loads
    code, _, err = run_cli(["--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompts",
                            str(tmp_path / "p.jsonl"), "--chat-template", "on"], capsys)
    assert code == 1 and "--chat-template on, but tokenizer" in err and "has no chat template" in err


def other_tokenizer_draft(root: Path) -> Path:
    tok = tiny_tokenizer(text=TINY_TEXT[::-1])  # trained on other text: other token ids
    save_and_load(tiny_model("llama", seed=1, vocab_size=len(tok)), root / "other", tok)
    return root / "other"


@pytest.mark.parametrize("case", ["missing-model", "file-as-model", "checkpoint-as-model", "gamma0", "empty-prompts",
                                  "missing-prompts", "tokenizers"])
def test_bad_input_is_one_clear_line(case, pair, tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("\n\n")
    args = {"target": str(pair / "target"), "draft": str(pair / "draft"), "prompts": str(pair / "prompts.txt"),
            "gamma": "2"}
    expect = {"missing-model": "does-not-exist", "file-as-model": "(--draft): a file, not a model folder",
              "checkpoint-as-model": f"(--draft): a training checkpoint, not an exported model: {tmp_path / 'run'} "
                                     "holds the run's export",
              "gamma0": "--gamma must be >= 1",
              "empty-prompts": "contains no prompts", "missing-prompts": "does not exist",
              "tokenizers": "does not match target tokenizer"}[case]
    if case == "missing-model":
        args["draft"] = str(tmp_path / "does-not-exist")
    elif case == "file-as-model":
        args["draft"] = str(pair / "prompts.txt")
    elif case == "checkpoint-as-model":  # a head's checkpoint: weights and trainer state, its config in the export
        (tmp_path / "run" / "checkpoint-2").mkdir(parents=True)
        (tmp_path / "run" / "checkpoint-2" / "trainer_state.json").write_text("{}")
        args["draft"] = str(tmp_path / "run" / "checkpoint-2")
    elif case == "gamma0":
        args["gamma"] = "0"
    elif case == "empty-prompts":
        args["prompts"] = str(tmp_path / "empty.txt")
    elif case == "missing-prompts":
        args["prompts"] = str(tmp_path / "nope.jsonl")
    else:
        args["draft"] = str(other_tokenizer_draft(tmp_path))
    argv = [x for k, v in args.items() for x in (f"--{k}", v)] + ["--max-new-tokens", "4", "--quiet"]
    code, _, err = run_cli(argv, capsys)
    assert code == 1
    lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and expect in lines[0], err
    assert "Traceback" not in err


def test_batch_and_gamma_errors_in_the_library():
    import torch

    from specdistill.drafts import speculative_generate

    target = tiny_model("llama", seed=0)
    with pytest.raises(ValueError, match="batch size must be 1"):
        speculative_generate(target, target, torch.ones(2, 3, dtype=torch.long), max_new_tokens=4)
    with pytest.raises(ValueError, match="gamma"):
        speculative_generate(target, target, torch.ones(1, 3, dtype=torch.long), max_new_tokens=4, gamma=0)
    with pytest.raises(ValueError, match="prompt is empty"):
        speculative_generate(target, target, torch.ones(1, 0, dtype=torch.long), max_new_tokens=4)


def test_a_real_process_exits_nonzero_without_traceback(pair, tmp_path):
    proc = subprocess.run([sys.executable, "scripts/eval_acceptance.py", "--target", str(pair / "target"),
                           "--draft", str(tmp_path / "missing"), "--prompts", str(pair / "prompts.txt")],
                          capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "error: could not load model" in proc.stderr


def terminal_sigint() -> None:
    """In the child: SIGINT as a terminal's command has it. A suite started in the background (`make test &`) hands
    its processes SIGINT ignored, and Python then leaves it ignored: Ctrl-C would never reach the eval."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_is_one_line_and_exit_130(pair, tmp_path):
    """Ctrl-C while a real eval process measures: one line saying what was written, exit 130, no traceback."""
    out = tmp_path / "eval.json"
    proc = subprocess.Popen([sys.executable, "scripts/eval_acceptance.py", "--target", str(pair / "target"),
                             "--draft", str(pair / "draft"), "--prompts", str(pair / "prompts.txt"), "--gamma", "2",
                             "--max-new-tokens", "4000", "--output", str(out)],
                            stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parents[1],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, preexec_fn=terminal_sigint)
    seen = ""
    while "eval-acceptance" not in seen:  # the progress bar: measuring has begun
        seen += proc.stderr.read(1) or pytest.fail(f"eval ended before measuring: {seen[-2000:]}")
    proc.send_signal(signal.SIGINT)
    err = seen + proc.stderr.read()
    assert proc.wait(timeout=60) == 130, err[-2000:]
    assert "Traceback" not in err
    assert err.rstrip().splitlines()[-1].endswith(f"interrupted; nothing was written (--output {out} is written "
                                                  "once every gamma is measured)")
    assert not out.exists()


@pytest.mark.parametrize("mode", ["auto", "packed", "plain"])
def test_cpu_linear_packs_or_keeps_the_models(mode, pair, tmp_path, capsys, monkeypatch):
    """--cpu-linear auto (the default) packs the target's and the draft's linear layers and keeps F.linear at the
    token counts (1 to gamma + 1) where it measured faster, and the report says which; packed packs them; plain
    leaves them; all decode greedily exactly as the target alone."""
    import torch

    from decode.loop.packed_linear import PackedLinear

    if mode == "packed" and not torch.backends.mkldnn.is_available():
        pytest.skip("oneDNN is not built into torch: nothing to pack")
    evaluated, real = [], eval_run.evaluate_acceptance

    def evaluate(target, draft, *args, **kwargs):  # the models the CLI evaluates, as it hands them over
        evaluated.append((target, draft))
        return real(target, draft, *args, **kwargs)

    monkeypatch.setattr(eval_run, "evaluate_acceptance", evaluate)
    out = tmp_path / "eval.json"
    flag = ["--cpu-linear", mode] if mode != "auto" else []
    code, _, _ = run_cli(["--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompts",
                          str(pair / "prompts.txt"), "--gamma", "2", "--max-new-tokens", "8", "--output", str(out),
                          "--quiet", *flag], capsys)
    assert code == 0
    report = json.loads(out.read_text())
    assert report["results"][0]["greedy_match"] == 1.0
    ((target, draft),) = evaluated
    if mode == "auto":
        words = report["cpu_linear"].split(", ")
        assert words[0].startswith("auto: target ") and words[1].startswith("draft "), report["cpu_linear"]
        for model, word in zip((target, draft), words):
            plain = {layer.plain_rows for layer in model.modules() if isinstance(layer, PackedLinear)}
            assert len(plain) == 1 and plain.pop() <= {1, 2, 3}  # one choice per model, among 1..gamma + 1 tokens
            assert word.endswith("packed") or "plain at" in word
    else:
        assert report["cpu_linear"] == mode
    for model in (target, draft):
        assert any(isinstance(m, PackedLinear) for m in model.modules()) == (mode != "plain")


def test_bad_cpu_linear_is_one_line(pair, capsys):
    code, _, err = run_cli(["--target", str(pair / "target"), "--draft", "prompt-lookup", "--prompts",
                            str(pair / "prompts.txt"), "--cpu-linear", "fast"], capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "--cpu-linear" in err and "invalid choice: 'fast'" in err and "Traceback" not in err


def closed_pipe() -> int:
    """The write end of a pipe whose reader has already left (`specdistill ... | head -1`, head done)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    return write_end


@pytest.mark.parametrize("job", ["eval", "check"])
def test_a_reader_that_leaves_early_ends_the_command_quietly_and_loses_nothing(job, pair, tmp_path):
    """stdout piped into a reader that has gone: exit 141 (as a tool SIGPIPE ends) without a traceback or Python's
    "Exception ignored" line, and the JSON the command was asked for is written all the same."""
    out = tmp_path / f"{job}.json"
    argv = {"eval": ["--prompts", str(pair / "prompts.txt"), "--gamma", "2", "--max-new-tokens", "4",
                     "--output", str(out)],
            "check": ["--json", str(out)]}[job]
    stdout = closed_pipe()
    try:
        proc = subprocess.run([sys.executable, "-m", "specdistill.cli.main", job, "--target", str(pair / "target"),
                               "--draft", str(pair / "draft"), *argv], stdout=stdout, stderr=subprocess.PIPE,
                              text=True, cwd=Path(__file__).parents[1], env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        os.close(stdout)
    assert proc.returncode == CLOSED_PIPE_EXIT, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr[-2000:]
    assert json.loads(out.read_text())["target"] == str(pair / "target")


def test_a_broken_pipe_elsewhere_is_raised_as_it_is():
    """A BrokenPipeError that is not stdout's or stderr's (a socket, a child's stdin) is not taken for a reader that
    left: it propagates."""
    @quiet_on_a_closed_pipe
    def command() -> None:
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(BrokenPipeError):
        command()
