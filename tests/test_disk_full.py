"""A full disk (ENOSPC, injected where the bytes are written): a checkpoint save, a cache shard, the acceptance log and
the export stop with one line naming the path, the free space and what is intact; nothing half-written is left where
resume reads; once there is space again the run resumes to the uninterrupted result, bit for bit, and the cache build
resumes to the same cache."""
from __future__ import annotations

import errno
import json
import re
from pathlib import Path

import datasets
import pytest
import torch
from safetensors.torch import load_file
from test_integrity import tiny_cache_inputs
from test_kill_resume import RUN, STEPS, reference, workdir  # the tiny run of those tests  # noqa: F401 - module fixtures: the tiny pair, the uninterrupted run

from decode.inputs.manifest import manifest_problems
from distill.data.teacher_cache import build_teacher_cache
from distill.outputs import acceptance_log
from distill.outputs.checkpoints import PARTIAL_DIR
from distill.utils import OutOfSpaceError
from kinds import STANDALONE

from helpers import TINY_RECIPE, cli_error, run_train

FULL = "no space left on the device of "


def disk_full(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_during_a_checkpoint_save_is_one_line_and_resume_ends_bit_for_bit(monkeypatch, capsys, workdir,
                                                                                       reference):
    """torch.save of checkpoint-8's optimizer finds the disk full (the weights are written by then): one line, the
    half-written checkpoint gone, checkpoint-4 intact; the resumed run equals the uninterrupted one."""
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if str(f).endswith("optimizer.pt") and f"{PARTIAL_DIR}/checkpoint-8" in str(f):
            disk_full()
        return real_save(obj, f, *args, **kwargs)

    run = workdir / "full_disk"
    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", save)
        message = cli_error(patch, capsys, TINY_RECIPE, f"model.target={workdir / 'target'}",
                            f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={run}", *RUN)
    assert message.startswith(f"specdistill-train: error: {FULL}{run} while writing checkpoint-8 ("), message
    sizes = r"\(\S+ [KMG]?i?B written\) \(\S+ [KMG]?i?B free, about \S+ [KMG]?i?B needed\)"
    assert re.search(sizes, message) and message.endswith(
        "checkpoint-4 is intact and nothing of checkpoint-8 was kept; free space, then continue with "
        "train.resume_from_checkpoint=true"), message
    assert not (run / PARTIAL_DIR).exists() or not any((run / PARTIAL_DIR).iterdir())
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-4"]
    assert manifest_problems(run / "checkpoint-4") == []
    run_train(workdir, "full_disk", *RUN, "train.resume_from_checkpoint=true")
    for step in STEPS:
        ours, theirs = (load_file(f / f"checkpoint-{step}" / "model.safetensors") for f in (run, reference))
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs), step


def test_a_full_disk_during_a_cache_shard_keeps_the_shards_before_it(monkeypatch, tmp_path):
    target, rows, settings = tiny_cache_inputs(tmp_path)
    real = datasets.Dataset.save_to_disk
    calls = []

    def save_to_disk(self, path, *args, **kwargs):
        calls.append(path)
        real(self, path, *args, **kwargs)  # the shard's files are written, then the disk is full
        if len(calls) == 2:
            disk_full()

    cache = tmp_path / "cache"
    with monkeypatch.context() as patch:
        patch.setattr(datasets.Dataset, "save_to_disk", save_to_disk)
        with pytest.raises(OutOfSpaceError) as raised:
            build_teacher_cache(target, rows, cache, **settings)
    message = str(raised.value)
    assert message.startswith(f"{FULL}{cache} while writing teacher cache shard 1 ("), message
    assert message.endswith("the 1 shards before it are kept; free space, then run the same command again to "
                            "resume"), message
    assert sorted(p.name for p in (cache / "shards").iterdir()) == ["shard-00000"]  # no half-written shard
    resumed = build_teacher_cache(target, rows, cache, **settings)
    fresh = build_teacher_cache(target, rows, tmp_path / "fresh", **settings)
    assert [dict(r) for r in resumed.rows] == [dict(r) for r in fresh.rows]


def test_a_full_disk_during_the_acceptance_log_keeps_its_earlier_lines(monkeypatch, tmp_path):
    acceptance_log.append_records(tmp_path, [{"step": 4, "gamma": 2}])
    before = (tmp_path / "acceptance.jsonl").read_bytes()
    real_write = acceptance_log.os.write

    def write(fd, data):
        real_write(fd, data[: len(data) // 2])  # half of the lines reach the disk, then it is full
        disk_full()

    monkeypatch.setattr(acceptance_log.os, "write", write)
    with pytest.raises(OutOfSpaceError, match="while writing the acceptance log .*; its earlier lines and every "
                                              "checkpoint are intact"):
        acceptance_log.append_records(tmp_path, [{"step": 8, "gamma": 2}, {"step": 8, "gamma": 4}])
    assert (tmp_path / "acceptance.jsonl").read_bytes() == before
    assert [json.loads(line)["step"] for line in before.decode().splitlines()] == [4]


def test_a_full_disk_during_the_export_leaves_the_output_folder_as_it_was(monkeypatch, tmp_path):
    """The tokenizer's files find the disk full after the weights were written: nothing of this export reaches
    OUTPUT_DIR (the earlier export's files stay, byte for byte, with their manifest), no staging folder is left;
    the export done again once there is space is whole and verified."""
    from transformers import AutoTokenizer

    from decode.inputs.manifest import MANIFEST
    from distill.publish.export import export_draft

    from tiny import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    model = tiny_model("llama", vocab_size=len(tok), hidden=32, layers=1)
    out = tmp_path / "run"
    out.mkdir()
    export_draft(out, None, model, tok, default_gamma=4, kind=STANDALONE)  # an earlier, complete export
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    with torch.no_grad():
        model.model.embed_tokens.weight.add_(1.0)  # a different draft to export
    real_save = type(tok).save_pretrained

    def save_pretrained(self, folder, *args, **kwargs):
        (Path(folder) / "tokenizer.json").write_text('{"half": ')  # half written, then the disk is full
        disk_full()

    monkeypatch.setattr(type(tok), "save_pretrained", save_pretrained)
    with pytest.raises(OSError) as raised:
        export_draft(out, None, model, tok, default_gamma=4, kind=STANDALONE)
    assert raised.value.errno == errno.ENOSPC
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert not (out / PARTIAL_DIR / "export").exists() and manifest_problems(out) == []
    monkeypatch.setattr(type(tok), "save_pretrained", real_save)
    export_draft(out, None, model, tok, default_gamma=4, kind=STANDALONE)
    assert manifest_problems(out) == [] and (out / MANIFEST).read_bytes() != before[MANIFEST]
    assert not (out / PARTIAL_DIR / "export").exists()
    reloaded = load_file(out / "model.safetensors")
    assert torch.equal(reloaded["model.embed_tokens.weight"], model.model.embed_tokens.weight)
    assert AutoTokenizer.from_pretrained(out).get_vocab() == tok.get_vocab()


def test_other_os_errors_are_not_reported_as_a_full_disk(monkeypatch, tmp_path):
    def denied(*_args, **_kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(acceptance_log.os, "write", denied)
    with pytest.raises(PermissionError) as raised:
        acceptance_log.append_records(tmp_path, [{"step": 8}])
    assert not isinstance(raised.value, OutOfSpaceError)
