"""Local data files: which `datasets` builder reads each suffix (the one map), and one-line explanations for files
that `datasets` refuses with a generic message (or a bare StopIteration): an empty file, and the first line of a
.json/.jsonl file that is not valid JSON; `datasets`' own log of such a file is held back while it reads
(`own_error_lines`), so that the one line is the only one; and the one line for a cache `datasets` cannot write
(`cache_write_problem`: a read-only or full home, HF_HOME naming a file)."""
from __future__ import annotations

import contextlib
import errno
import json
import logging
from collections.abc import Iterator
from pathlib import Path

from decode.inputs.checks import read_text

# file suffix -> the datasets builder that reads it (load_dataset(builder, data_files=...))
DATA_FILE_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
TEXT_DATA_SUFFIXES = tuple(s for s, builder in DATA_FILE_BUILDERS.items() if builder != "parquet")  # text files
# datasets' builders that log a file they cannot parse at ERROR before raising (the caller's line names it better)
BUILDER_LOGGERS = tuple(f"datasets.packaged_modules.{name}.{name}" for name in ("json", "csv", "parquet"))


@contextlib.contextmanager
def own_error_lines() -> Iterator[None]:
    """While datasets reads local files: its builders' ERROR logs (`Failed to load JSON from file ... with error
    ...: JSON parse error: ...`) held back, since the caller answers that failure in one line of its own
    (first_bad_json_line: file and line); its levels restored after."""
    loggers = [logging.getLogger(name) for name in BUILDER_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def first_empty_file(files: list[str]) -> str | None:
    """The first file holding nothing but whitespace (datasets fails on it with a bare StopIteration), else None."""
    for file in files:
        path = Path(file)
        if path.stat().st_size == 0 or (path.suffix != ".parquet" and _blank(path)):
            return file
    return None


def _blank(path: Path) -> bool:
    with path.open("rb") as f:
        return not any(chunk.strip() for chunk in iter(lambda: f.read(1 << 20), b""))


def first_bad_json_line(files: list[str]) -> str | None:
    """'FILE:LINE: not valid JSON (reason)' for the first malformed row of .json/.jsonl files, else None.

    A .json file may hold one JSON document (an array or an object) or JSON lines, as datasets reads both.
    """
    for file in files:
        path = Path(file)
        if DATA_FILE_BUILDERS.get(path.suffix) != "json":
            continue
        text = read_text(path)  # the file passed check_text_file before datasets read it
        if path.suffix == ".json":
            try:
                json.loads(text)
                continue
            except json.JSONDecodeError as err:
                if text.lstrip().startswith("["):  # one document: its error position is the answer
                    return f"{file}:{err.lineno}: not valid JSON ({err.msg})"
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                return f"{file}:{number}: not valid JSON ({err.msg})"
            if not isinstance(row, dict):
                return f"{file}:{number}: expected a JSON object per line, got {type(row).__name__}"
    return None


def cache_write_problem(err: OSError) -> str | None:
    """The line for an OSError that `datasets` met writing its cache (every local file it reads is written there as
    Arrow first): the cache folder, the reason and the fix; None for an OSError about anything else."""
    import datasets

    cache = Path(datasets.config.HF_DATASETS_CACHE)
    name = Path(err.filename) if getattr(err, "filename", None) else None
    about_cache = name is not None and (name == cache or name in cache.parents or cache in name.parents)
    if not about_cache and err.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    reason = err.strerror or type(err).__name__
    return (f"datasets cannot write its cache in {cache} ({reason}): set HF_DATASETS_CACHE (or HF_HOME) to a "
            "writable folder with room")
