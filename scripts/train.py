"""Distil a draft model from a frozen target LLM, measuring speculative-decoding acceptance at every checkpoint.

One process (CPU or one GPU):
    python scripts/train.py recipes/tiny_distill.yaml model.target=TARGET_DIR data.dataset=TEXT_FILE
Several GPUs (DDP), the same code:
    accelerate launch --config_file recipes/accelerate/ddp.yaml scripts/train.py recipes/qwen2.5-7b-to-0.5b.yaml
Two CPU processes (gloo), e.g. to check multi-process maths without GPUs:
    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \
        --mixed_precision no --dynamo_backend no scripts/train.py RECIPE.yaml key=value ...
Installed console script: specdistill-train RECIPE.yaml key=value ...

Training rows come from the dataset, the target's responses (data.target_weight, generated once into
data.target_data_dir) and the draft's own samples (distill.on_policy_fraction); distill.teacher_cache caches the
target's top-k once so that training never runs it (recipes/README.md).

OUTPUT_DIR (train.output_dir) ends up holding the best draft (distill.acceptance_log.best_checkpoint: cost-model
speedup from measured acceptance, cost ratios measured once per run) as a model folder,
recipe.yaml (the resolved recipe), acceptance.jsonl, train_results.json, checkpoint-*/ and runs/ (TensorBoard).
"""
from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from accelerate import PartialState
from transformers import TrainerControl, TrainerState, set_seed

if __package__ in (None, ""):  # `python scripts/train.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decode.checks import FileProblem  # noqa: E402
from decode.vocab import TokenizerMismatchError  # noqa: E402
from distill.acceptance_log import AcceptanceLogError, read_records  # noqa: E402
from distill.checkpoints import crash_point  # noqa: E402
from distill.callbacks import AcceptanceCallback, best_record, draft_at_checkpoint, export_draft  # noqa: E402
from distill.config import OVERRIDE_SOURCE, Recipe, RecipeError, check_precision  # noqa: E402
from distill.recipe_loader import load_recipe, save_recipe  # noqa: E402
from distill.data import DataError, DistillCollator, build_data, padding_id  # noqa: E402
from distill.sources import (check_teacher_topk, mix_sources, on_policy_settings, target_response_rows,  # noqa: E402
                             with_teacher_cache)
from distill.teacher_cache import CacheMismatchError  # noqa: E402
from distill.models import ModelSetupError, check_model_plan, load_draft, load_target, load_tokenizer  # noqa: E402
from distill.preflight import (RESULTS_FILE, RunPlan, check_attn_implementation, check_model_files,  # noqa: E402
                               check_resume_shape, check_train_names, clear_previous_run, plan_run)
from distill.trainer import DistillTrainer, UnsupportedModeError, check_device_mode, training_arguments  # noqa: E402

logger = logging.getLogger("specdistill.train")

# Errors in what the user gave us: reported as one line, exit status 1, no traceback.
class PushError(RuntimeError):
    """The hub push at the end failed (the trained draft is safe in train.output_dir)."""


USER_ERRORS = (RecipeError, DataError, ModelSetupError, TokenizerMismatchError, UnsupportedModeError,
               FileNotFoundError, PushError, CacheMismatchError, FileProblem, AcceptanceLogError)


def check_hub_settings(recipe: Recipe, source: str) -> None:
    """A bad hub.repo_id fails now, not after training."""
    if recipe.hub.push_to_hub:
        from distill.hub import check_repo_id
        try:
            check_repo_id(recipe.hub.repo_id)
        except ValueError as err:
            raise RecipeError("hub.repo_id", str(err), source) from None


def main(argv: list[str] | None = None) -> dict:
    """Run the recipe given as argv = [RECIPE.yaml, key=value, ...]; returns the exported draft's summary."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return {}
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    # ---- recipe and output folder: every key and path checked before anything heavy ------------------------
    recipe = load_recipe(argv[0], argv[1:])
    check_hub_settings(recipe, argv[0])
    check_train_names(recipe, argv[0])  # scheduler, optimizer, trackers: named now, not after loading models
    check_precision(recipe.train)  # fp16 on CPU, bf16 without a bf16 GPU: named before TrainingArguments sees them
    plan = plan_run(recipe, argv[0])  # a used output folder is refused; resume picks the latest complete checkpoint
    if plan.results is not None:
        print(f"specdistill-train: nothing to do: {recipe.train.output_dir} holds a run that finished at step "
              f"{plan.finished_at} ({RESULTS_FILE} written); nothing was changed")
        return plan.results.get("best", {})
    args = training_arguments(recipe.train)  # also sets up the processes (accelerate launch / torchrun)
    check_device_mode(args)
    state = PartialState()
    set_seed(recipe.train.seed)

    # ---- tokenizer and model plan: configs only, no weights yet ----------------------------------------------
    check_model_files(recipe)  # truncated safetensors, a target folder without tokenizer files
    tokenizer = load_tokenizer(recipe.model)
    check_model_plan(recipe.model, tokenizer)
    check_attn_implementation(recipe)
    check_resume_shape(recipe, plan.resume)
    topk_from_override = any(a.startswith("distill.teacher_topk=") for a in argv[1:])
    check_teacher_topk(recipe, OVERRIDE_SOURCE if topk_from_override else argv[0])  # k <= the target's vocabulary

    # ---- data: tokenised once on rank 0 (datasets cache), read by the others ---------------------------------
    with args.main_process_first(desc="tokenise dataset"):
        data = build_data(recipe.data, tokenizer, seed=recipe.train.seed, chat_template=recipe.eval.chat_template)
    logger.info("%d training rows (%s), %d acceptance prompts", len(data.train), data.format, len(data.eval_prompts))

    # ---- models: frozen target, trainable draft --------------------------------------------------------------
    target = load_target(recipe.model)
    draft = load_draft(recipe.model, target, recipe.lora)  # lora.enabled: a peft model, only adapters train

    # ---- training rows: the dataset's and the target's responses (generated once, main process first), mixed ---
    target.to(args.device)
    train_rows, target_rows = data.train, None
    if recipe.data.target_weight > 0:
        with args.main_process_first(desc="target responses"):
            target_rows = target_response_rows(recipe.data, data.train, target, draft, tokenizer,
                                               target_id=recipe.model.target, progress=state.is_main_process)
        train_rows = mix_sources(data.train, target_rows, recipe.data, seed=recipe.train.seed)
        logger.info("%d training rows: %d of the dataset and %d target responses mixed %g : %g", len(train_rows),
                    len(data.train), len(target_rows), recipe.data.dataset_weight, recipe.data.target_weight)
    collator = DistillCollator(padding_id(tokenizer))
    if recipe.distill.teacher_cache is not None:  # the target's top-k once; training then never runs the target
        with args.main_process_first(desc="teacher cache"):
            train_rows, collator = with_teacher_cache(
                train_rows, collator, recipe.distill, target, tokenizer, target_id=recipe.model.target,
                batch_size=recipe.train.per_device_train_batch_size, progress=state.is_main_process)

    # ---- train, measuring acceptance at every checkpoint -----------------------------------------------------
    if state.is_main_process:
        if recipe.train.overwrite_output_dir:
            clear_previous_run(recipe.train.output_dir)
        Path(recipe.train.output_dir).mkdir(parents=True, exist_ok=True)
        save_recipe(recipe, Path(recipe.train.output_dir) / "recipe.yaml")
    state.wait_for_everyone()
    acceptance = AcceptanceCallback(target, data.eval_prompts, recipe.eval,
                                    tensorboard="tensorboard" in recipe.train.report_to,
                                    categories=data.eval_categories)
    if plan.finished_at is not None:
        final_draft, metrics = finish_without_training(plan, args, acceptance, draft), {}
    else:
        trainer = DistillTrainer(model=draft, target=target, args=args, distill=recipe.distill,
                                 train_dataset=train_rows, data_collator=collator, processing_class=tokenizer,
                                 callbacks=[acceptance], on_policy=on_policy_settings(recipe, tokenizer, target))
        metrics = trainer.train(resume_from_checkpoint=plan.resume).metrics
        final_draft = trainer.accelerator.unwrap_model(trainer.model)

    # ---- export the best draft (rank 0), then every rank finishes together -----------------------------------
    summary: dict = {}
    if state.is_main_process:
        best = best_record(read_records(recipe.train.output_dir), recipe.eval.temperatures[0])
        fixed_gammas = [g for g in recipe.eval.gammas if g != "auto"]
        summary = export_draft(recipe.train.output_dir, best, final_draft, tokenizer,
                               default_gamma=max(fixed_gammas, default=4))
        crash_point("export")  # test hook: killed with the draft exported but the run not marked done
        write_results(Path(recipe.train.output_dir) / RESULTS_FILE,
                      {**metrics, "best": summary, "deploy_check": deploy_check(recipe)})
        logger.info("exported %s (gamma %s) to %s", summary["checkpoint"], summary["gamma"],
                    recipe.train.output_dir)
        if recipe.hub.push_to_hub:
            push(recipe, step=summary["step"])
    state.wait_for_everyone()
    if plan.finished_at is None:
        trainer.accelerator.end_training()
    return summary


def finish_without_training(plan: RunPlan, args, acceptance: AcceptanceCallback, draft):
    """The run already reached its last step (killed while measuring or exporting): measure every checkpoint that
    lacks its lines and return the last checkpoint's draft for the export; no step is trained, nothing rotates."""
    logger.info("%s already reached step %d: nothing to train; measuring what is missing and exporting",
                plan.resume, plan.finished_at)
    final_draft = draft_at_checkpoint(Path(plan.resume), draft).to(args.device)
    done = TrainerState(global_step=plan.finished_at, max_steps=plan.finished_at,
                        is_world_process_zero=PartialState().is_main_process)
    acceptance.on_train_begin(args, done, TrainerControl(), model=final_draft)  # measures unmeasured checkpoints
    acceptance.on_train_end(args, done, TrainerControl(), model=final_draft)
    return final_draft


def write_results(path: Path, results: dict) -> None:
    """train_results.json, written last (its presence means the run is done): a temporary file, then a rename."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(results, indent=2) + "\n")
    os.replace(temporary, path)


def deploy_check(recipe: Recipe) -> dict:
    """decode.deploy_check on the exported folder against the target (the model card states the result); its
    problems are logged as warnings, never fatal: the draft is trained and exported either way."""
    from decode.deploy_check import check_deploy
    from decode.loading import LoadError

    try:
        report = check_deploy(recipe.model.target, recipe.train.output_dir,
                              trust_remote_code=recipe.model.trust_remote_code)
    except LoadError as err:
        logger.warning("deployment check could not run: %s", err)
        return {"passed": False, "problems": {"inputs": str(err)}}
    for name, problem in report.problems.items():
        logger.warning("deployment check %s failed: %s (specdistill-check --target %s --draft %s)", name, problem,
                       recipe.model.target, recipe.train.output_dir)
    return report.to_dict()


def push(recipe: Recipe, step: int | None) -> None:
    """distill.hub.push_to_hub on the exported folder, its card showing the exported checkpoint's numbers."""
    try:
        from distill.hub import push_to_hub
    except ImportError as err:
        raise RuntimeError(f"hub.push_to_hub is true but distill.hub cannot be imported: {err}") from err
    from distill.hub import HubError
    try:
        push_to_hub(Path(recipe.train.output_dir), repo_id=recipe.hub.repo_id, private=recipe.hub.private, step=step)
    except HubError as err:
        raise PushError(f"{err} (the exported draft is in {recipe.train.output_dir})") from None


def cli() -> None:
    """Console entry point `specdistill-train`: user errors exit 1 with one line, no traceback."""
    try:
        main()
    except USER_ERRORS as err:
        first, *details = [line.strip() for line in str(err).splitlines() if line.strip()] or [""]
        message = " ".join([first, "; ".join(details)]).strip()  # one line, details (if any) separated by ;
        print(f"specdistill-train: error: {message}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    cli()
