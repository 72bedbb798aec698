"""The distil step of a run (specdistill.pipeline): the run folder opened, the draft trained by its kind's Trainer
(distill.run.trainer.DistillTrainer or a subclass), or, for a run that had already reached its last step, its last
checkpoint's draft read back."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from accelerate import PartialState
from torch import nn
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from distill.data.sources import TrainingRows
from distill.outputs.run_folder import start_run_folder
from distill.publish.card_text import PublishingKind
from distill.publish.export import draft_at_checkpoint
from distill.recipe.sections import Recipe
from distill.run.trainer import DistillTrainer

logger = logging.getLogger(__name__)


@dataclass
class Distilled:
    """The outcome of the distil step: the draft as trained (plain, a peft model, or ZeRO-3-partitioned) with the
    Trainer's final state and metrics; `trainer` is None for a run that had already reached its last step."""

    draft: nn.Module
    state: TrainerState
    metrics: dict
    trainer: DistillTrainer | None = None

    def end(self) -> None:
        """Every process leaves together (accelerate's end_training: trackers closed, process group destroyed)."""
        if self.trainer is not None:
            self.trainer.accelerator.end_training()


def distil(recipe: Recipe, args: TrainingArguments, target: PreTrainedModel, draft: nn.Module, rows: TrainingRows,
           tokenizer: PreTrainedTokenizerBase, callbacks: list[TrainerCallback], *, resume: str | None,
           finished_at: int | None) -> Distilled:
    """Open the run folder (distill.outputs.run_folder), then train `draft` with the Trainer of the recipe's kind
    (recipe.model.kind.trainer(): DistillTrainer, or a subclass) from `resume` (a checkpoint folder or None).
    A run that already reached its last step (`finished_at`; killed while measuring or exporting) trains nothing:
    its last checkpoint's draft is read back and the callbacks see the run begin at that step."""
    start_run_folder(recipe)
    if finished_at is not None:
        return _already_trained(args, draft, callbacks, resume, finished_at, recipe.model.kind)
    trainer_class = recipe.model.kind.trainer()
    trainer = trainer_class(model=draft, target=target, args=args, distill=recipe.distill,
                            train_dataset=rows.rows, data_collator=rows.collator, processing_class=tokenizer,
                            callbacks=callbacks, on_policy=rows.on_policy)
    metrics = trainer.train(resume_from_checkpoint=resume).metrics
    return Distilled(trainer.trained_draft(), trainer.state, metrics, trainer)


def _already_trained(args: TrainingArguments, draft: nn.Module, callbacks: list[TrainerCallback], resume: str,
                     finished_at: int, kind: PublishingKind) -> Distilled:
    """The last checkpoint's draft and a state at its step; on_train_begin lets AcceptanceCallback measure the
    checkpoints that lack their lines (no step is trained, nothing rotates)."""
    logger.info("%s already reached step %d: nothing to train; measuring what is missing and exporting", resume,
                finished_at)
    final_draft = draft_at_checkpoint(Path(resume), draft, kind).to(args.device)
    state = TrainerState(global_step=finished_at, max_steps=finished_at,
                         is_world_process_zero=PartialState().is_main_process)
    for callback in callbacks:
        callback.on_train_begin(args, state, TrainerControl(), model=final_draft)
    return Distilled(final_draft, state, {})
