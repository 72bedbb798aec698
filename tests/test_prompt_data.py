"""Prompts alone as training input (data.format prompts) and prompts written by the target (Magpie,
data.synthesize_prompts): the rows they give, the errors users meet, and runs of the trainer on a tiny target."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from decode import autoregressive_generate
from distill.data.dataset import build_data
from distill.data.magpie import (
    CATEGORY_OPENERS,
    Synthesis,
    SynthesisError,
    SynthesizedPrompt,
    category_openers,
    synthesize_prompt_rows,
    synthesize_prompts,
    user_turn_prefix,
)
from distill.data.rows import IGNORE_INDEX, DataError
from distill.data.shard_store import CacheMismatchError
from distill.data.target_data import load_target_data
from distill.recipe.data_config import PROMPT_CATEGORIES
from specdistill.recipes import DataConfig, RecipeError

from helpers import cli_error
from helpers import run_train as run
from tiny import TINY_TEXT, tiny_model, tiny_tokenizer

VOCAB = 320
# <s>role\ncontent</s>\n per turn; the generation prompt is <s>assistant\n
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant\n{% endif %}")
QUESTIONS = [f"what does function number {i} return" for i in range(12)]
QUICK = ("train.max_steps=2", "train.logging_steps=1", "train.save_steps=2", "train.report_to=[]")


@pytest.fixture(scope="module")
def tokenizer():
    tok = tiny_tokenizer(VOCAB)
    tok.chat_template = CHAT_TEMPLATE
    return tok


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tokenizer) -> Path:
    """target/ (a tiny Llama with the chat tokenizer), prompts.jsonl, user_only.jsonl, prompts.txt."""
    root = tmp_path_factory.mktemp("prompt_data")
    tiny_model("llama", seed=0, vocab_size=VOCAB, hidden=32, layers=2).save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": q}) + "\n" for q in QUESTIONS))
    (root / "user_only.jsonl").write_text("".join(
        json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n" for q in QUESTIONS))
    (root / "prompts.txt").write_text("\n".join(QUESTIONS) + "\n")
    (root / "code.txt").write_text(TINY_TEXT)
    return root


def prompts_only(dataset: Path, **keys) -> DataConfig:
    return DataConfig(dataset=str(dataset), dataset_weight=0.0, target_weight=1.0, target_data_dir="unused",
                      num_eval_prompts=3, **keys)


def templated(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------------------------------------------------
# Prompts alone: the rows
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, keys", [("prompts.jsonl", {}), ("user_only.jsonl", {}),
                                        ("prompts.txt", {"format": "prompts"})])
def test_a_prompts_only_file_gives_one_untrained_templated_row_per_prompt(workdir, tokenizer, name, keys):
    data = build_data(prompts_only(workdir / name, **keys), tokenizer, seed=0)
    assert data.format == "prompts"
    assert len(data.train) == len(QUESTIONS) - 3 and len(data.eval_prompts) == 3
    expected = {tuple(templated(tokenizer, q)) for q in QUESTIONS}
    rows = [tuple(ids) for ids in data.train["input_ids"]] + [tuple(p.tolist()) for p in data.eval_prompts]
    assert set(rows) == expected  # every prompt once: trained on or held out, never both
    assert all(set(labels) == {IGNORE_INDEX} for labels in data.train["labels"])


def test_the_held_out_prompts_follow_the_seed(workdir, tokenizer):
    first = build_data(prompts_only(workdir / "prompts.jsonl"), tokenizer, seed=0).eval_prompts
    again = build_data(prompts_only(workdir / "prompts.jsonl"), tokenizer, seed=0).eval_prompts
    other = build_data(prompts_only(workdir / "prompts.jsonl"), tokenizer, seed=1).eval_prompts
    assert [p.tolist() for p in first] == [p.tolist() for p in again]
    assert [p.tolist() for p in first] != [p.tolist() for p in other]


def test_prompts_without_a_chat_template_are_raw_text(workdir):
    plain = tiny_tokenizer(VOCAB)
    cfg = DataConfig(dataset=str(workdir / "prompts.jsonl"), dataset_weight=0.0, target_weight=1.0,
                     target_data_dir="unused", num_eval_prompts=0)
    data = build_data(cfg, plain)
    assert sorted(data.train["input_ids"]) == sorted(plain(q)["input_ids"] for q in QUESTIONS)


def test_prompts_alone_with_dataset_weight_are_one_line_naming_the_fix(workdir, tokenizer):
    cfg = DataConfig(dataset=str(workdir / "prompts.jsonl"), num_eval_prompts=3)
    with pytest.raises(DataError, match="holds prompts alone .* data.dataset_weight=0 data.target_weight=1") as err:
        build_data(cfg, tokenizer)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("keys, key, allowed", [
    ({"dataset": None}, "data.dataset", "data.synthesize_prompts"),
    ({"dataset": "p.jsonl", "synthesize_prompts": 8}, "data.synthesize_prompts", "data.target_weight > 0"),
    ({"dataset": "p.txt", "format": "prompts"}, "data.dataset_weight", "0 with data.format prompts"),
    ({"dataset": None, "synthesize_prompts": 8, "target_weight": 1.0, "target_data_dir": "d"},
     "data.dataset_weight", "0 without data.dataset"),
    ({"dataset": "p.jsonl", "synthesize_categories": ["math"]}, "data.synthesize_categories",
     "null unless data.synthesize_prompts"),
    ({"dataset": "p.jsonl", "dataset_weight": 0, "synthesize_prompts": 8, "target_weight": 1.0,
      "target_data_dir": "d", "synthesize_categories": ["math", "maths"]}, "data.synthesize_categories",
     "'maths' is not one; did you mean 'math'?)"),
    ({"dataset": "p.jsonl", "dataset_weight": 0, "synthesize_prompts": 8, "target_weight": 1.0,
      "target_data_dir": "d", "synthesize_categories": ["zzz"]}, "data.synthesize_categories", "('zzz' is not one)"),
])
def test_prompt_settings_that_cannot_work_are_named(keys, key, allowed):
    with pytest.raises(RecipeError) as err:
        DataConfig(**keys)
    assert err.value.key == key and allowed in str(err.value)


# ---------------------------------------------------------------------------------------------------------------
# Magpie: prompts written by the target
# ---------------------------------------------------------------------------------------------------------------

def test_the_prefix_is_the_template_up_to_the_users_text(tokenizer):
    prefix = tokenizer.decode(user_turn_prefix(tokenizer))
    assert prefix == "<s>user\n"
    with pytest.raises(SynthesisError, match="no chat template"):
        user_turn_prefix(tiny_tokenizer(VOCAB))


class ScriptedEngine:
    """A ResponseEngine writing, for seed s, question s % 5 (duplicates), unfinished (no eos) when s % 4 == 3."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls, self.prompts = tokenizer, [], {}

    def generate_responses(self, prompts, seeds, sampling, batch_size):
        self.calls.append(list(seeds))
        self.prompts.update((seed, self.tokenizer.decode(list(p))) for seed, p in zip(seeds, prompts))
        out = []
        for seed in seeds:
            ids = self.tokenizer(f" question {seed % 5} ", add_special_tokens=False)["input_ids"]
            out.append(ids if seed % 4 == 3 else ids + [self.tokenizer.eos_token_id])
        return out


def test_synthesis_keeps_finished_distinct_prompts_and_rereads_them(tmp_path, tokenizer):
    engine, target = ScriptedEngine(tokenizer), tiny_model("llama", vocab_size=VOCAB, hidden=32, layers=2)
    made = synthesize_prompts(target, tokenizer, tmp_path / "p", Synthesis(count=4, seed=0), engine=engine,
                              progress=False)
    # seeds 0, 1, 2 finish (questions 0, 1, 2), 3 does not, 4 gives question 4: the first round (5 seeds) has 4
    assert made == ["question 0", "question 1", "question 2", "question 4"] and engine.calls == [[0, 1, 2, 3, 4]]
    assert synthesize_prompts(target, tokenizer, tmp_path / "p", Synthesis(count=4, seed=0), engine=engine,
                              progress=False) == made
    assert len(engine.calls) == 1  # read back, nothing generated


def test_synthesis_asks_again_for_the_prompts_still_missing(tmp_path, tokenizer):
    engine, target = ScriptedEngine(tokenizer), tiny_model("llama", vocab_size=VOCAB, hidden=32, layers=2)
    made = synthesize_prompts(target, tokenizer, tmp_path / "p", Synthesis(count=5, seed=0), engine=engine,
                              progress=False)
    # round 0: seeds 0..6 give 0, 1, 2, 4 (5 and 6 repeat 0 and 1); round 1: 2 more candidates with seeds 7, 8
    assert engine.calls == [list(range(7)), [7, 8]] and made[4] == "question 3"  # seed 8 -> question 3


def test_openers_take_turns_over_all_rounds_and_begin_the_kept_prompts(tmp_path, tokenizer):
    engine, target = ScriptedEngine(tokenizer), tiny_model("llama", vocab_size=VOCAB, hidden=32, layers=2)
    openers = (("ask", "Tell me"), ("explain", "Explain"))
    made = synthesize_prompt_rows(target, tokenizer, tmp_path / "p", Synthesis(count=9, seed=0, openers=openers),
                                  engine=engine, progress=False)
    # round 0: seeds 0..11 give 8 distinct (3, 7, 11 unfinished; 10 repeats 0 with the same opener): round 1 asks 2
    assert engine.calls == [list(range(12)), [12, 13]]
    assert all(prompt == "<s>user\n" + openers[seed % 2][1] for seed, prompt in engine.prompts.items())
    assert [(m.category, m.text) for m in made[:3]] == [("ask", "Tell me question 0"),
                                                       ("explain", "Explain question 1"), ("ask", "Tell me question 2")]
    assert len(made) == 9 and made[-1] == SynthesizedPrompt("Explain question 3", "explain")  # seed 13
    assert synthesize_prompts(target, tokenizer, tmp_path / "p", Synthesis(count=9, seed=0, openers=openers),
                              engine=engine, progress=False) == [m.text for m in made]
    assert len(engine.calls) == 2  # read back
    with pytest.raises(CacheMismatchError):  # other openers: other prompts
        synthesize_prompts(target, tokenizer, tmp_path / "p", Synthesis(count=9, seed=0, openers=openers[::-1]),
                           engine=engine, progress=False)


def test_excluded_prompts_are_never_kept_and_are_replaced(tmp_path, tokenizer):
    engine, target = ScriptedEngine(tokenizer), tiny_model("llama", vocab_size=VOCAB, hidden=32, layers=2)
    made = synthesize_prompts(target, tokenizer, tmp_path / "p",
                              Synthesis(count=4, seed=0, exclude=frozenset({"  Question 1 "})),
                              engine=engine, progress=False)
    # seeds 0..4: 0, (1 excluded), 2, (3 unfinished), 4; seeds 5, 6: repeats; seeds 7 (unfinished), 8: question 3
    assert made == ["question 0", "question 2", "question 4", "question 3"]
    assert engine.calls == [[0, 1, 2, 3, 4], [5, 6], [7, 8]]


def test_category_openers_interleave_the_categories_and_name_an_unknown_one():
    pairs = category_openers(["math", "coding"])
    assert [c for c, _ in pairs[:4]] == ["math", "coding", "math", "coding"]
    assert {o for c, o in pairs if c == "math"} == set(CATEGORY_OPENERS["math"])
    assert tuple(CATEGORY_OPENERS) == PROMPT_CATEGORIES  # what a recipe may name is what has openers
    assert {c for c, _ in category_openers(["all"])} == set(CATEGORY_OPENERS) and len(CATEGORY_OPENERS) == 8
    assert category_openers(["math", "all"]) == category_openers(["all"])
    assert all(not o[-1].isspace() for openers in CATEGORY_OPENERS.values() for o in openers)
    with pytest.raises(SynthesisError, match="unknown prompt category 'maths'.*; did you mean 'math'\\?$"):
        category_openers(["math", "maths"])
    with pytest.raises(SynthesisError, match=r"unknown prompt category 'cod'.*\(or all\); did you mean 'coding'\?$"):
        category_openers(["cod"])
    with pytest.raises(SynthesisError, match=r"unknown prompt category 'zzz'; known: .* \(or all\)$"):
        category_openers(["zzz"])


def test_synthesized_prompts_of_other_settings_are_refused(tmp_path, tokenizer):
    engine, target = ScriptedEngine(tokenizer), tiny_model("llama", vocab_size=VOCAB, hidden=32, layers=2)
    synthesize_prompts(target, tokenizer, tmp_path / "p", Synthesis(count=2, seed=0), engine=engine, progress=False)
    with pytest.raises(CacheMismatchError, match="temperature"):
        synthesize_prompts(target, tokenizer, tmp_path / "p", Synthesis(count=2, seed=0, temperature=0.5),
                           engine=engine, progress=False)


# ---------------------------------------------------------------------------------------------------------------
# Runs of the trainer
# ---------------------------------------------------------------------------------------------------------------

def greedy(target, prompt: list[int], max_new_tokens: int) -> list[int]:
    return autoregressive_generate(target, torch.tensor([prompt]), max_new_tokens=max_new_tokens,
                                   eos_token_id=2).new_tokens


@pytest.mark.integration
def test_a_prompts_only_jsonl_trains_on_the_targets_answers(workdir, tokenizer, rows_seen):
    responses = workdir / "responses"
    run(workdir, "from_prompts", f"data.dataset={workdir / 'prompts.jsonl'}", "data.format=auto",
        "data.dataset_weight=0", "data.target_weight=1", f"data.target_data_dir={responses}",
        "data.target_max_new_tokens=6", "data.num_eval_prompts=3", "eval.gammas=[2]", *QUICK)
    target = AutoModelForCausalLM.from_pretrained(workdir / "target").eval()
    answers = load_target_data(responses)
    rows = rows_seen[0]
    assert len(rows) == len(answers) == len(QUESTIONS) - 3
    for row, answer in zip(rows, answers):
        prompt = answer["prompt_ids"]
        assert tuple(prompt) in {tuple(templated(tokenizer, q)) for q in QUESTIONS}
        assert answer["response_ids"] == greedy(target, prompt, 6) and answer["response_ids"]
        assert row["input_ids"] == prompt + answer["response_ids"]
        assert row["labels"] == [IGNORE_INDEX] * len(prompt) + answer["response_ids"]


@pytest.mark.integration
def test_synthesized_prompts_alone_make_the_rows_and_the_acceptance_prompts(workdir, tokenizer, rows_seen,
                                                                           monkeypatch):
    import distill.data.magpie as magpie
    import distill.data.sources as sources

    made = [f"question {i}" for i in range(10)]
    monkeypatch.setattr(magpie, "generate_target_data", lambda *a, **k: pytest.fail("not replaced"))

    def scripted(target, tok, out_dir, synthesis, **kwargs):
        assert synthesis.count == 8 + 2 and Path(out_dir) == workdir / "synth" / "prompts"
        assert synthesis.openers == magpie.category_openers(["math", "coding"])
        return [magpie.SynthesizedPrompt(text, ("math", "coding")[i % 2]) for i, text in enumerate(made)]

    monkeypatch.setattr(sources, "synthesize_prompt_rows", scripted)
    out = run(workdir, "synthesized", "data.dataset=null", "data.synthesize_prompts=8", "data.dataset_weight=0",
              "data.synthesize_categories=[math,coding]",
              "data.target_weight=1", f"data.target_data_dir={workdir / 'synth'}", "data.target_max_new_tokens=4",
              "data.num_eval_prompts=2", "eval.gammas=[2]", *QUICK)
    answers = load_target_data(workdir / "synth")
    assert len(rows_seen[0]) == len(answers) == 8
    asked = {tuple(p) for p in answers["prompt_ids"]}
    assert asked < {tuple(templated(tokenizer, q)) for q in made}
    measured = [json.loads(line) for line in (out / "acceptance.jsonl").read_text().splitlines()]
    assert measured and all(m["num_prompts"] == 2 for m in measured)
    assert all(set(m["by_category"]) <= {"math", "coding"} and m["by_category"] for m in measured)


@pytest.mark.integration
def test_synthesized_prompts_never_repeat_the_held_out_prompts_file(workdir, monkeypatch):
    import distill.data.sources as sources

    excluded = []

    def scripted(target, tok, out_dir, synthesis, **kwargs):
        excluded.append(synthesis.exclude)
        return [SynthesizedPrompt(f"question {i}") for i in range(8)]

    monkeypatch.setattr(sources, "synthesize_prompt_rows", scripted)
    run(workdir, "synthesized_held_out", "data.dataset=null", "data.synthesize_prompts=8", "data.dataset_weight=0",
        "data.target_weight=1", f"data.target_data_dir={workdir / 'synth_held_out'}", "data.target_max_new_tokens=4",
        f"data.eval_prompts={workdir / 'prompts.txt'}", "data.num_eval_prompts=2", "eval.gammas=[2]", *QUICK)
    assert excluded == [frozenset(QUESTIONS)]  # the whole file, not only the num_eval_prompts measured


def test_synthesis_without_a_chat_template_is_one_line(workdir, monkeypatch, capsys, tmp_path):
    plain = tmp_path / "plain"
    tiny_model("llama", vocab_size=VOCAB, hidden=32, layers=2).save_pretrained(plain)
    tiny_tokenizer(VOCAB).save_pretrained(plain)
    line = cli_error(monkeypatch, capsys, str(Path(__file__).parents[1] / "recipes" / "tiny_distill.yaml"),
                     f"model.target={plain}", "data.dataset=null", "data.synthesize_prompts=4",
                     "data.dataset_weight=0", "data.target_weight=1", f"data.target_data_dir={tmp_path / 'd'}",
                     f"train.output_dir={tmp_path / 'out'}", *QUICK)
    assert "no chat template" in line
