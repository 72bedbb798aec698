"""`specdistill-data`: the target's answers to a prompt set (turn by turn), prompts written by the target, and the
folder a recipe reads; resumed after an interruption; bad input answered by one line."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import distill.data.target_data as target_data
from decode import autoregressive_generate
from distill.data.dataset import build_data
from distill.data.magpie import CATEGORY_OPENERS, SynthesizedPrompt
from distill.data.rows import IGNORE_INDEX
from specdistill.cli import data as data_command
from specdistill.cli import data_run
from specdistill.recipes import DataConfig

from tiny import tiny_model, tiny_tokenizer

VOCAB = 320
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant\n{% endif %}")
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """target/ (a tiny Llama with a chat tokenizer) and chats.jsonl (one and two user turns, old answers)."""
    root = tmp_path_factory.mktemp("data_command")
    tokenizer = tiny_tokenizer(VOCAB)
    tokenizer.chat_template = CHAT_TEMPLATE
    tiny_model("llama", seed=0, vocab_size=VOCAB, hidden=32, layers=2).save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    rows = [{"messages": [{"role": "user", "content": f"def f{i}(x):"}], "category": "code"} for i in range(5)]
    rows.append({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "class A:"},
                              {"role": "assistant", "content": "an old answer"},
                              {"role": "user", "content": "and then?"}]})
    (root / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def answer(workdir: Path, out: Path, *extra: str) -> list[dict]:
    data_command.main(["responses", "--target", str(workdir / "target"), "--prompts", str(workdir / "chats.jsonl"),
                       "--out", str(out), "--max-new-tokens", str(NEW_TOKENS), "--batch-size", "4", "--quiet",
                       *extra])
    return [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]


def greedy_reply(target, tokenizer, messages: list[dict]) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    new = autoregressive_generate(target, ids, max_new_tokens=NEW_TOKENS, eos_token_id=tokenizer.eos_token_id)
    return tokenizer.decode(new.new_tokens, skip_special_tokens=True).strip()


def test_every_turn_is_answered_by_the_target_given_its_own_earlier_answers(workdir, tmp_path):
    rows = answer(workdir, tmp_path / "chat")
    target = AutoModelForCausalLM.from_pretrained(workdir / "target").eval()
    tokenizer = data_run.load_tokenizer(str(workdir / "target"))
    assert len(rows) == 6 and [r.get("category") for r in rows] == ["code"] * 5 + [None]
    for row in rows[:5]:
        user, reply = row["messages"]
        assert reply["role"] == "assistant" and reply["content"] == greedy_reply(target, tokenizer, [user])
    system, first_user, first_reply, second_user, second_reply = rows[5]["messages"]
    assert (system["role"], first_user["content"], second_user["content"]) == ("system", "class A:", "and then?")
    assert first_reply["content"] != "an old answer"
    assert first_reply["content"] == greedy_reply(target, tokenizer, [system, first_user])
    assert second_reply["content"] == greedy_reply(target, tokenizer, [system, first_user, first_reply, second_user])


def test_a_recipe_reads_the_folder_and_trains_on_the_answers(workdir, tmp_path):
    rows = answer(workdir, tmp_path / "chat")
    tokenizer = data_run.load_tokenizer(str(workdir / "target"))
    data = build_data(DataConfig(dataset=str(tmp_path / "chat"), num_eval_prompts=0), tokenizer)
    assert data.format == "chat" and len(data.train) == sum(1 for r in rows if r["messages"][-1]["content"])
    first = data.train[0]
    trained = [t for t, label in zip(first["input_ids"], first["labels"]) if label != IGNORE_INDEX]
    assert tokenizer.decode(trained, skip_special_tokens=True).strip() == rows[0]["messages"][1]["content"]


def test_an_interrupted_run_resumes_and_equals_an_uninterrupted_one(workdir, tmp_path, monkeypatch):
    whole = answer(workdir, tmp_path / "whole", "--batch-size", "2")
    real, calls = target_data.DecoderEngine.generate_responses, []

    def dies_on_the_third_shard(self, prompts, seeds, sampling, batch_size):
        calls.append(len(prompts))
        if len(calls) == 3:
            raise KeyboardInterrupt  # what a kill leaves behind: complete shards only
        return real(self, prompts, seeds, sampling, batch_size)

    monkeypatch.setattr(target_data, "SHARD_PROMPTS", 2)
    monkeypatch.setattr(target_data.DecoderEngine, "generate_responses", dies_on_the_third_shard)
    with pytest.raises(KeyboardInterrupt):
        answer(workdir, tmp_path / "cut", "--batch-size", "2")
    assert not (tmp_path / "cut" / "train.jsonl").exists()
    calls.clear()
    monkeypatch.setattr(target_data.DecoderEngine, "generate_responses", real)
    assert answer(workdir, tmp_path / "cut", "--batch-size", "2") == whole
    generated = []
    monkeypatch.setattr(target_data.DecoderEngine, "generate_responses",
                        lambda self, prompts, *a: generated.append(prompts) or real(self, prompts, *a))
    assert answer(workdir, tmp_path / "cut", "--batch-size", "2") == whole and generated == []  # all read back


def test_prompts_are_written_as_user_turns_a_recipe_reads_as_prompts(workdir, tmp_path, monkeypatch):
    import specdistill.cli.data as command

    monkeypatch.setattr(data_run, "synthesize_prompt_rows", lambda *a, **k: [
        SynthesizedPrompt("one question"), SynthesizedPrompt("another question")])
    command.main(["prompts", "--target", str(workdir / "target"), "--num", "2", "--out", str(tmp_path / "p"),
                  "--quiet"])
    rows = [json.loads(line) for line in (tmp_path / "p" / "prompts.jsonl").read_text().splitlines()]
    assert rows == [{"messages": [{"role": "user", "content": q}]} for q in ("one question", "another question")]
    tokenizer = data_run.load_tokenizer(str(workdir / "target"))
    data = build_data(DataConfig(dataset=str(tmp_path / "p"), dataset_weight=0.0, target_weight=1.0,
                                 target_data_dir="d", num_eval_prompts=0), tokenizer)
    assert data.format == "prompts" and len(data.train) == 2


@pytest.mark.parametrize("flag, given, expected", [
    ("--categories", ["math", "coding"], [("math", o) for o in CATEGORY_OPENERS["math"][:1]]
     + [("coding", o) for o in CATEGORY_OPENERS["coding"][:1]]),
    ("--openers", "Translate into French:\n\nWrite a limerick about\n", [(None, "Translate into French:"),
                                                                         (None, "Write a limerick about")]),
    ("--openers", '{"opener": "Prove that", "category": "math"}\n{"opener": "Debug this:"}\n',
     [("math", "Prove that"), (None, "Debug this:")]),
])
def test_prompts_toward_categories_or_openers_carry_them_to_the_rows(workdir, tmp_path, monkeypatch, flag, given,
                                                                     expected):
    import specdistill.cli.data as command

    asked = []

    def scripted(target, tokenizer, out_dir, synthesis, **kwargs):
        asked.append(synthesis.openers)
        return [SynthesizedPrompt(f"{opener} then {i}", category) for i, (category, opener) in enumerate(expected)]

    monkeypatch.setattr(data_run, "synthesize_prompt_rows", scripted)
    if flag == "--openers":
        path = tmp_path / ("o.jsonl" if given.startswith("{") else "o.txt")
        path.write_text(given)
        given = [str(path)]
    command.main(["prompts", "--target", str(workdir / "target"), "--num", "2", "--out", str(tmp_path / "p"),
                  "--quiet", flag, *given])
    rows = [json.loads(line) for line in (tmp_path / "p" / "prompts.jsonl").read_text().splitlines()]
    assert asked[0][: len(expected)] == tuple(expected)
    assert [r.get("category") for r in rows] == [c for c, _ in expected]
    assert [r["messages"][0]["content"] for r in rows] == [f"{o} then {i}" for i, (_, o) in enumerate(expected)]


def test_prompts_given_to_exclude_are_handed_to_the_synthesis(workdir, tmp_path, monkeypatch):
    import specdistill.cli.data as command

    asked = []
    monkeypatch.setattr(data_run, "synthesize_prompt_rows",
                        lambda target, tokenizer, out_dir, synthesis, **k: asked.append(synthesis) or
                        [SynthesizedPrompt("a new question")])
    (tmp_path / "held.txt").write_text("What is 2 + 2?\nName a prime.\n")
    command.main(["prompts", "--target", str(workdir / "target"), "--num", "1", "--out", str(tmp_path / "p"),
                  "--quiet", "--exclude", str(tmp_path / "held.txt"), str(workdir / "chats.jsonl")])
    # a conversation's last user turn is its prompt
    assert asked[0].exclude == {"What is 2 + 2?", "Name a prime.", "and then?"} | {f"def f{i}(x):" for i in range(5)}


@pytest.mark.parametrize("argv, expected", [
    (["prompts", "--target", "TARGET", "--num", "2", "--out", "OUT", "--exclude", "missing.jsonl"], "missing.jsonl"),
    (["prompts", "--target", "TARGET", "--num", "2", "--out", "OUT", "--categories", "maths"],
     "unknown prompt category 'maths'; known: writing, qa, math"),
    (["prompts", "--target", "TARGET", "--num", "2", "--out", "OUT", "--openers", "missing.txt"], "cannot read it"),
    (["prompts", "--target", "TARGET", "--num", "2", "--out", "OUT", "--openers", "EMPTY"], "no openers in it"),
    (["prompts", "--target", "TARGET", "--num", "2", "--out", "OUT", "--openers", "BADJSONL"],
     'line 2 is not a JSON object with an "opener"'),
    (["prompts", "--target", "TARGET", "--num", "2", "--out", "OUT", "--openers", "BINARY"], "is not UTF-8 text"),
    (["prompts", "--target", "TARGET", "--num", "2", "--out", "OUT", "--categories", "math", "--openers", "EMPTY"],
     "not allowed with argument --categories"),
    (["responses", "--target", "TARGET", "--prompts", "missing.jsonl", "--out", "OUT"], "does not exist"),
    (["responses", "--target", "TARGET", "--prompts", "PROMPTS", "--out", "PROMPTS"], "is a file, not a folder"),
    (["prompts", "--target", "TARGET", "--num", "0", "--out", "OUT"], "--num must be >= 1"),
    (["prompts", "--target", "TARGET", "--num", "2", "--out", "OUT", "--temperature", "0"],
     "--temperature must be > 0"),
    (["responses", "--target", "TARGET", "--prompts", "PROMPTS", "--out", "OUT", "--temperature", "-1"],
     "--temperature must be >= 0"),
    (["prompts", "--target", "nowhere/model", "--num", "2", "--out", "OUT"], "nowhere/model"),
    (["respond", "--target", "TARGET"], "invalid choice: 'respond'"),
    (["responses", "--target", "TARGET", "--prompts", "PROMPTS", "--out", "OUT", "--engine", "vllm",
      "--vllm-python", "/no/python"], "/no/python does not exist"),
])
def test_bad_input_is_one_line(workdir, tmp_path, monkeypatch, capsys, argv, expected):
    (tmp_path / "empty.txt").write_text("\n  \n")
    (tmp_path / "bad.jsonl").write_text('{"opener": "Prove that"}\n{"category": "math"}\n')
    (tmp_path / "binary.txt").write_bytes(bytes(range(256)))
    subs = {"TARGET": str(workdir / "target"), "PROMPTS": str(workdir / "chats.jsonl"), "OUT": str(tmp_path / "o"),
            "EMPTY": str(tmp_path / "empty.txt"), "BADJSONL": str(tmp_path / "bad.jsonl"),
            "BINARY": str(tmp_path / "binary.txt")}
    monkeypatch.setattr(sys, "argv", ["specdistill-data", *[subs.get(a, a) for a in argv]])
    with pytest.raises(SystemExit) as exit_info:
        data_command.cli()
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 1 and "Traceback" not in err
    assert err.startswith(("specdistill-data: error: ", "specdistill-data prompts: error: "))  # the job's usage line
    assert expected in err and len(err.splitlines()) == 1, err


@pytest.mark.integration
def test_killed_with_sigkill_mid_turn_resumes_to_the_same_file(workdir, tmp_path):
    """A real process killed -9 right after its second shard (distill.outputs.checkpoints.crash_point), rerun."""
    import os
    import signal
    import subprocess

    from distill.outputs.checkpoints import KILL_ENV

    many = tmp_path / "many.jsonl"
    many.write_text("".join(json.dumps({"prompt": f"def g{i}(y):"}) + "\n" for i in range(40)))
    command = [sys.executable, "-m", "specdistill.cli.data", "responses", "--target", str(workdir / "target"),
               "--prompts", str(many), "--max-new-tokens", "4", "--batch-size", "4", "--shard-size", "8", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", KILL_ENV: "shard-written:2",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    killed = subprocess.run([*command, "--out", str(tmp_path / "cut")], env=env, capture_output=True, text=True,
                            timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    shards = sorted(p.name for p in (tmp_path / "cut" / ".specdistill" / "turn-0" / "shards").iterdir())
    assert shards == ["shard-00000", "shard-00001"] and not (tmp_path / "cut" / "train.jsonl").exists()
    data_command.main(command[3:] + ["--out", str(tmp_path / "cut")])
    data_command.main(command[3:] + ["--out", str(tmp_path / "whole")])
    assert (tmp_path / "cut" / "train.jsonl").read_text() == (tmp_path / "whole" / "train.jsonl").read_text()


@pytest.mark.parametrize("name", ["TERM", "USR1"])
def test_a_signal_stops_at_a_shard_boundary_and_the_same_command_resumes(workdir, tmp_path, name):
    """SIGTERM (a scheduler's preemption) right as the second shard is being finished: that shard is kept, the command
    exits 75 with one line, and running it again ends with the file of an uninterrupted run."""
    import os
    import subprocess

    from distill.outputs.checkpoints import KILL_ENV
    from distill.utils import PREEMPTED_EXIT, SIGNAL_ENV

    many = tmp_path / "many.jsonl"
    many.write_text("".join(json.dumps({"prompt": f"def g{i}(y):"}) + "\n" for i in range(40)))
    command = [sys.executable, "-m", "specdistill.cli.data", "responses", "--target", str(workdir / "target"),
               "--prompts", str(many), "--max-new-tokens", "4", "--batch-size", "4", "--shard-size", "8", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", KILL_ENV: "shard-written:2", SIGNAL_ENV: name,
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    stopped = subprocess.run([*command, "--out", str(tmp_path / "cut")], env=env, capture_output=True, text=True,
                             timeout=300)
    assert stopped.returncode == PREEMPTED_EXIT, stopped.stderr[-2000:]
    last = stopped.stderr.strip().splitlines()[-1]
    assert last.startswith(f"specdistill-data: stopped by SIG{name} after 2 of 5 target data shards, kept in "), last
    assert last.endswith("; run the same command again to resume") and "Traceback" not in stopped.stderr
    shards = sorted(p.name for p in (tmp_path / "cut" / ".specdistill" / "turn-0" / "shards").iterdir())
    assert shards == ["shard-00000", "shard-00001"] and not (tmp_path / "cut" / "train.jsonl").exists()
    data_command.main(command[3:] + ["--out", str(tmp_path / "cut")])
    data_command.main(command[3:] + ["--out", str(tmp_path / "whole")])
    assert (tmp_path / "cut" / "train.jsonl").read_text() == (tmp_path / "whole" / "train.jsonl").read_text()
