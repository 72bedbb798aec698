"""A resumable store of `datasets` shards: one folder, one JSON metadata file, shards written atomically.

Used by the cached teacher (distill/data/teacher_cache.py) and the target's responses (distill/data/target_data.py):
    store = ShardStore(out_dir, "teacher_cache.json", "teacher cache")
    metadata = store.start(spec, num_rows=len(rows), rows_per_shard=1024, overwrite=False)
    if not metadata["complete"]:
        store.fill(metadata, lambda index, rows, scratch: make_dataset(rows), bar)
        store.finish(metadata)
    shards = store.load_shards(metadata)

Layout on disk:
    <metadata_file>        the spec the rows depend on, "complete", rows_per_shard, num_shards (+ the caller's keys)
    shards/shard-00000/    `datasets` save_to_disk folders of rows_per_shard rows each
A folder holding a build of the same spec is resumed after its last complete shard (or returned when complete);
one of another spec raises CacheMismatchError naming every difference, unless overwrite=True deletes it. Every shard
holds a manifest of its files' sha256 digests (decode.inputs.manifest), written before the shard's rename; a shard
whose bytes changed since (a flipped bit, a partial copy) is deleted with one warning and built again, in a complete
build as in an interrupted one. SIGTERM, SIGINT, SIGUSR1 or SIGHUP during `fill` (a scheduler's preemption, Ctrl-C, a
terminal that closes; SIGHUP not where it is ignored, as under nohup) lets the shard in progress finish and stops
with ShardBuildStopped (the commands exit 75 with one line); running the same command again resumes after it. A
second SIGINT exits at once (130).

One builder at a time: `start` holds the folder's build lock (decode.inputs.folder_lock) until `finish`, so the runs
of a sweep started at once that share a cache wait for the one building it (one line says for which process) and
find it complete, instead of writing the same shards over each other.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
from tqdm.auto import tqdm

from decode.inputs.checks import read_text
from decode.inputs.folder_lock import BUILD_LOCK, hold_folder, release_folder
from decode.inputs.manifest import manifest_problems, write_manifest
from decode.inputs.writes import write_atomic
from distill.utils import (
    INTERRUPTED_TWICE_EXIT,
    crash_point,
    folder_bytes,
    human_bytes,
    leave_a_closed_terminal,
    no_space,
    out_of_space,
    stop_signals,
)

logger = logging.getLogger(__name__)

SHARDS_DIR = "shards"


class CacheMismatchError(ValueError):
    """A cache (or generated data) was built for another target, tokenizer, dataset or setting."""


@dataclass
class ShardBuildStopped(Exception):
    """A build stopped on a signal at a shard boundary: `done` of `total` shards are on disk in `root`."""

    signal_name: str
    what: str
    done: int
    total: int
    root: str

    def __str__(self) -> str:
        return (f"stopped by {self.signal_name} after {self.done} of {self.total} {self.what} shards, kept in "
                f"{self.root}; run the same command again to resume")


@contextlib.contextmanager
def signals_noted() -> Iterator[list[int]]:
    """While inside: the stop signals (distill.utils.stop_signals) are noted in the yielded list instead of killing
    the process (a second SIGINT exits at once with 130); the previous handlers come back after. Outside the main
    thread: nothing is handled (the list stays empty)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def note(signum: int, frame) -> None:
        leave_a_closed_terminal(signum)
        if received and signum == signal.SIGINT:
            os._exit(INTERRUPTED_TWICE_EXIT)
        if not received:
            logger.warning("%s received: finishing the shard in progress, then stopping", signal.Signals(signum).name)
        received.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in stop_signals()}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def spec_differences(stored: dict[str, Any], wanted: dict[str, Any], what: str,
                     meanings: Mapping[str, str] = {}) -> list[str]:
    """One line per key whose stored value (from a {what}'s metadata) differs from the wanted one."""
    return [f"{meanings.get(key, key)} ({key}): {stored.get(key)!r} in the {what}, expected {value!r}"
            for key, value in wanted.items() if stored.get(key) != value]


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """No `datasets` progress bars inside (the callers show one bar of their own), restored after."""
    were_off = datasets.utils.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not were_off:
            datasets.enable_progress_bars()


# builds the dataset of one shard: (shard index, its rows, an empty scratch folder removed afterwards) -> rows
MakeShard = Callable[[int, range, Path], datasets.Dataset]


@dataclass(frozen=True)
class ShardStore:
    """The folder `root` holding one resumable build; `what` names it in errors ("teacher cache"), `meanings`
    gives spec keys plain names there."""

    root: Path
    metadata_file: str
    what: str
    meanings: Mapping[str, str] = field(default_factory=dict)

    def shard_path(self, index: int) -> Path:
        return self.root / SHARDS_DIR / f"shard-{index:05d}"

    def read_metadata(self) -> dict[str, Any] | None:
        meta = self.root / self.metadata_file
        return json.loads(read_text(meta)) if meta.is_file() else None

    def write_metadata(self, metadata: dict[str, Any]) -> None:
        write_atomic(self.root / self.metadata_file, json.dumps(metadata, indent=2, sort_keys=True) + "\n")

    def differences(self, stored: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
        return spec_differences(stored, wanted, self.what, self.meanings)

    def _existing(self, spec: dict[str, Any], overwrite: bool) -> dict[str, Any] | None:
        """The metadata already here when it was built from `spec` (to reuse or resume), else None.

        Raises CacheMismatchError when the folder holds a build from another spec and overwrite is False; with
        overwrite the old build is deleted.
        """
        stored = self.read_metadata()
        if stored is None:
            return None
        differences = self.differences(stored, spec)
        if not differences:
            return stored
        if not overwrite:
            raise CacheMismatchError(f"{self.root} already holds a {self.what} built from other inputs; use another "
                                     f"folder or overwrite=True. Differences:\n  " + "\n  ".join(differences))
        shutil.rmtree(self.root / SHARDS_DIR, ignore_errors=True)
        (self.root / self.metadata_file).unlink()
        return None

    def start(self, spec: dict[str, Any], *, num_rows: int, rows_per_shard: int, size_key: str = "rows_per_shard",
              overwrite: bool = False, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The metadata of this build: a complete one of `spec` as stored, else a new or interrupted one (written
        back with complete False; an interrupted build keeps its own shard size, stored under `size_key`)."""
        self.root.mkdir(parents=True, exist_ok=True)
        hold_folder(self.root, BUILD_LOCK, waiting=f"{self.what} {self.root}")  # one builder; let go by finish
        stored = self._existing(spec, overwrite)
        if stored is not None and stored["complete"]:
            if not self.drop_corrupt_shards(stored["num_shards"]):
                release_folder(self.root, BUILD_LOCK)
                return stored
            stored["complete"] = False  # the callers fill what was dropped, then finish
            self.write_metadata(stored)
            return stored
        size = stored[size_key] if stored is not None else rows_per_shard
        metadata = {**spec, "complete": False, size_key: size, "num_shards": math.ceil(num_rows / size),
                    **(extra or {})}
        self.write_metadata(metadata)
        return metadata

    def fill(self, metadata: dict[str, Any], num_rows: int, make: MakeShard, bar: tqdm,
             size_key: str = "rows_per_shard") -> None:
        """Write every shard not on disk yet (make(index, rows, scratch)); a shard already there only moves
        `bar` on by its rows."""
        size, total = metadata[size_key], metadata["num_shards"]
        self.drop_corrupt_shards(total)
        with signals_noted() as received:
            for index in range(total):
                rows = range(index * size, min((index + 1) * size, num_rows))
                if self.shard_path(index).is_dir():
                    bar.update(len(rows))
                    continue
                scratch = self.root / f".generator-{index:05d}"
                shutil.rmtree(scratch, ignore_errors=True)  # left over by an interrupted build
                self.write_shard(lambda: make(index, rows, scratch), index)
                shutil.rmtree(scratch, ignore_errors=True)
                if received and index + 1 < total:
                    done = sum(self.shard_path(i).is_dir() for i in range(total))
                    raise ShardBuildStopped(signal.Signals(received[0]).name, self.what, done, total, str(self.root))

    def write_shard(self, make: Callable[[], datasets.Dataset], index: int) -> None:
        """Save the dataset `make()` returns as shard `index`, atomically (a half-written shard never looks done)."""
        final = self.shard_path(index)
        partial = final.with_name(final.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        try:
            with quiet_datasets():
                make().save_to_disk(str(partial))
            write_manifest(partial)
        except OSError as err:
            if not out_of_space(err):
                raise
            written = folder_bytes(partial)
            shutil.rmtree(partial, ignore_errors=True)
            kept = (f"the {index} shards before it are kept; free space, then run the same command again to resume"
                    if index else "free space, then run the same command again")
            raise no_space(self.root, f"{self.what} shard {index} ({human_bytes(written)} written)", kept,
                           max(written, self.shard_bytes(index))) from None
        os.replace(partial, final)
        crash_point("shard-written")  # test hook: SPECDISTILL_KILL_AT=shard-written:K kills -9 after the K-th shard

    def shard_bytes(self, index: int) -> int:
        """The size of the shard before `index` on disk (0 for the first): about what the next one needs."""
        return folder_bytes(self.shard_path(index - 1)) if index else 0

    def drop_corrupt_shards(self, num_shards: int) -> list[int]:
        """Delete every shard on disk whose files differ from its manifest (one warning each): it is built again.
        Returns their indices. A shard without a manifest (written before manifests) is kept."""
        dropped = []
        for index in range(num_shards):
            path = self.shard_path(index)
            problems = manifest_problems(path) if path.is_dir() else None
            if problems:
                logger.warning("%s shard %s is not what was written (%s): building it again", self.what, path,
                               problems[0])
                shutil.rmtree(path)
                dropped.append(index)
        return dropped

    def finish(self, metadata: dict[str, Any], **summary: Any) -> dict[str, Any]:
        """Mark the build complete (with `summary` keys added), write it and let go of the build's lock; returns the
        metadata."""
        metadata.update(complete=True, **summary)
        self.write_metadata(metadata)
        release_folder(self.root, BUILD_LOCK)
        return metadata

    def load_shards(self, metadata: dict[str, Any]) -> list[datasets.Dataset]:
        """Every shard of a complete build, memory-mapped, in order."""
        return [datasets.load_from_disk(str(self.shard_path(i))) for i in range(metadata["num_shards"])]

    def bytes_on_disk(self) -> int:
        return sum(f.stat().st_size for f in self.root.rglob("*") if f.is_file())
