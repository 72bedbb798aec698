"""Build training data once: `python scripts/build_data.py responses --target T --prompts P --out DIR`.

Runs specdistill.cli.data (installed as the console command `specdistill-data`) by path, from any folder.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # run by path: the repository's packages first, whatever the current folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdistill.cli.data import cli

if __name__ == "__main__":
    cli()
