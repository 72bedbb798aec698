"""decode.inputs.prompts: chat-template rendering (single and multi-turn), categories, and prompts from
dataset folders."""
import json

import datasets
import pytest

from decode.inputs.loading import LoadError
from decode.inputs.prompts import (
    PromptFields,
    PromptRow,
    encode_prompt_rows,
    raw_prompts_note,
    read_prompt_rows,
    render_prompt,
)
from scripts.quickstart_tokenizer import CHAT_TEMPLATE

from tiny import tiny_tokenizer


@pytest.fixture(scope="module")
def plain():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def chat():
    tok = tiny_tokenizer()
    tok.chat_template = CHAT_TEMPLATE  # <|role|>\n content eos per turn; generation prompt <|assistant|>\n
    return tok


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def decoded(tok, ids):
    return tok.decode(ids, skip_special_tokens=False)


USER = {"role": "user", "content": "def add(a, b):"}


def test_single_turn_is_rendered_with_the_template_and_its_generation_prompt(chat, tmp_path):
    (row,) = read_prompt_rows(write_jsonl(tmp_path / "p.jsonl", [{"messages": [USER]}]))
    text, templated = render_prompt(chat, row, "auto")
    assert templated and text == "<|user|>\ndef add(a, b):</s><|assistant|>\n"
    (ids,) = encode_prompt_rows(chat, [row], "auto")
    assert ids.tolist() == chat(text, add_special_tokens=False)["input_ids"]  # the template's tokens, none added


def test_multi_turn_keeps_the_rows_answers_and_drops_what_follows_the_last_user_turn(chat, tmp_path):
    conversation = [{"role": "system", "content": "be brief"}, USER, {"role": "assistant", "content": "a + b"},
                    {"role": "user", "content": "and minus?"}, {"role": "assistant", "content": "REFERENCE"}]
    (row,) = read_prompt_rows(write_jsonl(tmp_path / "p.jsonl", [{"messages": conversation}]))
    assert [m["role"] for m in row.messages] == ["system", "user", "assistant", "user"]
    (ids,) = encode_prompt_rows(chat, [row], "auto")
    assert decoded(chat, ids) == ("<|system|>\nbe brief</s><|user|>\ndef add(a, b):</s><|assistant|>\na + b</s>"
                                  "<|user|>\nand minus?</s><|assistant|>\n")
    # the user's turns without answers (MT-bench / Spec-Bench 'turns'): the first turn only
    (turns,) = read_prompt_rows(write_jsonl(tmp_path / "t.jsonl", [{"turns": ["first?", "second?"]}]),
                                PromptFields(messages_field="turns"))
    assert turns.messages == ({"role": "user", "content": "first?"},)


def test_modes_auto_on_off(chat, plain):
    text_row, conversation = PromptRow(text="import os"), PromptRow(messages=(USER, ))
    assert render_prompt(chat, text_row, "auto") == ("import os", False)  # auto: conversations only
    assert render_prompt(chat, text_row, "on") == ("<|user|>\nimport os</s><|assistant|>\n", True)
    assert render_prompt(chat, conversation, "off") == ("def add(a, b):", False)
    assert render_prompt(plain, conversation, "auto") == ("def add(a, b):", False)  # no template: raw text
    (ids,) = encode_prompt_rows(plain, [text_row], "auto", max_prompt_tokens=2)
    assert ids.tolist() == plain("import os")["input_ids"][-2:]
    with pytest.raises(LoadError, match=r"--chat-template on, but tokenizer .* has no chat template"):
        encode_prompt_rows(plain, [text_row], "on")


def test_auto_names_the_plain_prompts_it_gives_a_chat_model_raw(chat, plain):
    text_row, conversation = PromptRow(text="import os"), PromptRow(messages=(USER, ))
    note = raw_prompts_note(chat, [text_row, conversation, text_row], "auto")
    assert note.startswith("note: 2 of 3 prompts are plain text") and "--chat-template on" in note
    assert "\n" not in note
    assert raw_prompts_note(chat, [text_row], "on") is None and raw_prompts_note(chat, [text_row], "off") is None
    assert raw_prompts_note(chat, [conversation], "auto") is None  # conversations are templated
    assert raw_prompts_note(plain, [text_row], "auto") is None  # no template to apply


def test_categories_and_fields(tmp_path):
    rows = read_prompt_rows(write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "a", "category": "code"}, {"messages": [USER], "category": "chat"}, {"prompt": "b"}]))
    assert [(r.text, r.is_conversation, r.category) for r in rows] == [
        ("a", False, "code"), (None, True, "chat"), ("b", False, None)]
    nested = write_jsonl(tmp_path / "wmt.jsonl", [{"translation": {"de": "Hallo Welt", "en": "Hello world"}}])
    (row,) = read_prompt_rows(nested, PromptFields(prompt_field="translation.de"))
    assert row.text == "Hallo Welt"
    with pytest.raises(LoadError, match=r"p.jsonl:3: no category field 'category' \(found: prompt\)"):
        read_prompt_rows(tmp_path / "p.jsonl", PromptFields(category_field="category"))
    with pytest.raises(LoadError, match=r"bad.jsonl:1: the conversation has no user turn"):
        read_prompt_rows(write_jsonl(tmp_path / "bad.jsonl", [{"messages": [{"role": "assistant", "content": "x"}]}]))
    with pytest.raises(LoadError, match=r"x.jsonl:1: each line needs a list field 'turns' \(found: prompt\)"):
        read_prompt_rows(write_jsonl(tmp_path / "x.jsonl", [{"prompt": "a"}]), PromptFields(messages_field="turns"))


def test_a_prompt_in_another_field_is_answered_with_the_callers_flag(tmp_path):
    """A row whose prompt is under another name: a caller with a field flag (eval, data responses) names it with
    the row's first string field; the trainer, which has none, says what the row holds; with the flag it reads."""
    path = write_jsonl(tmp_path / "t.jsonl", [{"id": 3, "text": "def add(a, b):", "note": ""}])
    with pytest.raises(LoadError, match=r"t.jsonl:1: each line needs a string field 'prompt' \(found: id, text, "
                                        r"note\); a conversation needs a list field 'messages'; --prompt-field text "
                                        r"reads its 'text' field$"):
        read_prompt_rows(path, PromptFields(prompt_flag="--prompt-field"))
    with pytest.raises(LoadError, match=r"found: id, text, note\); a conversation needs a list field 'messages'$"):
        read_prompt_rows(path)
    (row,) = read_prompt_rows(path, PromptFields(prompt_field="text", prompt_flag="--prompt-field"))
    assert row.text == "def add(a, b):"


def test_eval_and_data_name_the_prompt_field_flag(tmp_path, capsys):
    from specdistill.cli import data as data_cli
    from specdistill.cli import eval as eval_cli

    path = write_jsonl(tmp_path / "t.jsonl", [{"text": "a"}])
    with pytest.raises(LoadError, match="--prompt-field text reads its 'text' field"):
        eval_cli.main(["--target", "t", "--draft", "d", "--prompts", str(path)])
    with pytest.raises(SystemExit):
        data_cli.cli(["responses", "--target", "t", "--prompts", str(path), "--out", str(tmp_path / "out")])
    assert "--prompt-field text reads its 'text' field" in capsys.readouterr().err


def test_empty_prompts_are_skipped_and_said(tmp_path, caplog):
    """A row whose prompt is empty or blank is not measured, and the skip is said (the run measures fewer prompts
    than the file holds): one warning with the count; a file of nothing else is one error line."""
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}, {"prompt": ""}, {"prompt": "  "}, {"prompt": "b"}])
    with caplog.at_level("WARNING", logger="decode.inputs.prompts"):
        rows = read_prompt_rows(path)
    assert [r.text for r in rows] == ["a", "b"]
    assert [r.getMessage() for r in caplog.records] == [f"{path}: 2 empty prompts skipped (2 kept)"]
    caplog.clear()
    read_prompt_rows(write_jsonl(tmp_path / "full.jsonl", [{"prompt": "a"}]))
    assert not caplog.records
    with pytest.raises(LoadError, match="contains no prompts"):
        read_prompt_rows(write_jsonl(tmp_path / "none.jsonl", [{"prompt": ""}]))


def test_dataset_folders_load_through_datasets_like_a_hub_id(tmp_path):
    rows = [{"question": f"q{i}", "subject": "math" if i % 2 else "qa", "other": i} for i in range(5)]
    # a folder of data files: datasets.load_dataset(folder, split=...), the call a hub id goes through
    (tmp_path / "hubish").mkdir()
    write_jsonl(tmp_path / "hubish" / "test.jsonl", rows)
    got = read_prompt_rows(str(tmp_path / "hubish"), PromptFields(prompt_field="question", category_field="subject"),
                           split="test", limit=4)
    assert [(r.text, r.category) for r in got] == [("q0", "qa"), ("q1", "math"), ("q2", "qa"), ("q3", "math")]
    # a folder written by save_to_disk, with splits
    datasets.DatasetDict({"validation": datasets.Dataset.from_list(rows)}).save_to_disk(tmp_path / "saved")
    got = read_prompt_rows(str(tmp_path / "saved"), PromptFields(prompt_field="question"), split="validation")
    assert [r.text for r in got] == [f"q{i}" for i in range(5)] and got[0].category is None
    with pytest.raises(LoadError, match=r"has no split 'test' \(splits: validation\)"):
        read_prompt_rows(str(tmp_path / "saved"), split="test")
    with pytest.raises(LoadError, match=r"--prompt-field 'query' is not a column .* \(columns: question, subject, "
                                        r"other\)"):
        read_prompt_rows(str(tmp_path / "hubish"), PromptFields(prompt_field="query"), split="test")
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "p.parquet"))  # a data file, not a .jsonl
    assert [r.category for r in read_prompt_rows(tmp_path / "p.parquet", PromptFields(
        prompt_field="question", category_field="subject"), limit=2)] == ["qa", "math"]
    with pytest.raises(LoadError, match="prompts file .*missing.jsonl' does not exist"):
        read_prompt_rows(str(tmp_path / "missing.jsonl"))
