"""Check that a draft serves next to its target: `python scripts/check_deploy.py --target T --draft D`.

Runs specdistill.cli.check (installed as the console command `specdistill-check`) by path, from any folder.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # run by path: the repository's packages first, whatever the current folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdistill.cli.check import cli

if __name__ == "__main__":
    cli()
