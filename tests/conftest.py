import sys
from pathlib import Path
import os

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests/tiny.py
sys.path.insert(0, str(Path(__file__).parents[1]))  # scripts/

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)  # tiny models: one thread is faster and leaves the other core to subprocess tests


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def rows_seen(monkeypatch) -> list:
    """The training rows (a datasets.Dataset) of every run made in the test, as distill.cli.train hands them to
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
