"""The training side's console commands: ``specdistill-train`` (distill.cli.train) and ``specdistill-push``
(distill.cli.push). ``scripts/train.py`` and ``scripts/push_to_hub.py`` run the same code by path."""
