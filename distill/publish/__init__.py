"""Step 6, export, and what a user publishes: the best checkpoint as a model folder (export.py), the report over
seeds (seed_spread.py, report.py), the model card (model_card.py, its usage snippets in card_usage.py) and the hub
upload (hub.py). Nothing is imported here."""
