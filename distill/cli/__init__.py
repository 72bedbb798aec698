"""The training side's console commands: ``specdistill-train`` (distill.cli.train), ``specdistill-push``
(distill.cli.push) and ``specdistill-data`` (distill.cli.data); and the umbrella ``specdistill JOB ...`` over every
job of both sides (distill.cli.main), whose reference page distill.cli.reference generates. ``scripts/train.py``,
``scripts/push_to_hub.py`` and ``scripts/build_data.py`` run the same code by path."""
