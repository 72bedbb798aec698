"""Data: packing of text, assistant-only labels for chat, acceptance prompts, and the errors users will meet."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distill.data.dataset import build_data
from distill.data.rows import (
    IGNORE_INDEX,
    DataError,
    DistillCollator,
    chat_example,
    eval_prompts,
    local_data_files,
    padding_id,
    read_eval_prompts,
)
from specdistill.recipes import DataConfig

from tiny import tiny_tokenizer

# A minimal chat template: <s>role\ncontent</s>\n per turn; the generation prompt is <s>assistant\n.
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
DOCS = ["def add(a, b):\n    return a + b", "class Point:\n    pass", "import os\nprint(os.path.join('a', 'b'))",
        "for i in range(10):\n    print(i, i * i)"] * 6


@pytest.fixture(scope="module")
def tokenizer():
    tok = tiny_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def conversation(i: int) -> list[dict]:
    return [{"role": "user", "content": f"write {i}"}, {"role": "assistant", "content": DOCS[i % 4]},
            {"role": "user", "content": "again"}, {"role": "assistant", "content": DOCS[(i + 1) % 4]}]


def test_text_is_packed_into_full_blocks_of_the_documents_plus_eos(tmp_path, tokenizer):
    path = jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in DOCS])
    data = build_data(DataConfig(dataset=str(path), max_length=16, num_eval_prompts=0), tokenizer)
    assert data.format == "text" and data.eval_prompts == []
    stream = [t for d in DOCS for t in tokenizer(d)["input_ids"] + [tokenizer.eos_token_id]]
    blocks = data.train["input_ids"]
    assert all(len(b) == 16 for b in blocks) and len(blocks) == len(stream) // 16
    assert [t for b in blocks for t in b] == stream[: len(blocks) * 16]
    assert data.train["labels"] == blocks


def test_chat_labels_cover_exactly_the_assistant_turns(tokenizer):
    messages = conversation(0)
    example = chat_example(messages, tokenizer, max_length=512)
    ids, labels = example["input_ids"], example["labels"]
    assert ids == tokenizer(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)[
        "input_ids"]
    kept = [t for t in labels if t != IGNORE_INDEX]
    # each assistant reply followed by the template's end-of-turn "</s>\n", nothing of the user turns
    assert tokenizer.decode(kept) == f"{DOCS[0]}</s>\n{DOCS[1]}</s>\n"
    assert all(label in (IGNORE_INDEX, token) for label, token in zip(labels, ids))
    assert labels[0] == IGNORE_INDEX and "write 0" not in tokenizer.decode(kept)


def test_chat_rows_are_truncated_and_rows_without_assistant_tokens_dropped(tmp_path, tokenizer):
    rows = [{"messages": conversation(i)} for i in range(6)] + [
        {"messages": [{"role": "user", "content": "no reply"}]}]
    cfg = DataConfig(dataset=str(jsonl(tmp_path / "chat.jsonl", rows)), max_length=24, num_eval_prompts=2)
    data = build_data(cfg, tokenizer)
    assert data.format == "chat"
    assert all(len(chat_example(r["messages"], tokenizer, 10_000)["input_ids"]) > 24 for r in rows[:6])
    assert [len(ids) for ids in data.train["input_ids"]] == [24] * len(data.train)
    assert all(any(t != IGNORE_INDEX for t in labels) for labels in data.train["labels"])
    assert len(data.train) <= 5  # 7 rows - 2 held out, minus any left without an assistant token


def test_chat_eval_prompts_end_with_the_generation_prompt(tmp_path, tokenizer):
    rows = [{"messages": conversation(i)} for i in range(8)]
    cfg = DataConfig(dataset=str(jsonl(tmp_path / "chat.jsonl", rows)), num_eval_prompts=3, eval_prompt_tokens=64)
    prompts = build_data(cfg, tokenizer, seed=1).eval_prompts
    assert len(prompts) == 3
    for prompt in prompts:
        text = tokenizer.decode(prompt)
        assert text.startswith("<s>user\nwrite ") and text.endswith("</s>\n<s>assistant\n")


def test_prompts_from_a_file_become_user_turns_in_chat_format(tokenizer):
    (chat,) = eval_prompts(["def add"], "chat", tokenizer, max_tokens=64)
    assert tokenizer.decode(chat) == "<s>user\ndef add</s>\n<s>assistant\n"
    (text,) = eval_prompts(["def add(a, b):"], "text", tokenizer, max_tokens=3)
    assert text.tolist() == tokenizer("def add(a, b):")["input_ids"][:3]


def test_eval_prompt_file_with_conversations_and_categories_follows_eval_chat_template(tmp_path, tokenizer):
    """The trainer's acceptance prompts go through decode.inputs.prompts, as specdistill-eval's do."""
    prompts = jsonl(tmp_path / "p.jsonl", [
        {"messages": [{"role": "user", "content": "write 1"}, {"role": "assistant", "content": "x = 1"},
                      {"role": "user", "content": "again"}], "category": "chat"},
        {"prompt": "def add", "category": "code"}])
    docs = jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in DOCS])
    cfg = DataConfig(dataset=str(docs), max_length=8, eval_prompts=str(prompts), eval_prompt_tokens=64)
    data = build_data(cfg, tokenizer)  # text format, eval.chat_template auto: the conversation only is templated
    assert data.eval_categories == ["chat", "code"]
    assert tokenizer.decode(data.eval_prompts[0]) == ("<s>user\nwrite 1</s>\n<s>assistant\nx = 1</s>\n"
                                                      "<s>user\nagain</s>\n<s>assistant\n")
    assert tokenizer.decode(data.eval_prompts[1]) == "def add"
    on = build_data(cfg, tokenizer, chat_template="on")
    assert tokenizer.decode(on.eval_prompts[1]) == "<s>user\ndef add</s>\n<s>assistant\n"
    off = build_data(cfg, tokenizer, chat_template="off")
    assert tokenizer.decode(off.eval_prompts[0]) == "write 1\n\nx = 1\n\nagain"
    with pytest.raises(DataError, match="eval.chat_template on, but tokenizer .* has no chat template"):
        build_data(cfg, tiny_tokenizer(), chat_template="on")


def test_held_out_text_prompts_are_truncated_and_never_trained_on(tmp_path, tokenizer):
    docs = [f"{chr(97 + i) * 3} = {i}\n" + DOCS[i % 4] for i in range(12)]  # unique first characters
    path = jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in docs])
    data = build_data(DataConfig(dataset=str(path), max_length=8, num_eval_prompts=3, eval_prompt_tokens=5),
                      tokenizer)
    assert len(data.eval_prompts) == 3 and all(p.dtype == torch.long and p.numel() == 5 for p in data.eval_prompts)
    held_out = {tokenizer.decode(p) for p in data.eval_prompts}
    train_text = tokenizer.decode([t for b in data.train["input_ids"] for t in b])
    assert len(held_out) == 3
    for prefix in held_out:
        assert f"{prefix[:3]} = " not in train_text and f"{prefix[:3]} = " in "".join(docs)


def test_prompt_files(tmp_path, tokenizer):
    rows = read_eval_prompts(str(jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}, {"prompt": "b c"}])))
    assert [r.text for r in rows] == ["a", "b c"]
    (tmp_path / "p.txt").write_text("one\n\ntwo\n")
    assert [r.text for r in read_eval_prompts(str(tmp_path / "p.txt"))] == ["one", "two"]
    with pytest.raises(DataError, match=r"bad.jsonl:1: each line needs a string field 'prompt' \(found: text\)"):
        read_eval_prompts(str(jsonl(tmp_path / "bad.jsonl", [{"text": "a"}])))
    with pytest.raises(DataError, match="data.eval_prompts: prompts file .*missing.jsonl' does not exist"):
        read_eval_prompts(str(tmp_path / "missing.jsonl"))


def test_local_files_folders_and_globs(tmp_path):
    (tmp_path / "a.txt").write_text("x\n")
    (tmp_path / "b.txt").write_text("y\n")
    assert local_data_files(str(tmp_path / "a.txt")) == ("text", [str(tmp_path / "a.txt")])
    assert local_data_files(str(tmp_path)) == ("text", [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")])
    assert local_data_files(str(tmp_path / "*.txt"))[1] == [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    assert local_data_files("HuggingFaceH4/ultrachat_200k") is None
    (tmp_path / "c.jsonl").write_text("{}\n")
    with pytest.raises(DataError, match="one kind"):
        local_data_files(str(tmp_path))


def test_missing_dataset_file_is_named(tmp_path, tokenizer):
    missing = tmp_path / "nowhere" / "train.jsonl"
    with pytest.raises(DataError, match=f"file not found: {missing}"):
        build_data(DataConfig(dataset=str(missing)), tokenizer)
    with pytest.raises(DataError, match="no file matches"):
        build_data(DataConfig(dataset=str(tmp_path / "*.parquet")), tokenizer)


def test_missing_field_is_named_with_the_available_columns(tmp_path, tokenizer):
    path = jsonl(tmp_path / "d.jsonl", [{"content": "x", "id": 1}] * 5)
    with pytest.raises(DataError, match=r"data\.text_field: column 'text' .* available columns: content, id"):
        build_data(DataConfig(dataset=str(path)), tokenizer)
    with pytest.raises(DataError, match=r"data\.messages_field: column 'messages'"):
        build_data(DataConfig(dataset=str(path), format="chat"), tokenizer)
    # prompts alone read as text (a recipe that says format: text): the line says how the target answers them
    prompts = jsonl(tmp_path / "p.jsonl", [{"prompt": "x"}] * 5)
    with pytest.raises(DataError, match=r"available columns: prompt; it holds prompts: data\.format=prompts "
                                        r"data\.dataset_weight=0 data\.target_weight=1 data\.target_data_dir=DIR"):
        build_data(DataConfig(dataset=str(prompts), format="text"), tokenizer)


def test_no_usable_rows(tmp_path, tokenizer):
    short = jsonl(tmp_path / "short.jsonl", [{"text": "a b"}, {"text": ""}, {"text": "c"}])
    with pytest.raises(DataError, match=r"no usable rows .* 1024-token block"):
        build_data(DataConfig(dataset=str(short), num_eval_prompts=0), tokenizer)
    no_reply = jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}] * 3)
    with pytest.raises(DataError, match="no usable rows .* assistant token .* data.dataset_weight=0"):
        build_data(DataConfig(dataset=str(no_reply), num_eval_prompts=0, format="chat"), tokenizer)
    # format auto sees prompts alone and says how to have the target answer them (tests/test_prompt_data.py)
    with pytest.raises(DataError, match="holds prompts alone .* data.dataset_weight=0 data.target_weight=1"):
        build_data(DataConfig(dataset=str(no_reply), num_eval_prompts=0), tokenizer)
    with pytest.raises(DataError, match="cannot hold out 16 prompts from 3 rows"):
        build_data(DataConfig(dataset=str(short)), tokenizer)


def test_padding_falls_back_to_eos(tokenizer):
    assert padding_id(tokenizer) == tokenizer.pad_token_id == 0
    no_pad = tiny_tokenizer()
    no_pad.pad_token = None
    assert padding_id(no_pad) == no_pad.eos_token_id == 2


def test_collator_pads_right_with_ignored_labels():
    batch = DistillCollator(pad_token_id=0)([{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]},
                                             {"input_ids": [8], "labels": [8]}])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


def test_collator_with_every_token_labels_the_prompts_too_but_never_the_padding():
    rows = [{"input_ids": [5, 6, 7], "labels": [-100, -100, 7]}, {"input_ids": [8, 9], "labels": [-100, 9]}]
    batch = DistillCollator(pad_token_id=0, every_token=True)(rows)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 9, 0]]
    assert batch["labels"].tolist() == [[5, 6, 7], [8, 9, -100]]
    assert rows[0]["labels"] == [-100, -100, 7]  # the rows keep their prompts' masks (held-in prompts read them)
