"""The one atomic writer (decode.inputs.writes.write_atomic): a temporary file of its own per write, fsync of the
file and of its folder, the old content intact and nothing left behind when a write fails (a full disk), concurrent
writers never mixing, and the eval JSON written through it."""
from __future__ import annotations

import errno
import json
import os
import stat
import threading

import pytest

import decode.inputs.writes as writes
import decode.measure.results as results
from decode.inputs.writes import write_atomic


def test_the_file_and_its_folder_are_fsynced(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def recording(fd):
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(writes.os, "fsync", recording)
    write_atomic(tmp_path / "result.json", '{"tau": 1.5}\n')
    assert synced == ["file", "folder"]
    assert (tmp_path / "result.json").read_text() == '{"tau": 1.5}\n'


@pytest.mark.parametrize("failing", ["write", "fsync", "replace"])
def test_a_full_disk_leaves_the_old_content_and_no_temporary_file(tmp_path, monkeypatch, failing):
    path = tmp_path / "train_results.json"
    path.write_text("old\n")

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if failing == "write":
        monkeypatch.setattr(writes.os, "fdopen", lambda fd, mode: _FailingFile(fd))
    elif failing == "fsync":
        monkeypatch.setattr(writes.os, "fsync", full)
    else:
        monkeypatch.setattr(writes.os, "replace", full)
    with pytest.raises(OSError) as err:
        write_atomic(path, "new\n" * 1000)
    assert err.value.errno == errno.ENOSPC
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train_results.json"]


class _FailingFile:
    """A file object whose write fails as on a full disk (the descriptor is closed on exit, as os.fdopen's is)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)

    def write(self, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_concurrent_writers_each_use_their_own_temporary_file(tmp_path, monkeypatch):
    """Each write goes through its own temporary name (a shared `<name>.tmp` lets one writer rename another's
    half-written file); 8 threads x 25 writes end with one whole content and nothing else in the folder."""
    path = tmp_path / "acceptance.jsonl"
    names = set()
    real_mkstemp = writes.tempfile.mkstemp

    def recording(*args, **kwargs):
        fd, name = real_mkstemp(*args, **kwargs)
        names.add(name)
        return fd, name

    monkeypatch.setattr(writes.tempfile, "mkstemp", recording)
    contents = [json.dumps({"writer": w, "rows": list(range(2000))}) + "\n" for w in range(8)]
    errors = []

    def writer(content: str) -> None:
        try:
            for _ in range(25):
                write_atomic(path, content)
        except Exception as err:  # noqa: BLE001 - collected and asserted below
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(c,)) for c in contents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(names) == 200  # one temporary file per write
    assert path.read_text() in contents
    assert sorted(p.name for p in tmp_path.iterdir()) == ["acceptance.jsonl"]


def test_the_eval_json_is_written_atomically(tmp_path, monkeypatch):
    written = []
    monkeypatch.setattr(results, "write_atomic", lambda path, data: written.append((path, data)))
    monkeypatch.setattr(results, "environment", lambda: {"python": "3"})
    results.write_eval_json(tmp_path / "eval.json", {"results": []})
    [(path, data)] = written
    assert path == tmp_path / "eval.json" and json.loads(data) == {"results": [], "environment": {"python": "3"}}
