"""Tests for the quickstart's corpus and tokenizer (scripts/quickstart_corpus.py, scripts/quickstart_tokenizer.py)
on a ~50-file subset of the stdlib and a 512-token BPE (a few seconds in all)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from scripts import quickstart_tokenizer
from scripts.quickstart_corpus import (
    EXCLUDED_DIRS,
    CorpusPaths,
    build_corpus,
    chunk_at_lines,
    definition_prompts,
    is_heldout,
    load_eval_prompts,
    read_jsonl,
    stdlib_root,
    stdlib_source_files,
)
from scripts.quickstart_tokenizer import SPECIAL_TOKENS, train_tokenizer

HELDOUT_FRACTION = 0.2  # larger than the default so that a 50-file subset holds out ~10 files


@pytest.fixture(scope="module")
def all_files() -> list[Path]:
    return stdlib_source_files()


@pytest.fixture(scope="module")
def subset(all_files) -> list[Path]:
    """~50 small stdlib files spread over the sorted list (deterministic)."""
    small = [f for f in all_files if 0 < f.stat().st_size <= 20_000]
    return small[:: max(1, len(small) // 50)][:50]


@pytest.fixture(scope="module")
def built(tmp_path_factory, subset) -> CorpusPaths:
    return build_corpus(tmp_path_factory.mktemp("corpus"), files=subset, heldout_fraction=HELDOUT_FRACTION,
                        progress=False)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, built) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(built, out, vocab_size=512, progress=False)
    return out


def _sources(path: Path) -> set[str]:
    return {row["source"] for row in read_jsonl(path)}


def _texts_by_source(path: Path) -> dict[str, str]:
    texts: dict[str, str] = {}
    for row in read_jsonl(path):
        texts[row["source"]] = texts.get(row["source"], "") + row["text"]
    return texts


# ---------------------------------------------------------------- source files


def test_stdlib_source_files_are_sorted_python_without_tests(all_files):
    root = stdlib_root()
    rel = [f.relative_to(root) for f in all_files]
    assert all_files == sorted(all_files)
    assert all(f.suffix == ".py" for f in all_files)
    assert not [r for r in rel if set(r.parts[:-1]) & EXCLUDED_DIRS]
    assert Path("os.py") in rel and Path("json/__init__.py") in rel
    assert not any(r.parts[0] == "test" or "idle_test" in r.parts for r in rel)
    assert len(all_files) > 300


def test_limit_bytes_is_a_stable_sample_within_budget(all_files):
    sample = stdlib_source_files(limit_bytes=300_000)
    assert sample == stdlib_source_files(limit_bytes=300_000)
    assert sample == sorted(sample) and set(sample) <= set(all_files)
    assert 0 < sum(f.stat().st_size for f in sample) <= 300_000


# ---------------------------------------------------------------- split


def test_split_is_by_file_disjoint_and_matches_the_rule(built, subset):
    train, heldout = _sources(built.train), _sources(built.heldout)
    assert train and heldout and not train & heldout
    nonempty = {f.relative_to(stdlib_root()).as_posix() for f in subset if f.read_text(encoding="utf-8").strip()}
    assert train | heldout == nonempty
    assert heldout == {s for s in nonempty if is_heldout(s, heldout_fraction=HELDOUT_FRACTION)}
    manifest = built.load_manifest()
    assert manifest["counts"]["heldout"]["files"] == len(heldout)
    assert manifest["counts"]["train"]["files"] == len(train)


def test_build_is_deterministic(tmp_path, built, subset):
    again = build_corpus(tmp_path, files=subset, heldout_fraction=HELDOUT_FRACTION, progress=False)
    for name in ("train", "heldout", "eval_prompts", "manifest"):
        assert getattr(again, name).read_bytes() == getattr(built, name).read_bytes(), name


def test_documents_are_the_files_verbatim(built, subset):
    texts = {**_texts_by_source(built.train), **_texts_by_source(built.heldout)}
    for f in subset[:10]:
        text = f.read_bytes().decode("utf-8")
        if text.strip():
            assert texts[f.relative_to(stdlib_root()).as_posix()] == text


@pytest.mark.parametrize("fraction", [0.05, 0.2, 0.5])
def test_heldout_fraction_is_roughly_right(all_files, fraction):
    rel = [f.relative_to(stdlib_root()).as_posix() for f in all_files]
    n, k = len(rel), sum(is_heldout(r, heldout_fraction=fraction) for r in rel)
    assert abs(k - n * fraction) <= 4 * math.sqrt(n * fraction * (1 - fraction)), (k, n)


def test_seed_changes_the_split(all_files):
    rel = [f.relative_to(stdlib_root()).as_posix() for f in all_files]
    split0 = {r for r in rel if is_heldout(r, heldout_fraction=0.2, seed=0)}
    split1 = {r for r in rel if is_heldout(r, heldout_fraction=0.2, seed=1)}
    assert split0 != split1


def test_bad_parameters_name_the_key(tmp_path, subset):
    with pytest.raises(ValueError, match="heldout_fraction"):
        build_corpus(tmp_path, files=subset, heldout_fraction=0.0, progress=False)
    with pytest.raises(ValueError, match="max_chars_per_doc"):
        build_corpus(tmp_path, files=subset, max_chars_per_doc=0, progress=False)


# ---------------------------------------------------------------- chunking and prompts


def test_chunk_at_lines_cuts_at_line_ends_and_loses_nothing():
    text = "".join(f"line {i} " + "x" * (i % 17) + "\n" for i in range(200)) + "y" * 250 + "\nlast"
    pieces = chunk_at_lines(text, 100)
    assert "".join(pieces) == text
    assert all(0 < len(p) <= 100 for p in pieces)
    assert sum(not p.endswith("\n") for p in pieces) <= 4  # only the over-long line and the unterminated last one
    assert chunk_at_lines(text, None) == [text] and chunk_at_lines("", 100) == []


def test_chunked_corpus_rejoins_into_the_same_files(tmp_path, built, subset):
    chunked = build_corpus(tmp_path, files=subset, heldout_fraction=HELDOUT_FRACTION, max_chars_per_doc=1000,
                           progress=False)
    rows = list(read_jsonl(chunked.train))
    assert all(len(r["text"]) <= 1000 for r in rows)
    assert len(rows) > len(list(read_jsonl(built.train)))
    assert _texts_by_source(chunked.train) == _texts_by_source(built.train)


def test_definition_prompts_end_at_a_line_end():
    text = "import os\n\n\nclass A:\n    def f(self):\n        return 1\n" + "# filler\n" * 20
    prompts = definition_prompts(text, prompt_chars=40)
    assert [line for line, _ in prompts] == [4, 5]
    for line, prompt in prompts:
        start = sum(len(x) for x in text.splitlines(keepends=True)[: line - 1])
        assert text[start:].startswith(prompt) and text[start + len(prompt)] == "\n"
        assert len(prompt) <= 40


def test_eval_prompts_come_from_heldout_files_only(built):
    heldout_texts = _texts_by_source(built.heldout)
    rows = list(read_jsonl(built.eval_prompts))
    assert 0 < len(rows) <= 64
    assert load_eval_prompts(built) == [r["prompt"] for r in rows]
    assert len({r["prompt"] for r in rows}) == len(rows)
    for row in rows:
        assert isinstance(row["prompt"], str) and row["prompt"].strip()
        assert len(row["prompt"]) <= 200
        assert row["source"] in heldout_texts
        lines = heldout_texts[row["source"]].splitlines(keepends=True)
        assert "".join(lines[row["line"] - 1:]).startswith(row["prompt"])
        package = row["source"].split("/")[0] if "/" in row["source"] else "top-level"
        assert row["category"] == package  # evaluations report acceptance per package
    assert len({r["source"] for r in rows}) > 1  # spread over several held-out files


def test_num_prompts_and_prompt_chars_are_honoured(tmp_path, subset):
    paths = build_corpus(tmp_path, files=subset, heldout_fraction=HELDOUT_FRACTION, num_prompts=5,
                         prompt_chars=80, progress=False)
    prompts = load_eval_prompts(paths)
    assert len(prompts) == 5 and all(0 < len(p) <= 80 for p in prompts)


# ---------------------------------------------------------------- caching


def test_corpus_cache_reuses_and_rebuilds_on_new_parameters(tmp_path, subset):
    first = build_corpus(tmp_path, files=subset, heldout_fraction=HELDOUT_FRACTION, progress=False)
    stamp = first.train.stat().st_mtime_ns, first.manifest.stat().st_mtime_ns
    second = build_corpus(tmp_path, files=subset, heldout_fraction=HELDOUT_FRACTION, progress=False)
    assert second == first and (second.train.stat().st_mtime_ns, second.manifest.stat().st_mtime_ns) == stamp
    third = build_corpus(tmp_path, files=subset, heldout_fraction=0.3, progress=False).load_manifest()
    assert third["params"]["heldout_fraction"] == 0.3
    fourth = build_corpus(tmp_path, files=subset[:20], heldout_fraction=0.3, progress=False).load_manifest()
    assert fourth["counts"]["train"]["files"] < third["counts"]["train"]["files"]


def test_tokenizer_cache_reuses_without_training(monkeypatch, tmp_path, built):
    calls = []
    real = quickstart_tokenizer._train_bpe
    monkeypatch.setattr(quickstart_tokenizer, "_train_bpe", lambda *a, **k: calls.append(1) or real(*a, **k))
    train_tokenizer(built, tmp_path, vocab_size=400, progress=False)
    stamp = (tmp_path / "tokenizer.json").stat().st_mtime_ns
    tokenizer = train_tokenizer(built, tmp_path, vocab_size=400, progress=False)
    assert calls == [1] and len(tokenizer) == 400
    assert (tmp_path / "tokenizer.json").stat().st_mtime_ns == stamp
    train_tokenizer(built, tmp_path, vocab_size=384, progress=False)
    assert calls == [1, 1]
    assert json.loads((tmp_path / "corpus_tokenizer.json").read_text())["key"]["vocab_size"] == 384


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_round_trips_heldout_source_exactly(built, tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    texts = list(_texts_by_source(built.heldout).values())
    texts += ["tabs\tand\r\nCRLF  .  ,\n", "unicode: é ß 中文 🐍 \u200b\n", "literal <|endoftext|> in text\n",
              "    \n\n\n  trailing spaces   "]
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text
    code = texts[0]
    assert len(tokenizer(code)["input_ids"]) < len(code.encode("utf-8")) / 1.5  # BPE actually merges


def test_special_tokens_have_the_documented_ids(tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == [0, 1, 2, 3, 4, 5]
    assert tokenizer.convert_tokens_to_ids(["<|pad|>", "<|bos|>", "<|endoftext|>"]) == [0, 1, 2]
    assert tokenizer("def f():")["input_ids"][0] not in range(6)  # encoding adds no special tokens
    assert len(tokenizer) == 512


def test_chat_template_masks_exactly_the_assistant_turn(tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    messages = [{"role": "user", "content": "add two numbers"},
                {"role": "assistant", "content": "def add(a, b):\n    return a + b"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == "<|user|>\nadd two numbers<|endoftext|><|assistant|>\ndef add(a, b):\n    return a + b<|endoftext|>"
    out = tokenizer.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
    masked = [i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    assert tokenizer.decode(masked) == "def add(a, b):\n    return a + b<|endoftext|>"
    prompt = tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|endoftext|><|assistant|>\n")
