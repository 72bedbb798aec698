"""Publish a trained draft to the Hub: `python scripts/push_to_hub.py OUTPUT_DIR --repo-id you/draft`.

Runs specdistill.cli.push (installed as the console command `specdistill-push`) by path, from any folder.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # run by path: the repository's packages first, whatever the current folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdistill.cli.push import cli

if __name__ == "__main__":
    cli()
