"""What the decoder reads: models and tokenizers (a .gguf converted once), prompt files and datasets, and the checks
made on them before anything heavy runs."""
