"""One writer at a time in a folder: an exclusive flock on a lock file inside it, held from the check that the folder
is this process's to the end of what it writes there.

    hold_folder(dir, name)              flock(LOCK_EX | LOCK_NB); held by another process: FolderInUse, whose one
                                        line names that process (from /proc/locks: its pid and command line)
    hold_folder(dir, name, waiting=W)   the same, but held by another process: one log line ("W: waiting for pid
                                        N ...") and wait for it (a cache another run is building: it is complete when
                                        the wait ends, and the caller finds it so)
    release_folder(dir, name)           closes the file: the lock goes, the file stays (deleting it would let a third
                                        process lock a new file while a second still holds the old one)

Two uses: a run's output folder (RUN_LOCK, distill.run.preflight: a second resume into a folder another run holds is
refused) and a cache build (BUILD_LOCK, distill.data.shard_store: runs of a sweep started at once that share a
teacher or hidden-state cache wait for the one building it, instead of writing the same shards over each other). The
kernel lets go of a lock when its process ends, however it ends (SIGKILL, a lost node): no stale lock is ever left to
delete by hand. Nothing is written into the file (it is created empty once), so a process that only reads the
folder changes no file. Only the main process of a launch (RANK 0, or a process outside one) locks; where a process
of another launch holds a run's folder (/proc/locks), the other processes of this launch are refused with the same
line, so the whole launch stops at once and says it once. flock holds across hosts on NFS (Linux emulates it with
POSIX locks there; the holder is then named as on another machine); where ``fcntl`` does not exist (Windows), or the
file system has no locks, nothing is locked (a warning says so).
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

RUN_LOCK = ".specdistill-run.lock"
BUILD_LOCK = ".specdistill-build.lock"

_held: dict[Path, int] = {}  # the resolved lock file -> the open descriptor that holds it
_created: set[Path] = set()  # lock files whose folder hold_folder created (release_folder removes it while empty)


class FolderInUse(Exception):
    """Another process holds the folder's lock; str() is the one line a user reads."""

    def __init__(self, folder: Path, holder: str) -> None:
        super().__init__(f"{folder} is in use by another run ({holder}); wait for it to end, stop it, or choose "
                         "another folder")


def hold_folder(folder: str | Path, name: str, *, waiting: str | None = None) -> None:
    """Lock `folder` (created if absent) through its lock file `name` until release_folder or the process's end.
    Without `waiting`, raises FolderInUse when another process holds it; with it, logs one line starting with
    `waiting` and waits. A no-op on ranks other than 0, where this process holds it already, or without locks."""
    path = Path(folder).expanduser().resolve() / name
    if fcntl is None or path in _held:
        return
    if int(os.environ.get("RANK", "0")) != 0:
        if waiting is None:
            refuse_as_the_main_process_will(path, Path(folder))
        return
    if not path.parent.exists():
        _created.add(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = None
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # for writing: NFS's emulation of flock needs it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = lock_holder(os.fstat(fd).st_ino)
            if waiting is None:
                os.close(fd)
                raise FolderInUse(Path(folder), holder) from None  # named as the user gave it
            logger.warning("%s: waiting for %s, which holds %s", waiting, holder, path)
            fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as err:  # a file system without locks (ENOLCK), a lock file of someone else's
        if fd is not None:
            os.close(fd)
        logger.warning("cannot lock %s (%s): another process writing there would not be kept out", path,
                       err.strerror or err)
        return
    _held[path] = fd


def refuse_as_the_main_process_will(path: Path, folder: Path) -> None:
    """On a process of a launch other than the main one: raise the FolderInUse the main process meets when a process
    of another launch holds `path` (its parent is not this process's launcher), so that every process of the
    launch stops at once with the same line (printed once: specdistill.cli.launch.print_once) instead of waiting
    for the main one in a collective until the launcher kills it. Held by this launch's main process, or not
    held: nothing. A holder on another machine is left to the main process."""
    try:
        inode = os.stat(path).st_ino
    except OSError:
        return
    pid = holder_pid(inode)
    if pid is None:
        return
    try:
        status = Path(f"/proc/{pid}/status").read_bytes().decode(errors="replace")  # the kernel's, not a user's
        parent = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
    except (OSError, StopIteration, ValueError):
        return
    if parent != os.getppid():
        raise FolderInUse(folder, lock_holder(inode))


def release_folder(folder: str | Path, name: str) -> None:
    """Let go of the lock hold_folder took on `folder` through `name` (nothing when this process holds none). A
    folder hold_folder created that holds nothing but the lock file goes too: a run refused by a later check leaves
    nothing behind."""
    path = Path(folder).expanduser().resolve() / name
    fd = _held.pop(path, None)
    if fd is None:
        return
    if path in _created and [p.name for p in path.parent.iterdir()] == [name]:
        path.unlink(missing_ok=True)  # still held: no other process locks the file on its way out
        path.parent.rmdir()
    _created.discard(path)
    os.close(fd)


def holder_pid(inode: int) -> int | None:
    """The pid holding a flock on the file with this inode, from /proc/locks (Linux; a line reads
    `1: FLOCK  ADVISORY  WRITE 3353 08:01:1234567 0 EOF`, a waiter's `1: -> FLOCK ...`); None when none shows."""
    try:
        lines = Path("/proc/locks").read_bytes().decode(errors="replace").splitlines()
    except OSError:
        return None
    for fields in (line.split() for line in lines):
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(inode):
            return int(fields[4])
    return None


def lock_holder(inode: int) -> str:
    """Who holds the flock on the file with this inode: "pid 3353: its command line", on one line, shortened."""
    pid = holder_pid(inode)
    if pid is None:
        return "a process on another machine, or one this machine does not show"
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"pid {pid}"
    command = " ".join(command.split())  # one line: a `python -c` program holds newlines
    return f"pid {pid}: {command[:117] + '...' if len(command) > 120 else command}"
