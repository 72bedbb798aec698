"""What a run leaves in its output folder, read by the run and by publishing alike: acceptance.jsonl and the best
checkpoint rule (acceptance_log.py), checkpoints complete or absent (checkpoints.py), the recipe copy and
train_results.json (run_folder.py). Nothing is imported here."""
