import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests/tiny.py
sys.path.insert(0, str(Path(__file__).parents[1]))  # scripts/

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)  # tiny models: one thread is faster and leaves the other core to subprocess tests


# The files that take longest (minutes each on 2 cores: engine starts, multi-process launches, every docs example),
# longest first. `make test` hands whole files to its workers in collection order (pytest-xdist --dist loadfile), so
# these go first and the many short files fill in behind them, instead of one worker running the vLLM file alone at
# the end.
LONGEST_FIRST = ("test_docs_examples_heavy.py", "test_speculators_format.py", "test_serving_vllm.py",
                 "test_bench_serve.py", "test_launch_lines.py", "test_docs_examples.py", "test_decode_compile.py",
                 "test_fsdp.py", "test_preemption.py", "test_head_decode.py",
                 "test_bench_distill.py", "test_pard.py", "test_hidden_cache.py", "test_dead_rank.py",
                 "test_gguf.py", "test_p_eagle.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def rows_seen(monkeypatch) -> list:
    """The training rows (a datasets.Dataset) of every run made in the test, as specdistill.cli.train hands them to
    DistillTrainer."""
    from distill.run.trainer import DistillTrainer
    from kinds import kind_named

    seen = []

    class Recording(DistillTrainer):
        def __init__(self, *args, **kwargs):
            seen.append(kwargs["train_dataset"])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(kind_named("standalone"), "trainer", lambda: Recording)  # what a standalone run trains with
    return seen
