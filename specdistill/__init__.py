"""The top floor: where a command or a recipe names a draft kind, the kind is chosen once (the registry in
kinds/__init__.py) and handed down as a value to decode/ and distill/, which never look a kind up.

    specdistill/cli/      the console commands (specdistill JOB ..., specdistill-eval, -train, -check, -data, -push)
    specdistill/pipeline.py   a training run from a recipe: check, load, tokenise, distil, measure, export
    specdistill/recipes.py    the recipe schema of every registered kind, and loading a recipe file with it

The floors, each importing only those below it: decode/ (the decoder and its measurements), distill/ (the trainer),
kinds/ (one folder per kind of draft, plug-ins into both), specdistill/ (this package).
"""
