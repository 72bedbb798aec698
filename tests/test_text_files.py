"""A .txt corpus is read as text: the packed stream is the tokenizer's encoding of each file, one eos after it."""
from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import processors

from distill.data import text_files
from distill.data.dataset import build_data
from distill.data.rows import DataError
from specdistill.recipes import DataConfig, RecipeError

from tiny import TINY_TEXT, tiny_tokenizer

# line breaks, blank lines, indentation, trailing spaces and a final line without a newline: all must survive
TEXT_A = TINY_TEXT + "x = 1   \n\n\n    y = [\n  2 ]\nend without newline"
TEXT_B = "import json\n\nprint(json.dumps({'a': 1}))\n" * 20


@pytest.fixture(scope="module")
def tokenizer():
    """The tiny BPE with a post-processor that puts <s> before every encoded text, as Llama's does."""
    tok = tiny_tokenizer()
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)])
    return tok


def stream(tmp_path: Path, dataset: str, tokenizer, max_length: int = 16, **keys) -> list[int]:
    cfg = DataConfig(dataset=dataset, format="text", max_length=max_length, num_eval_prompts=0, **keys)
    return [t for row in build_data(cfg, tokenizer).train["input_ids"] for t in row]


def encoded_file(text: str, tokenizer) -> list[int]:
    return tokenizer(text, add_special_tokens=True)["input_ids"] + [tokenizer.eos_token_id]


def cut(ids: list[int], max_length: int) -> list[int]:
    return ids[: len(ids) // max_length * max_length]


def test_a_txt_file_is_its_own_encoding(tmp_path, tokenizer):
    (tmp_path / "a.txt").write_text(TEXT_A)
    expected = encoded_file(TEXT_A, tokenizer)
    assert expected[0] == tokenizer.bos_token_id and expected.count(tokenizer.eos_token_id) == 1
    got = stream(tmp_path, str(tmp_path / "a.txt"), tokenizer)
    assert got == cut(expected, 16)
    assert tokenizer.decode(got, skip_special_tokens=True) == TEXT_A[: len(tokenizer.decode(got[1:]))]


def test_large_file_read_in_pieces_changes_the_stream_only_where_pieces_meet(tmp_path, tokenizer, monkeypatch):
    (tmp_path / "a.txt").write_text(TEXT_A)
    monkeypatch.setattr(text_files, "TEXT_PIECE_CHARS", 300)
    pieces = list(text_files.read_pieces(str(tmp_path / "a.txt"), 300))
    assert len(pieces) > 3 and "".join(pieces) == TEXT_A and all(p.endswith("\n") for p in pieces[:-1])
    expected = (tokenizer(pieces[0])["input_ids"]  # <s> only where the file starts, eos only where it ends
                + [t for p in pieces[1:] for t in tokenizer(p, add_special_tokens=False)["input_ids"]]
                + [tokenizer.eos_token_id])
    got = stream(tmp_path, str(tmp_path / "a.txt"), tokenizer)
    assert got == cut(expected, 16)
    assert got.count(tokenizer.bos_token_id) == 1 and tokenizer.eos_token_id not in got  # eos was past the cut
    assert tokenizer.decode(got[1:]) == TEXT_A[: len(tokenizer.decode(got[1:]))]


@pytest.mark.parametrize("spec", ["folder", "glob"])
def test_a_folder_or_glob_of_files_has_one_eos_between_files(tmp_path, tokenizer, spec):
    (tmp_path / "a.txt").write_text(TEXT_A)
    (tmp_path / "b.txt").write_text(TEXT_B)
    dataset = str(tmp_path) if spec == "folder" else str(tmp_path / "*.txt")
    expected = encoded_file(TEXT_A, tokenizer) + encoded_file(TEXT_B, tokenizer)
    got = stream(tmp_path, dataset, tokenizer, max_length=8)
    assert got == cut(expected, 8)
    assert got.count(tokenizer.eos_token_id) == 1 + (len(got) == len(expected))  # between the files (+ at the end)
    assert got.index(tokenizer.eos_token_id) == len(encoded_file(TEXT_A, tokenizer)) - 1


def test_line_and_paragraph_documents(tmp_path, tokenizer):
    text = "first line\nsecond line\n\n\nthird\n  fourth\n\n"
    (tmp_path / "a.txt").write_text(text * 4)
    eos = tokenizer.eos_token_id
    lines = [t for line in ["first line", "second line", "third", "  fourth"] for t in encoded_file(line, tokenizer)]
    assert stream(tmp_path, str(tmp_path / "a.txt"), tokenizer, max_length=4, text_sample_by="line") == \
        cut(lines * 4, 4)
    paragraphs = encoded_file("first line\nsecond line", tokenizer) + encoded_file("third\n  fourth", tokenizer)
    got = stream(tmp_path, str(tmp_path / "a.txt"), tokenizer, max_length=4, text_sample_by="paragraph")
    assert got == cut(paragraphs * 4, 4) and got.count(eos) >= 7


def test_held_out_prompts_of_one_file_are_blocks_left_out_of_training(tmp_path, tokenizer):
    (tmp_path / "a.txt").write_text(TEXT_A)
    cfg = DataConfig(dataset=str(tmp_path / "a.txt"), format="text", max_length=16, num_eval_prompts=3,
                     eval_prompt_tokens=5)
    data = build_data(cfg, tokenizer, seed=0)
    every_block = cut(encoded_file(TEXT_A, tokenizer), 16)
    blocks = [every_block[i:i + 16] for i in range(0, len(every_block), 16)]
    assert len(data.train) == len(blocks) - 3 and len(data.eval_prompts) == 3
    held_out = [b for b in blocks if b not in data.train["input_ids"]]
    assert sorted(p.tolist() for p in data.eval_prompts) == sorted(b[:5] for b in held_out)
    with pytest.raises(DataError, match="data.num_eval_prompts"):
        build_data(DataConfig(dataset=str(tmp_path / "a.txt"), format="text", max_length=16,
                              num_eval_prompts=len(blocks)), tokenizer)


def test_bad_sample_by_and_non_utf8_file_are_named(tmp_path, tokenizer):
    with pytest.raises(RecipeError, match="text_sample_by"):
        DataConfig(dataset="a.txt", text_sample_by="sentence")
    (tmp_path / "bad.txt").write_bytes(b"ok\n\xff\xfe broken\n")
    with pytest.raises(DataError, match="bad.txt is not UTF-8"):
        stream(tmp_path, str(tmp_path / "bad.txt"), tokenizer)
