"""Step 1 of the quickstart, the corpus: the stdlib's code split by file, and its held-out prompts.

The quickstart corpus is the Python standard library's own ``.py`` source (~730 files, ~12 M characters once the
test suites are left out). It is text that is already on every machine that runs Python, so ``make quickstart``
needs no download, and it is code, where a small draft can learn to predict a target well.

The split is *by file*, decided by a hash of each file's path relative to the stdlib root (never by random state):
the same files are held out on every machine and every run, and no held-out file is ever seen in training, so the
evaluation prompts cut from held-out files are unseen code for the target and both drafts.

Outputs of :func:`build_corpus` (one directory):

- ``train.jsonl`` / ``heldout.jsonl``: ``{"text": str, "source": relpath}``, one document per file (or per chunk of
  at most ``max_chars_per_doc`` characters, cut at line boundaries).
- ``eval_prompts.jsonl``: ``{"prompt": str, "source": relpath, "line": int, "category": str}``, the opening
  ~``prompt_chars`` characters of ``def``/``class`` definitions in held-out files, each ending at the end of a line;
  ``category``: the file's stdlib package (``email``, ...; ``top-level`` outside packages), for ``by_category``.
- ``manifest.json``: parameters, counts, characters, Python version and the split rule; it doubles as the cache key.

The tokenizer trained on ``train.jsonl`` is in :mod:`scripts.quickstart_tokenizer`.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from decode.inputs.writes import write_atomic

CORPUS_FORMAT = 2  # 2: eval prompts carry a category

# Directory names whose contents are test suites (test/, tests/, idlelib/idle_test, lib2to3/tests, ...) or not the
# standard library at all (third-party packages installed next to it).
EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})

# A definition starts a line (possibly indented): def, async def or class followed by a name.
_DEFINITION = re.compile(r"^[ \t]*(?:async[ \t]+def|def|class)[ \t]+\w", re.MULTILINE)
_MIN_CONTINUATION_CHARS = 64  # a prompt is only taken where the file goes on for at least this much


@dataclass(frozen=True)
class CorpusPaths:
    """The files written by :func:`build_corpus` in ``out_dir``."""

    out_dir: Path
    train: Path
    heldout: Path
    eval_prompts: Path
    manifest: Path

    @classmethod
    def in_dir(cls, out_dir: Path) -> CorpusPaths:
        """The corpus file names inside ``out_dir`` (whether or not they exist yet)."""
        out_dir = Path(out_dir)
        return cls(out_dir, out_dir / "train.jsonl", out_dir / "heldout.jsonl", out_dir / "eval_prompts.jsonl",
                   out_dir / "manifest.json")

    def load_manifest(self) -> dict:
        """The manifest as a dict; raises ``FileNotFoundError`` if the corpus was never built here."""
        return json.loads(self.manifest.read_text(encoding="utf-8"))

    def manifest_sha256(self) -> str:
        """Hash of the manifest's bytes: identifies this exact corpus (used as the tokenizer's cache key)."""
        return hashlib.sha256(self.manifest.read_bytes()).hexdigest()


# ---------------------------------------------------------------- source files


def stdlib_root() -> Path:
    """The directory of this interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def _stable_fraction(key: str) -> float:
    """A number in [0, 1) fixed by ``key`` alone: the first 64 bits of its SHA-256."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2.0**64


def _is_utf8(path: Path) -> bool:
    try:
        path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def stdlib_source_files(limit_bytes: int | None = None) -> list[Path]:
    """The standard library's ``.py`` files, without test suites, site-packages or non-UTF-8 files; sorted.

    With ``limit_bytes``, a stable pseudo-random sample: files are taken in order of a hash of their relative path,
    skipping any that would take the total size past ``limit_bytes`` (the same sample wherever the stdlib is the same).
    """
    root = stdlib_root()
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)  # prune in place: os.walk skips them
        files.extend(Path(dirpath) / f for f in filenames if f.endswith(".py") and _is_utf8(Path(dirpath) / f))
    if limit_bytes is not None:
        budget, sample = limit_bytes, []
        for path in sorted(files, key=lambda p: _stable_fraction(p.relative_to(root).as_posix())):
            size = path.stat().st_size
            if size <= budget:
                sample.append(path)
                budget -= size
        files = sample
    return sorted(files)


def is_heldout(relpath: str, *, heldout_fraction: float, seed: int = 0) -> bool:
    """The split rule: a file is held out iff ``sha256(f"{seed}:{relpath}")``, read as a fraction, is below it."""
    return _stable_fraction(f"{seed}:{relpath}") < heldout_fraction


SPLIT_RULE = "heldout iff int(sha256(f'{seed}:{relpath}')[:8 bytes], big-endian) / 2**64 < heldout_fraction"


def _relpaths(files: Sequence[Path], root: Path | None) -> tuple[Path, list[str]]:
    """``(root, paths relative to it)``; by default the stdlib root if every file is inside it, else their common
    directory. Raises ``ValueError`` if a file is not under an explicit ``root``."""
    files = [Path(os.path.abspath(f)) for f in files]
    if root is None:
        std = Path(os.path.abspath(stdlib_root()))
        in_std = all(f.is_relative_to(std) for f in files)
        root = std if in_std else Path(os.path.commonpath([f.parent for f in files]))
    root = Path(os.path.abspath(root))
    return root, [f.relative_to(root).as_posix() for f in files]


# ---------------------------------------------------------------- documents and prompts


def chunk_at_lines(text: str, max_chars: int | None) -> list[str]:
    """Cut ``text`` into pieces of at most ``max_chars`` characters at line ends; ``"".join(pieces) == text``.

    A single line longer than ``max_chars`` is cut inside the line. ``None`` keeps the text whole.
    """
    if max_chars is None or len(text) <= max_chars:
        return [text] if text else []
    pieces: list[str] = []
    current = ""
    for line in text.splitlines(keepends=True):
        if current and len(current) + len(line) > max_chars:
            pieces.append(current)
            current = ""
        while len(line) > max_chars:
            pieces.append(line[:max_chars])
            line = line[max_chars:]
        current += line
    if current:
        pieces.append(current)
    return pieces


def definition_prompts(text: str, prompt_chars: int = 200) -> list[tuple[int, str]]:
    """``(line number, prompt)`` for each ``def``/``class`` in ``text`` that the file continues past.

    A prompt is the definition's opening text, cut at the last line end within ``prompt_chars`` characters (the
    newline itself is left out: a byte-level BPE splits before whitespace, so the prompt's tokens are exactly the
    tokens this text has inside the whole file). A first line longer than ``prompt_chars`` is cut mid-line.
    """
    prompts = []
    for match in _DEFINITION.finditer(text):
        start = match.start()
        window = text[start:start + prompt_chars]
        cut = window.rfind("\n")
        prompt = window[:cut] if cut > 0 else window
        if len(text) - (start + len(prompt)) < _MIN_CONTINUATION_CHARS or not prompt.strip():
            continue
        prompts.append((text.count("\n", 0, start) + 1, prompt))
    return prompts


def _select_prompts(candidates: dict[str, list[tuple[int, str]]], num_prompts: int, seed: int) -> list[dict]:
    """Round-robin over held-out files (one prompt per file per pass), each file's definitions in hash order."""
    queues = {
        source: sorted(items, key=lambda item: _stable_fraction(f"{seed}:{source}:{item[0]}"))
        for source, items in sorted(candidates.items())
    }
    chosen: list[dict] = []
    seen: set[str] = set()
    depth = 0
    while len(chosen) < num_prompts and any(depth < len(q) for q in queues.values()):
        for source, queue in queues.items():
            if depth < len(queue) and len(chosen) < num_prompts and queue[depth][1] not in seen:
                line, prompt = queue[depth]
                seen.add(prompt)
                category = source.split("/")[0] if "/" in source else "top-level"  # the stdlib package
                chosen.append({"prompt": prompt, "source": source, "line": line, "category": category})
        depth += 1
    return chosen


def _write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    """Write rows to ``path`` atomically (decode.inputs.writes.write_atomic)."""
    write_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def read_jsonl(path: Path) -> Iterator[dict]:
    """The rows of a JSON-lines file, one dict per line."""
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def load_eval_prompts(paths: CorpusPaths) -> list[str]:
    """The evaluation prompts (strings, in file order) of a built corpus."""
    return [row["prompt"] for row in read_jsonl(paths.eval_prompts)]


# ---------------------------------------------------------------- corpus


@dataclass
class _SplitDocuments:
    """What reading the files produced: documents per split, their counts, and prompt candidates per held-out file."""

    documents: dict[str, list[dict]] = field(default_factory=lambda: {"train": [], "heldout": []})
    counts: dict[str, dict[str, int]] = field(
        default_factory=lambda: {s: {"files": 0, "documents": 0, "chars": 0} for s in ("train", "heldout")})
    skipped: dict = field(default_factory=lambda: {"not_utf8": [], "empty": 0})
    prompt_candidates: dict[str, list[tuple[int, str]]] = field(default_factory=dict)


def _read_and_split(files: Sequence[Path], relpaths: Sequence[str], *, heldout_fraction: float, seed: int,
                    max_chars_per_doc: int | None, prompt_chars: int, progress: bool) -> _SplitDocuments:
    """Read each file, assign it to a split by :func:`is_heldout`, chunk it, and collect held-out prompts."""
    out = _SplitDocuments()
    for path, rel in zip(tqdm(files, desc="reading source files", unit="file", disable=not progress), relpaths):
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            out.skipped["not_utf8"].append(rel)
            continue
        if not text.strip():
            out.skipped["empty"] += 1
            continue
        split = "heldout" if is_heldout(rel, heldout_fraction=heldout_fraction, seed=seed) else "train"
        pieces = chunk_at_lines(text, max_chars_per_doc)
        out.documents[split].extend({"text": piece, "source": rel} for piece in pieces)
        out.counts[split]["files"] += 1
        out.counts[split]["documents"] += len(pieces)
        out.counts[split]["chars"] += len(text)
        if split == "heldout":
            out.prompt_candidates[rel] = definition_prompts(text, prompt_chars)
    return out


def build_corpus(
    out_dir: Path,
    *,
    files: Sequence[Path] | None = None,
    root: Path | None = None,
    heldout_fraction: float = 0.05,
    seed: int = 0,
    max_chars_per_doc: int | None = None,
    prompt_chars: int = 200,
    num_prompts: int = 64,
    progress: bool = True,
) -> CorpusPaths:
    """Write the train/held-out documents, evaluation prompts and manifest to ``out_dir``; see the module docstring.

    ``files`` defaults to :func:`stdlib_source_files`; ``root`` (the base of each document's ``source``) defaults
    to the stdlib root, or to the files' common directory when they are not all inside it. If ``out_dir`` already
    holds a manifest with the same parameters and file list, nothing is rebuilt.
    Raises ``ValueError`` for a fraction outside (0, 1), a non-positive size, or an empty file list.
    """
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction={heldout_fraction!r}: expected a fraction strictly between 0 and 1")
    for name, value in (("max_chars_per_doc", max_chars_per_doc), ("prompt_chars", prompt_chars),
                        ("num_prompts", num_prompts)):
        if value is not None and value <= 0:
            raise ValueError(f"{name}={value!r}: expected a positive integer")
    files = stdlib_source_files() if files is None else [Path(f) for f in files]
    if not files:
        raise ValueError("build_corpus got an empty file list")
    root, relpaths = _relpaths(files, root)
    order = sorted(range(len(files)), key=lambda i: relpaths[i])
    files, relpaths = [files[i] for i in order], [relpaths[i] for i in order]

    file_list = "".join(f"{rel}\t{path.stat().st_size}\n" for rel, path in zip(relpaths, files))
    params = {
        "format": CORPUS_FORMAT, "heldout_fraction": heldout_fraction, "seed": seed,
        "max_chars_per_doc": max_chars_per_doc, "prompt_chars": prompt_chars, "num_prompts": num_prompts,
        "files_sha256": hashlib.sha256(file_list.encode("utf-8")).hexdigest(),
    }
    paths = CorpusPaths.in_dir(out_dir)
    if paths.manifest.exists() and paths.load_manifest().get("params") == params \
            and all(p.exists() for p in (paths.train, paths.heldout, paths.eval_prompts)):
        return paths
    paths.out_dir.mkdir(parents=True, exist_ok=True)
    paths.manifest.unlink(missing_ok=True)  # a run that dies half-way must not leave a valid-looking cache

    split = _read_and_split(files, relpaths, heldout_fraction=heldout_fraction, seed=seed,
                            max_chars_per_doc=max_chars_per_doc, prompt_chars=prompt_chars, progress=progress)
    prompts = _select_prompts(split.prompt_candidates, num_prompts, seed)
    _write_jsonl(paths.train, split.documents["train"])
    _write_jsonl(paths.heldout, split.documents["heldout"])
    _write_jsonl(paths.eval_prompts, prompts)
    manifest = {
        "params": params,
        "python_version": platform.python_version(),
        "source_root": str(root),
        "split_rule": SPLIT_RULE,
        "counts": split.counts,
        "skipped": split.skipped,
        "eval_prompts": len(prompts),
        "heldout_sources": sorted(split.prompt_candidates),
    }
    # written last: its presence means the corpus is complete
    write_atomic(paths.manifest, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return paths
