"""`python -m specdistill JOB ...`: the same as the `specdistill` command (specdistill.cli.main), for an environment
whose scripts folder is not on PATH."""
from specdistill.cli.main import cli

if __name__ == "__main__":
    cli()
