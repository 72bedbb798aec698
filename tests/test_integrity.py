"""Integrity (decode/inputs/manifest.py): every checkpoint, cache shard and export holds a manifest of its files'
sha256 digests, written last; a flipped byte is found before the bytes are trusted again. A corrupted newest
checkpoint is skipped with one warning and the run resumes from the previous one to the uninterrupted result, bit
for bit; a named corrupted checkpoint is refused in one line; a corrupted cache shard is built again, equal to the
original; `specdistill check` names a corrupted file of an exported folder."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import datasets
import torch
from safetensors.torch import load_file
from test_kill_resume import RUN, STEPS, reference, workdir  # the tiny run of those tests  # noqa: F401 - module fixtures: the tiny pair, the uninterrupted run

from decode.inputs.manifest import MANIFEST, manifest_problems, write_manifest
from distill.data.teacher_cache import build_teacher_cache
from distill.utils import IGNORE_INDEX
from specdistill.drafts import check_deploy

from helpers import cli_error, run_train
from tiny import save_and_load, tiny_model, tiny_tokenizer


def flip_byte(path: Path, offset_from_end: int = 17) -> None:
    """Flip one bit of a file near its end (inside a safetensors file's data, past its header)."""
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_manifest_names_each_changed_missing_or_cut_file(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("a.bin", "b.json", "sub/c.bin"):
        (tmp_path / name).write_bytes(bytes(range(64)) * 4)
    assert manifest_problems(tmp_path) is None  # no manifest: nothing to verify
    write_manifest(tmp_path)
    assert manifest_problems(tmp_path) == []
    (tmp_path / "later.txt").write_text("added after the manifest")  # not listed: not checked
    assert manifest_problems(tmp_path) == []
    flip_byte(tmp_path / "a.bin")
    (tmp_path / "b.json").write_bytes(bytes(range(64)))
    (tmp_path / "sub" / "c.bin").unlink()
    problems = manifest_problems(tmp_path)
    assert len(problems) == 3
    assert problems[0].startswith("a.bin differs from what was written (sha256 ")
    assert problems[1] == "b.json has 64 bytes, 256 when written (a partial copy?)"
    assert problems[2] == f"sub/c.bin is missing (listed in {MANIFEST})"
    (tmp_path / MANIFEST).write_text("{not json")
    assert manifest_problems(tmp_path) == [f"{MANIFEST} is unreadable (JSONDecodeError): the folder cannot be verified"]


# ---- checkpoints ---------------------------------------------------------------------------------------------------
def test_every_checkpoint_and_the_export_hold_a_verified_manifest(reference):
    for step in STEPS:
        assert manifest_problems(reference / f"checkpoint-{step}") == []
    assert manifest_problems(reference) == []  # the export: the served files only
    report = check_deploy(str(reference.parent / "target"), reference)
    assert report.passed and "manifest" in report.checks, report.problems


def test_a_corrupted_newest_checkpoint_is_skipped_and_resume_ends_bit_for_bit(workdir, reference, caplog):
    run = workdir / "flipped"
    shutil.copytree(reference, run)
    flip_byte(run / f"checkpoint-{STEPS[-1]}" / "model.safetensors")
    with caplog.at_level(logging.WARNING):
        run_train(workdir, "flipped", *RUN, "train.resume_from_checkpoint=true")
    skipped = [r.getMessage() for r in caplog.records if "skipping checkpoint" in r.getMessage()]
    assert len(skipped) == 1 and f"checkpoint-{STEPS[-1]}: model.safetensors differs from what was written" \
        in skipped[0], skipped
    for step in STEPS:
        ours, theirs = (load_file(f / f"checkpoint-{step}" / "model.safetensors") for f in (run, reference))
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs)  # steps 9..12 run again, to the same weights
    assert manifest_problems(run / f"checkpoint-{STEPS[-1]}") == []


def test_a_named_corrupted_checkpoint_is_refused_in_one_line(monkeypatch, capsys, workdir, reference, tmp_path):
    run = tmp_path / "named"
    shutil.copytree(reference, run)
    flip_byte(run / "checkpoint-8" / "optimizer.pt", 5)
    from helpers import TINY_RECIPE

    message = cli_error(monkeypatch, capsys, TINY_RECIPE, f"model.target={workdir / 'target'}",
                        f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={run}", *RUN,
                        f"train.resume_from_checkpoint={run / 'checkpoint-8'}")
    assert message == (f"specdistill-train: error: train.resume_from_checkpoint: {run / 'checkpoint-8'} is not what "
                       f"was saved: optimizer.pt differs from what was written (sha256 "
                       + message.split("(sha256 ", 1)[1]), message
    assert message.endswith("in specdistill-manifest.json): a corrupted copy; name an earlier checkpoint")


def test_the_check_names_a_corrupted_exported_file(workdir, reference, tmp_path):
    copy = tmp_path / "download"
    shutil.copytree(reference, copy, ignore=shutil.ignore_patterns("checkpoint-*", "runs"))
    flip_byte(copy / "model.safetensors")
    report = check_deploy(str(workdir / "target"), copy)
    assert list(report.problems) == ["manifest"], report.problems
    assert report.problems["manifest"].startswith("model.safetensors differs from what was written")
    assert report.problems["manifest"].endswith("download or copy the folder again")


# ---- cache shards ----------------------------------------------------------------------------------------------------
def tiny_cache_inputs(folder: Path) -> tuple[torch.nn.Module, datasets.Dataset, dict]:
    """A tiny target, 10 rows of 12 tokens and build_teacher_cache's settings for 3 shards of 4, 4 and 2 rows."""
    target = save_and_load(tiny_model(vocab_size=96, seed=0), folder / "target")
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(4, 96, (12,), generator=g).tolist() for _ in range(10)]
    rows = datasets.Dataset.from_dict({"input_ids": ids, "labels": [[IGNORE_INDEX] * 3 + r[3:] for r in ids]})
    settings = dict(k=4, batch_size=4, target_id="tiny-target", tokenizer=tiny_tokenizer(), rows_per_shard=4,
                    progress=False)
    return target, rows, settings


def test_a_corrupted_cache_shard_is_built_again_equal_to_the_original(tmp_path, caplog):
    target, rows, settings = tiny_cache_inputs(tmp_path)
    first = build_teacher_cache(target, rows, tmp_path / "cache", **settings)
    original = [dict(r) for r in first.rows]
    shard = tmp_path / "cache" / "shards" / "shard-00001"
    assert manifest_problems(shard) == []
    arrow = next(shard.glob("*.arrow"))
    flip_byte(arrow, 40)
    with caplog.at_level(logging.WARNING):
        again = build_teacher_cache(target, rows, tmp_path / "cache", **settings)
    assert any("shard-00001 is not what was written" in r.getMessage() for r in caplog.records), caplog.text
    assert manifest_problems(shard) == []
    assert [dict(r) for r in again.rows] == original
