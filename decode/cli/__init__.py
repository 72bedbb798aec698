"""The decode side's console commands: ``specdistill-eval`` (decode.cli.eval) and ``specdistill-check``
(decode.cli.check). ``scripts/eval_acceptance.py`` and ``scripts/check_deploy.py`` run the same code by path."""
