"""Writing files all or nothing: `write_atomic` (the one atomic writer of results, records and manifests) and
`fsync_folder` (a rename made durable)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Replace the file at `path` with `data` (text as UTF-8) all at once, the one atomic writer of results: a
    temporary file of its own beside it (`.<name>.<random>.tmp`, so two writers never share one), flushed and
    fsynced, renamed over `path`, and the folder fsynced so the rename survives a power loss. A reader, a kill or a
    failed write (a full disk) finds the old content or the new, and no temporary file is left behind."""
    path = Path(path)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


def fsync_folder(folder: Path) -> None:
    """Make a rename inside `folder` durable (a no-op where folders cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse to fsync a folder; the rename itself is still atomic
    finally:
        os.close(fd)
