"""specdistill's training side: distil a small draft from a frozen target LLM for speculative decoding.

The layout follows a run's six steps (specdistill.pipeline.run_recipe runs them) and the concerns around them; each
subpackage uses only those listed above it (docs/developer/index.md, "Where things are"; tests/test_structure.py).
Nothing here looks a kind of draft up: the kind comes down as a value (a recipe's `recipe.model.kind`, an argument),
and each subpackage asks it only what its protocol says (recipe.sections.RecipeKind, models.served.TrainingKind,
publish.card_text.PublishingKind).

    distill.utils, distill.fingerprints   small shared things; hashes of models, vocabularies and token lists
    distill.losses     the objectives: divergences (the DIVERGENCES table), loss_mix (distill.loss as a weighted
                       combination), distill_loss (the chunked batch loss) and fused
    distill.recipe     the recipe: pydantic sections (`Recipe`, `recipe_schema`: recipe.sections), files and overrides
                       (recipe.loader), strict YAML; train: is TrainingArguments' own fields (recipe.train_config)
    distill.models     step 2, load: the frozen target and the draft (models.load), the served draft inside its
                       training wrapper (models.served), LoRA, FSDP2 and DeepSpeed ZeRO-3 placement
    distill.data       step 3, tokenise: training rows, text files, the target's responses, the teacher cache,
                       on-policy rows, all mixed by data.sources
    distill.outputs    what a run leaves in its output folder: acceptance.jsonl, checkpoints, train_results.json
    distill.publish    step 6, export (publish.export), the report over seeds, the model card, the hub upload
    distill.run        step 1, check (run.preflight); step 4, distil (run.distil with run.trainer's DistillTrainer);
                       step 5, measure (run.callbacks)

Entry points (specdistill/cli/): `specdistill-train` around specdistill.pipeline.run_recipe, `specdistill-push`,
`specdistill-data`. Nothing is imported here (nor in the subpackages' __init__), so that
`import distill.losses.divergences` stays light.
"""
