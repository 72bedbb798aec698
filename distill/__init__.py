"""specdistill's training side: distil a small draft model from a frozen target LLM for speculative decoding.

    distill.config         typed recipes: `load_recipe`, `Recipe` and one dataclass per section
    distill.models         frozen target; draft from a checkpoint, a subset of target layers, or a config
    distill.data           text packing, chat with assistant-only labels, held-out acceptance prompts
    distill.losses         per-token divergences, chunked over the vocabulary projection
    distill.trainer        `DistillTrainer`, one transformers.Trainer for 1..N processes
    distill.callbacks      acceptance at every checkpoint, best-checkpoint export
    distill.hub            publishing the exported draft with a model card
    distill.corpus, distill.target_data, distill.teacher_cache, distill.report: quickstart corpus, target-generated
                           training data, cached top-k teacher, plots and tables

Entry point: `scripts/train.py` (console script `specdistill-train`). Nothing is imported here, so that
`import distill.losses` stays light.
"""
