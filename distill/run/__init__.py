"""The run's steps 1, 4 and 5: check everything before a weight loads (preflight.py), distil (distil.py) with
one transformers.Trainer (trainer.py; a kind trains with its own subclass, kinds/<kind>/trainer.py), and measure
acceptance at every checkpoint (callbacks.py). specdistill.pipeline runs them with steps 2, 3 and 6. Nothing is
imported here."""
