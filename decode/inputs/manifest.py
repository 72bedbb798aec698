"""What a folder held when it was written: a manifest of sha256 digests, written last, checked before the folder is
trusted again (a checkpoint resumed from, a cache shard reused, a downloaded draft checked).

    write_manifest(folder)          every file under folder -> folder/specdistill-manifest.json (atomic, last)
    manifest_problems(folder)       None: no manifest; []: every listed file as written; else one line per file that
                                    is missing, has another size or another sha256 (a flipped bit, a partial copy)

Files added after the manifest (a model card, a log) are not checked; the manifest itself is not listed. Digests are
streamed (1 MiB reads): about a second per 1.5 GB on one core.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from decode.inputs.checks import FileProblem, read_text
from decode.inputs.writes import write_atomic

MANIFEST = "specdistill-manifest.json"
CHUNK = 1 << 20


def file_digest(path: str | Path) -> str:
    """The sha256 of a file's bytes, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def listed_files(folder: Path) -> list[Path]:
    """Every file under `folder` but the manifest, sorted by relative path."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(folder: str | Path, files: list[Path] | None = None) -> Path:
    """Write folder/specdistill-manifest.json: {"algorithm": "sha256", "files": {relative path: {"sha256", "bytes"}}}
    of `files` (default: every file under `folder`). Call it after the last of them is written."""
    folder = Path(folder)
    files = {p.relative_to(folder).as_posix(): {"sha256": file_digest(p), "bytes": p.stat().st_size}
             for p in (sorted(files) if files is not None else listed_files(folder))}
    path = folder / MANIFEST
    write_atomic(path, json.dumps({"algorithm": "sha256", "files": files}, indent=1, sort_keys=True) + "\n")
    return path


def manifest_problems(folder: str | Path) -> list[str] | None:
    """None when `folder` has no manifest; else one line per listed file that is missing or differs from what was
    written ([] when all match). An unreadable manifest is one problem."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        files = json.loads(read_text(path))["files"]
        entries = [(name, entry["sha256"], int(entry["bytes"])) for name, entry in files.items()]
    except (OSError, FileProblem, ValueError, KeyError, TypeError, AttributeError) as err:
        return [f"{MANIFEST} is unreadable ({type(err).__name__}): the folder cannot be verified"]
    problems = []
    for name, sha256, size in entries:
        file = folder / name
        if not file.is_file():
            problems.append(f"{name} is missing (listed in {MANIFEST})")
        elif file.stat().st_size != size:
            problems.append(f"{name} has {file.stat().st_size} bytes, {size} when written (a partial copy?)")
        elif file_digest(file) != sha256:
            problems.append(f"{name} differs from what was written (sha256 {file_digest(file)[:12]}..., "
                            f"{sha256[:12]}... in {MANIFEST}): a corrupted copy")
    return problems
