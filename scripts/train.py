"""Train a draft model: `python scripts/train.py RECIPE.yaml key=value ...`.

Runs specdistill.cli.train (installed as the console command `specdistill-train`) by path, from any folder.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # run by path: the repository's packages first, whatever the current folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdistill.cli.launch import check_launch

if __name__ == "__main__":
    check_launch("specdistill-train")  # a GPU launch without a GPU stops here, before the trainer is imported
    from specdistill.cli.train import cli
    cli()
