"""One run at a time in an output folder: the main process of a run holds an exclusive lock on
train.output_dir/.specdistill-run.lock from the check step to its end.

    hold_output_folder(dir)     flock(LOCK_EX | LOCK_NB) on the lock file; a folder held by another process is
                                refused in one line naming that process (found in /proc/locks: its pid and command)
    release_output_folder(dir)  closes the file: the lock goes, the file stays (deleting it would let a third run
                                lock a new file while a second still holds the old one)

Two processes resuming one folder (`train.resume_from_checkpoint=true` twice), or two fresh runs started at the same
moment, would otherwise write the same checkpoint-N and acceptance.jsonl over each other. The kernel lets go of the
lock when the process ends, however it ends (SIGKILL, a lost node): no stale lock is ever left to delete by hand.
Nothing is written into the file (it is created empty once), so a run that only reads its folder, a finished run
resumed, changes no file. Only the main process (RANK 0, or a process outside a launch) locks: when it is refused
and exits, the launcher ends the other processes of its launch. flock holds across hosts on NFS (Linux emulates it
with POSIX locks there; the holder is then named as on another machine); where ``fcntl`` does not exist (Windows)
nothing is locked.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None

logger = logging.getLogger(__name__)

LOCK_FILE = ".specdistill-run.lock"

_held: dict[Path, int] = {}  # resolved folder -> the open descriptor that holds its lock


class FolderInUse(Exception):
    """Another process holds the folder's lock; str() is the one line a user reads."""

    def __init__(self, folder: Path, holder: str) -> None:
        super().__init__(f"{folder} is in use by another run ({holder}); wait for it to end, stop it, or choose "
                         "another folder")


def hold_output_folder(output_dir: str | Path) -> None:
    """Lock `output_dir` for this process (created if absent) until release_output_folder or the process's end.
    Raises FolderInUse when another process holds it; a no-op on other ranks, where it is held already, or without
    fcntl."""
    folder = Path(output_dir).expanduser().resolve()
    if fcntl is None or folder in _held or int(os.environ.get("RANK", "0")) != 0:
        return
    folder.mkdir(parents=True, exist_ok=True)
    fd = None
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)  # for writing: NFS's emulation needs it
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = lock_holder(os.fstat(fd).st_ino)
        os.close(fd)
        raise FolderInUse(Path(output_dir), holder) from None  # named as the user gave it
    except OSError as err:  # a file system without locks (ENOLCK), a lock file of someone else's
        if fd is not None:
            os.close(fd)
        logger.warning("cannot lock %s (%s): a second run into it would not be refused", folder / LOCK_FILE,
                       err.strerror or err)
        return
    _held[folder] = fd


def lock_holder(inode: int) -> str:
    """Who holds the flock on the file with this inode, from /proc/locks (Linux; a line reads
    `1: FLOCK  ADVISORY  WRITE 3353 08:01:1234567 0 EOF`): "pid 3353: its command line", shortened."""
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        lines = []
    for fields in (line.split() for line in lines):
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(inode):
            pid = fields[4]
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                return f"pid {pid}"
            command = " ".join(command.split())  # one line: a `python -c` program holds newlines
            return f"pid {pid}: {command[:117] + '...' if len(command) > 120 else command}"
    return "a process on another machine, or one this machine does not show"


def release_output_folder(output_dir: str | Path) -> None:
    """Let go of the lock hold_output_folder took on `output_dir` (nothing when this process holds none)."""
    fd = _held.pop(Path(output_dir).expanduser().resolve(), None)
    if fd is not None:
        os.close(fd)
