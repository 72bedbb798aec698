"""Serve a target alone and with its draft, load both over HTTP: `python scripts/bench_serve.py --target T --draft D
--prompts P --output served.json`.

Runs specdistill.cli.bench_serve (installed as the console command `specdistill-bench-serve`) by path, from any folder.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # run by path: the repository's packages first, whatever the current folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdistill.cli.bench_serve import cli

if __name__ == "__main__":
    cli()
