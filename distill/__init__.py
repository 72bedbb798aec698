"""specdistill's training side: distil a small draft model from a frozen target LLM for speculative decoding.

    distill.config         typed recipes: `Recipe` and one pydantic model per section (distill.recipe_loader:
                           `load_recipe`; train: TrainingArguments' fields, distill.train_config)
    distill.models         frozen target; draft from a checkpoint, a subset of target layers, or a config
    distill.data           text packing, chat with assistant-only labels, held-out acceptance prompts
    distill.losses         per-token divergences: the DIVERGENCES table (value and closed-form gradient)
    distill.loss_mix       distill.loss as a weighted combination of losses with linear schedules
    distill.distill_loss   the batch loss (sums over kept tokens), chunked over the vocabulary projection;
                           distill.fused is its closed-form-gradient path for a plain lm_head
    distill.lora, distill.distributed: LoRA drafts (peft); launch-mode checks and DeepSpeed ZeRO-3 weights
    distill.trainer        `DistillTrainer`, one transformers.Trainer for 1..N processes
    distill.preflight      the checks of a run before any weight loads; distill.run_folder: what OUTPUT_DIR holds
    distill.sources        the training rows: the dataset's, the target's responses, the teacher cache, on-policy
    distill.callbacks      AcceptanceCallback: acceptance at every checkpoint and at the end
    distill.export         the best checkpoint as a model folder, its deployment check, train_results.json, push
    distill.pipeline       `run_recipe`: one run as six steps (check, load, tokenise, distil, measure, export)
    distill.model_card     the model card from measured numbers (huggingface_hub ModelCard)
    distill.hub            publishing the exported draft: card into the folder, upload_folder(allow_patterns)
    distill.target_data, distill.teacher_cache, distill.report: target-generated training data, cached top-k
                           teacher, plots and tables (the quickstart corpus and tokenizer: scripts/quickstart_*.py)
    distill.shard_store, distill.fingerprints: the resumable shard folder and input hashes of the last two
    distill.utils          IGNORE_INDEX, eval_mode(), parameter_count, saved_parameter_count, ModelSetupError

Entry points: distill.cli.train (`specdistill-train`, around distill.pipeline.run_recipe) and distill.cli.push
(`specdistill-push`); in a checkout `scripts/train.py` and `scripts/push_to_hub.py` run them by path.
Nothing is imported here, so that `import distill.losses` stays light.
"""
