"""The docs' examples that run the real model (SmolLM2-135M-Instruct's GGUF, which `make install` brings) or vLLM
(the serving venv of `make serving`): minutes each on 2 cores, so in a file of their own that a second test worker
takes (tests/test_docs_examples.py runs the rest and holds the collector). Without a vLLM interpreter the pages that
need one are skipped, as tests/test_serving_vllm.py is. The guides' pages come before the benchmark pages; with
SPECDISTILL_DOCS_DEADLINE (a Unix time: CI's budget, .ci/run) no example starts after it and the pages left are
reported skipped.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_docs_examples import NEEDS_VLLM, page_params, run_page, runnable, runnable_pages, tiny_world  # noqa: F401

from decode.serving.vllm_engine import ServingError, find_vllm_python

pytestmark = pytest.mark.integration


def has_vllm() -> bool:
    try:
        find_vllm_python()
    except ServingError:
        return False
    return True


DEADLINE_ENV = "SPECDISTILL_DOCS_DEADLINE"


def deadline() -> float | None:
    value = os.environ.get(DEADLINE_ENV, "").strip()
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        raise pytest.UsageError(f"{DEADLINE_ENV}={value!r}: expected a Unix time in seconds") from None


def guides_first(pages: list[Path]) -> list[Path]:
    """What users type first (the guides, getting started), the benchmark pages after: under a time budget the pages
    left out are benchmarks' smoke runs."""
    return sorted(pages, key=lambda page: "benchmarks" in page.parts)


@pytest.mark.parametrize("page", page_params(guides_first(runnable_pages(heavy_ones=True))))
def test_the_examples_of_a_heavy_page_run(page, tiny_world, tmp_path):
    if any(NEEDS_VLLM.search(e.code) for e in runnable(page)) and not has_vllm():
        pytest.skip("no vLLM interpreter (make serving)")
    run_page(page, tiny_world, tmp_path, deadline())
