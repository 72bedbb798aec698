"""The recipe (the input of step 1, check): the thin layer over pydantic (schema.py), YAML that refuses duplicate
keys (strict_yaml.py), the sections as pydantic models (data_config.py, train_config.py, sections.py: `Recipe`) and
recipe files read with their overrides (loader.py; `python -m specdistill.recipes` prints the key reference).
Nothing is imported here."""
