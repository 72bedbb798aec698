"""The docs' examples that run the real model (SmolLM2-135M-Instruct's GGUF, which `make install` brings) or vLLM
(the serving venv of `make serving`): minutes each on 2 cores, so in a file of their own that a second test worker
takes (tests/test_docs_examples.py runs the rest and holds the collector). Without a vLLM interpreter the pages that
need one are skipped, as tests/test_serving_vllm.py is.
"""
from __future__ import annotations

import pytest
from test_docs_examples import NEEDS_VLLM, ROOT, run_page, runnable, runnable_pages, tiny_world  # noqa: F401

from decode.serving.vllm_engine import ServingError, find_vllm_python

pytestmark = pytest.mark.integration


def has_vllm() -> bool:
    try:
        find_vllm_python()
    except ServingError:
        return False
    return True


@pytest.mark.parametrize("page", runnable_pages(heavy_ones=True), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_examples_of_a_heavy_page_run(page, tiny_world, tmp_path):
    if any(NEEDS_VLLM.search(e.code) for e in runnable(page)) and not has_vllm():
        pytest.skip("no vLLM interpreter (make serving)")
    run_page(page, tiny_world, tmp_path)
