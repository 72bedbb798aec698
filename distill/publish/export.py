"""The export: the best checkpoint of a run as a ready-to-use draft folder, its deployment check, its results.

export_run is the last step of a run (specdistill.pipeline), on rank 0 while the other ranks wait:
  best      distill.outputs.acceptance_log.best_checkpoint at the first eval temperature (cost-model speedup
            tau / (gamma * c + v) from the measured acceptance); no measurement: the final draft
  export    that checkpoint's draft written to OUTPUT_DIR as a plain model folder (safetensors, config, tokenizer;
            a LoRA draft merged, a ZeRO-3 / FSDP2 draft read back from its checkpoint), with
            generation_config.num_assistant_tokens = its gamma (export_draft; the served folder of its kind:
            recipe.model.kind.save)
  check     decode.deploy.deploy_check on the folder against the target; problems are warnings, never fatal
  serving   eval.serving_engine: vllm: the folder measured inside vLLM (decode.serving) on the eval prompts;
            best.vllm_mean_accepted_tokens beside best.mean_accepted_tokens; a failure is a warning, never fatal
  results   OUTPUT_DIR/train_results.json = {Trainer metrics..., "best": summary, "deploy_check": report,
            "serving": vLLM's results (with serving_engine)}, last
  push      hub.push_to_hub: distill.publish.hub uploads the folder; a failure raises PushError (the draft stays safe)
"""
from __future__ import annotations

import copy
import json
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from accelerate import PartialState
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from decode.deploy.speculators import add_speculators_keys
from decode.inputs.checks import read_text
from decode.inputs.manifest import MANIFEST, write_manifest
from decode.inputs.writes import fsync_folder
from distill.models.distributed import is_partitioned, outside_zero3_init, plain_copy
from distill.models.fsdp import unsharded_original
from distill.models.lora import is_lora
from distill.models.served import carry_draft_vocab, served_draft
from distill.outputs.acceptance_log import best_checkpoint, read_records, row_gamma
from distill.outputs.checkpoints import crash_point, find_checkpoints, partial_folder
from distill.outputs.run_folder import write_results
from distill.publish.card_text import PublishingKind
from distill.recipe.sections import Recipe
from distill.utils import folder_bytes, no_space, out_of_space

logger = logging.getLogger(__name__)


class PushError(RuntimeError):
    """The hub push at the end failed (the trained draft is safe in train.output_dir)."""


def best_record(records: Sequence[dict], temperature: float) -> dict | None:
    """The record of distill.outputs.acceptance_log.best_checkpoint at `temperature` (None when there is none)."""
    choice = best_checkpoint(records, temperature)
    return choice.row if choice else None


# ---------------------------------------------------------------------------------------------------------------
# The draft folder
# ---------------------------------------------------------------------------------------------------------------

def draft_at_checkpoint(folder: Path, final_draft: nn.Module, kind: PublishingKind) -> PreTrainedModel:
    """The plain draft saved in a Trainer checkpoint folder: a whole model, or LoRA adapters (adapter_config.json)
    that are put on a copy of `final_draft` (its frozen base is the same at every step; under FSDP2 the unsharded
    copy kept before sharding) and merged; or what the draft's ``kind`` stores its own way (an EAGLE-3 head's
    weights: its from_checkpoint)."""
    own = kind.from_checkpoint(folder, final_draft)
    if own is not None:
        return own
    if (folder / "adapter_config.json").is_file():
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        adapted = copy.deepcopy(unsharded_original(final_draft))
        weights = load_file(folder / "adapter_model.safetensors", device=str(next(adapted.parameters()).device))
        set_peft_model_state_dict(adapted, weights)
        return adapted.merge_and_unload()
    with outside_zero3_init():  # export runs on rank 0 alone: no partitioning (a collective) while loading
        return AutoModelForCausalLM.from_pretrained(folder, dtype=next(final_draft.parameters()).dtype)


def write_served_folder(output_dir: Path, draft: nn.Module, tokenizer: PreTrainedTokenizerBase, gamma: int,
                        kind: PublishingKind, verifier: str | None = None) -> None:
    """The draft's served files (its kind's layout, with the speculators keys for the target ``verifier`` where the
    kind has them: decode.deploy.speculators; the tokenizer) and their manifest, staged whole in
    OUTPUT_DIR/.partial/export and then renamed into OUTPUT_DIR one by one, the manifest last: a failed write (a
    full disk) or a kill leaves OUTPUT_DIR's files as they were (the staging folder is removed, or cleared by the next
    save), never a half-written model file."""
    staging = partial_folder(output_dir) / "export"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        kind.save(draft, staging, gamma)  # its kind's served folder
        add_speculators_format(staging, kind, gamma, verifier)
        tokenizer.save_pretrained(staging)
        write_manifest(staging)  # the served files' sha256: specdistill check verifies a copy of the folder
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for file in sorted(staging.rglob("*"), key=lambda p: p.name == MANIFEST):  # the manifest last
        if file.is_file():
            destination = output_dir / file.relative_to(staging)
            destination.parent.mkdir(parents=True, exist_ok=True)
            os.replace(file, destination)
    fsync_folder(output_dir)
    shutil.rmtree(staging, ignore_errors=True)


def add_speculators_format(folder: Path, kind: PublishingKind, gamma: int, verifier: str | None) -> None:
    """The speculators keys in ``folder``'s config.json, so that `vllm serve FOLDER` serves ``verifier`` with the draft
    drafting ``gamma``; nothing for a kind without that format or without a verifier."""
    config = folder / "config.json"
    fields = kind.speculators_fields(json.loads(read_text(config))) if verifier else None
    if fields:
        add_speculators_keys(folder, fields, gamma, verifier)


def export_draft(output_dir: str | Path, best: dict | None, final_draft: nn.Module,
                 tokenizer: PreTrainedTokenizerBase, default_gamma: int, *, kind: PublishingKind,
                 verifier: str | None = None) -> dict:
    """Write the best draft to OUTPUT_DIR as a standard model folder (safetensors, config, generation config, tokenizer;
    the layout of the draft's ``kind``) that AutoModelForCausalLM and `target.generate(..., assistant_model=draft)`
    load, with no peft files: a LoRA draft (a peft model as `final_draft`, adapters in the checkpoints) is merged first.

    `best` is the row of distill.outputs.acceptance_log.best_checkpoint (None: export `final_draft` with
    `default_gamma`). A ZeRO-3-partitioned or FSDP2-sharded `final_draft` is read back from the last checkpoint instead
    (AcceptanceCallback saves the last step under both). Returns what was exported: {"checkpoint", "step",
    "gamma"} plus the record's speedup numbers.
    """
    output_dir = Path(output_dir)
    folder = output_dir / best["checkpoint"] if best else None
    if folder is not None and folder.is_dir():
        draft = draft_at_checkpoint(folder, final_draft, kind)
    elif is_partitioned(final_draft):
        last = find_checkpoints(output_dir).latest
        if last is None:
            raise RuntimeError(f"the final draft is sharded (ZeRO-3 / FSDP2) and {output_dir} holds no checkpoint to "
                               "export it from")
        draft = draft_at_checkpoint(last, final_draft, kind)
    elif is_lora(final_draft):
        draft = plain_copy(final_draft)
    else:
        draft = final_draft
    gamma = row_gamma(best).deployed if best else default_gamma
    draft = served_draft(draft, kind)  # a head in training is wrapped (UnrolledHead): its head is what is served
    carry_draft_vocab(served_draft(final_draft, kind), draft)  # a standalone draft's vocabulary: chosen once per run
    write_served_folder(output_dir, draft, tokenizer, gamma, kind, verifier)
    summary = {"checkpoint": best["checkpoint"] if best else "final", "step": best["step"] if best else None,
               "gamma": gamma}
    if best:
        summary.update({k: best[k] for k in ("temperature", "speedup", "acceptance_rate", "mean_accepted_tokens",
                                             "predicted_speedup") if k in best})
    return summary


# ---------------------------------------------------------------------------------------------------------------
# The run's last step
# ---------------------------------------------------------------------------------------------------------------

def export_run(recipe: Recipe, final_draft: nn.Module, tokenizer: PreTrainedTokenizerBase, metrics: dict,
               eval_prompts: Sequence[torch.Tensor] = (), eval_categories: Sequence[str | None] | None = None) -> dict:
    """Rank 0: export the best draft, check it, measure it in vLLM (eval.serving_engine), write train_results.json
    last, push if asked; every rank then waits. Returns the export summary of export_draft (empty on the other
    ranks). Raises PushError."""
    state, summary = PartialState(), {}
    if state.is_main_process:
        output_dir = recipe.train.output_dir
        best = best_record(read_records(output_dir), recipe.eval.temperatures[0])
        try:
            summary = export_draft(output_dir, best, final_draft, tokenizer,
                                   default_gamma=max(recipe.eval.fixed_gammas, default=4), kind=recipe.model.kind,
                                   verifier=recipe.model.target)
        except OSError as err:
            if not out_of_space(err):
                raise
            raise no_space(output_dir, "the exported draft", "the checkpoints are intact; free space, then continue "
                           "with train.resume_from_checkpoint=true (it exports again)",
                           folder_bytes(find_checkpoints(output_dir).latest or output_dir / "none")) from None
        crash_point("export")  # test hook: killed with the draft exported but the run not marked done
        results = {**metrics, "best": summary, "deploy_check": deploy_check(recipe)}
        if recipe.eval.serving_engine == "vllm":
            results["serving"] = serving_check(recipe, eval_prompts, eval_categories)
            summary["vllm_mean_accepted_tokens"] = vllm_tau(results["serving"], summary)
        write_results(output_dir, results)
        logger.info("exported %s (gamma %s) to %s", summary["checkpoint"], summary["gamma"], output_dir)
        if recipe.hub.push_to_hub:
            push(recipe, step=summary["step"])
    state.wait_for_everyone()
    return summary


def deploy_check(recipe: Recipe) -> dict:
    """decode.deploy.deploy_check on the exported folder against the target (the model card states the result); its
    problems are logged as warnings, never fatal: the draft is trained and exported either way."""
    from decode.deploy.deploy_check import check_deploy
    from decode.inputs.loading import LoadError

    try:
        report = check_deploy(recipe.model.target, recipe.train.output_dir, recipe.model.kind,
                              trust_remote_code=recipe.model.trust_remote_code)
    except LoadError as err:
        logger.warning("deployment check could not run: %s", err)
        return {"passed": False, "problems": {"inputs": str(err)}}
    for name, advice in report.warnings.items():
        logger.warning("deployment check %s: %s", name, advice)
    for name, problem in report.problems.items():
        logger.warning("deployment check %s failed: %s (specdistill-check --target %s --draft %s)", name, problem,
                       recipe.model.target, recipe.train.output_dir)
    return report.to_dict()


def serving_check(recipe: Recipe, prompts: Sequence[torch.Tensor],
                  categories: Sequence[str | None] | None) -> dict:
    """The exported folder measured inside vLLM (decode.serving.vllm_engine) at the integer eval gammas and the
    first eval temperature: {"engine", "vllm_version", "results"}; {"engine", "error"} when vLLM cannot run (a
    warning: the draft is exported either way)."""
    from decode.serving.vllm_engine import ServingError, evaluate_in_vllm, find_vllm_python, resolve_vllm_dtype

    cfg = recipe.eval
    settings = cfg.decoder_settings(cfg.temperatures[0], fixed_gammas_only=True)
    try:
        if not prompts:
            raise ServingError("no eval prompts to measure")
        dtype = resolve_vllm_dtype(cfg.vllm_dtype)  # vLLM takes a GPU whenever there is one
        results, response = evaluate_in_vllm(find_vllm_python(cfg.vllm_python), recipe.model.target,
                                             str(recipe.train.output_dir), prompts, settings, recipe.model.kind,
                                             categories, dtype=dtype,
                                             draft_sample_method="probabilistic")  # our acceptance rule at T > 0
    except ServingError as err:
        logger.warning("eval.serving_engine vllm could not measure the exported draft: %s", err)
        return {"engine": "vllm", "error": str(err)}
    for r in results:
        logger.info("vLLM: gamma %s tau %.3f greedy_match %s", r["gamma"], r["mean_accepted_tokens"],
                    r["greedy_match"])
    return {"engine": "vllm", "vllm_version": response["vllm_version"], "results": results}


def vllm_tau(serving: dict, summary: dict) -> float | None:
    """vLLM's tau at the exported gamma (None when vLLM did not measure it)."""
    return next((r["mean_accepted_tokens"] for r in serving.get("results", []) if r["gamma"] == summary["gamma"]),
                None)


def push(recipe: Recipe, step: int | None) -> None:
    """distill.publish.hub.push_to_hub on the exported folder, its card showing the exported checkpoint's numbers.
    Raises PushError (one line) when the hub refuses or cannot be reached."""
    try:
        from distill.publish.hub import push_to_hub
    except ImportError as err:
        raise RuntimeError(f"hub.push_to_hub is true but distill.publish.hub cannot be imported: {err}") from err
    from distill.publish.hub import HubError
    try:
        push_to_hub(Path(recipe.train.output_dir), repo_id=recipe.hub.repo_id, private=recipe.hub.private, step=step,
                    card=recipe.model.kind.card)
    except HubError as err:
        raise PushError(f"{err} (the exported draft is in {recipe.train.output_dir})") from None
