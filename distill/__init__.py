"""specdistill's training side: distil a small draft model from a frozen target LLM for speculative decoding.

The layout follows a run's six steps (distill.pipeline.run_recipe) and the concerns around them; each subpackage
uses only those listed above it (docs/developer/index.md, "Where things are"; tests/test_structure.py):

    distill.utils, distill.fingerprints   small shared things; hashes of models, vocabularies and token lists
    distill.losses     the objectives: divergences (the DIVERGENCES table), loss_mix (distill.loss as a weighted
                       combination), distill_loss (the chunked batch loss) and fused, head_loss (EAGLE-3 heads)
    distill.recipe     the recipe: pydantic sections (`Recipe`, recipe.sections), files and overrides (recipe.loader:
                       `load_recipe`), strict YAML; train: is TrainingArguments' own fields (recipe.train_config)
    distill.models     step 2, load: the frozen target and the draft (models.load), LoRA, EAGLE-3 heads, FSDP2 and
                       DeepSpeed ZeRO-3 placement
    distill.data       step 3, tokenise: training rows, text files, the target's responses, the teacher cache,
                       on-policy rows, all mixed by data.sources
    distill.outputs    what a run leaves in its output folder: acceptance.jsonl, checkpoints, train_results.json
    distill.publish    step 6, export (publish.export), the report over seeds, the model card, the hub upload
    distill.run        step 1, check (run.preflight); step 4, distil (run.trainer, run.head_trainer); step 5,
                       measure (run.callbacks)
    distill.pipeline   `run_recipe`: the six steps in order, each one call into its subpackage

Entry points: distill.cli.train (`specdistill-train`, around distill.pipeline.run_recipe) and distill.cli.push
(`specdistill-push`); in a checkout `scripts/train.py` and `scripts/push_to_hub.py` run them by path.
Nothing is imported here (nor in the subpackages' __init__), so that `import distill.losses.divergences` stays light.
"""
