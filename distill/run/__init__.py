"""The run's steps 1, 4 and 5: check everything before a weight loads (preflight.py), distil with one
transformers.Trainer (trainer.py; an EAGLE-3 head: head_trainer.py), and measure acceptance at every checkpoint
(callbacks.py). distill.pipeline runs them with steps 2, 3 and 6. Nothing is imported here."""
