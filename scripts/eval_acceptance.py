"""Measure a draft against its target: `python scripts/eval_acceptance.py --target T --draft D --prompts P`.

Runs specdistill.cli.eval (installed as the console command `specdistill-eval`) by path, from any folder.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # run by path: the repository's packages first, whatever the current folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdistill.cli.eval import cli

if __name__ == "__main__":
    cli()
