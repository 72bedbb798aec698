"""The console commands: the umbrella ``specdistill JOB ...`` over every job (specdistill.cli.main, whose reference
page specdistill.cli.reference generates), ``specdistill-train`` (train), ``specdistill-eval`` (eval),
``specdistill-check`` (check), ``specdistill-data`` (data), ``specdistill-push`` (push) and the launch lines of
``specdistill launch`` (launch). The scripts in scripts/ run the same code by path."""
