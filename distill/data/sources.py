"""Where the training rows come from (recipes/README.md, "Where the training rows come from").

  dataset   the dataset's own rows (distill.data.dataset.build_data), weight data.dataset_weight
  target    the target's responses to those rows' prompts (sequence-level KD), generated once into
            data.target_data_dir (distill.data.target_data), weight data.target_weight
  draft     the draft's own samples, put in during training by DistillTrainer (distill.data.onpolicy), a per-row
            fraction distill.on_policy_fraction of whatever the first two give
The first two are mixed row by row: datasets.interleave_datasets draws each row from a source with probability
weight / sum of weights (seeded with train.seed) until one source runs out. Optionally the target's top-k
log-probabilities of the mixed rows are cached (distill.teacher_cache; for an EAGLE-3 head its hidden states,
distill.hidden_state_cache) and travel with the rows, so that training never runs the target.

training_rows (the tokenise step of a run, specdistill.pipeline) runs whatever uses the target on the main process
first (TrainingArguments.main_process_first); the other processes then find the stored result complete and read it.
Under FSDP2 the target is still whole on every process's CPU here (it is sharded after this step); the main process
moves it to its device while it generates (distill.models.fsdp.generating_on).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import datasets
from accelerate import PartialState
from torch import nn
from transformers import PreTrainedTokenizerBase, TrainingArguments

from decode.inputs.prompts import PromptRow
from decode.inputs.vocab import lm_head_rows
from decode.loop.drafters import DraftingKind
from decode.serving.vllm_engine import resolve_vllm_dtype
from distill.data.hidden_cache import with_hidden_state_cache
from distill.data.magpie import Synthesis, SynthesisError, category_openers, prompt_texts, synthesize_prompt_rows
from distill.data.onpolicy import OnPolicySettings
from distill.data.prompt_rows import held_out, prompt_training_rows
from distill.data.rows import DataError, DistillCollator, DistillData, eval_prompt_set, padding_id, read_eval_prompts
from distill.data.shard_store import CacheMismatchError
from distill.data.target_data import generate_target_data, prompts_from_rows, to_training_rows
from distill.data.target_vllm import VLLM_SHARD_SIZE
from distill.data.teacher_cache import TeacherCollator, build_teacher_cache, with_teacher_columns
from distill.models.fsdp import generating_on
from distill.recipe.sections import DataConfig, DistillKeys, Recipe
from distill.utils import eval_mode

logger = logging.getLogger(__name__)


@dataclass
class TrainingRows:
    """What DistillTrainer trains on: the mixed rows, the collator that pads them (with the cached teacher's
    columns when there is a cache), and the on-policy settings (None: no draft samples)."""

    rows: datasets.Dataset
    collator: Callable[[list[dict]], Any]
    on_policy: OnPolicySettings | None


def training_rows(recipe: Recipe, data: DistillData, target: nn.Module, draft: nn.Module,
                  tokenizer: PreTrainedTokenizerBase, args: TrainingArguments) -> TrainingRows:
    """The tokenise step of a run (specdistill.pipeline): the dataset's rows (`data`, tokenised by the check step), the
    target's responses (generated once, main process first) mixed in, the teacher cache attached, and the on-policy
    settings. Raises CacheMismatchError when a stored folder holds results of other inputs."""
    progress = PartialState().is_main_process
    rows, target_rows = data.train, None
    if recipe.data.target_weight > 0:
        with args.main_process_first(desc="target responses"), generating_on(target, args.device):
            target_rows = target_response_rows(recipe.data, data.train, target, draft, tokenizer,
                                               target_id=recipe.model.target, progress=progress,
                                               vllm_python=recipe.eval.vllm_python, draft_kind=recipe.model.kind,
                                               vllm_dtype=vllm_dtype_of(recipe))
        rows = mix_sources(data.train, target_rows, recipe.data, seed=recipe.train.seed)
        logger.info("%d training rows: %d of the dataset and %d target responses mixed %g : %g", len(rows),
                    len(data.train), len(target_rows), recipe.data.dataset_weight, recipe.data.target_weight)
    collator = DistillCollator(padding_id(tokenizer), every_token=recipe.data.loss_tokens == "all")
    if recipe.distill.teacher_cache is not None:  # the target's top-k once; training then never runs the target
        with args.main_process_first(desc="teacher cache"), generating_on(target, args.device):
            rows, collator = with_teacher_cache(
                rows, collator, recipe.distill, target, tokenizer, target_id=recipe.model.target,
                batch_size=recipe.train.per_device_train_batch_size, progress=progress)
    if recipe.distill.hidden_state_cache is not None:  # a head's target features once: steps never run the target
        try:
            rows, collator = with_hidden_state_cache(
                rows, collator, target, recipe.distill.hidden_state_cache, aux_layers=draft.aux_layers,
                dtype=recipe.distill.hidden_state_cache_dtype, target_id=recipe.model.target,
                batch_size=recipe.train.per_device_train_batch_size, args=args)
        except CacheMismatchError as err:
            raise CacheMismatchError(f"distill.hidden_state_cache: {_for_recipes(err)}") from None
    return TrainingRows(rows, collator, on_policy_settings(recipe, tokenizer, target))


def with_synthesized_prompts(recipe: Recipe, data: DistillData, target: nn.Module,
                             tokenizer: PreTrainedTokenizerBase, args: TrainingArguments) -> DistillData:
    """`data` with data.synthesize_prompts prompts written by the target (distill.data.magpie; main process first,
    stored in target_data_dir/prompts) added as prompt rows; with neither data.dataset nor data.eval_prompts the
    acceptance prompts are held out of them; none equals a prompt of data.eval_prompts. `data` itself when the key
    is not set. Raises DataError (no chat template), CacheMismatchError (the folder holds prompts of another target
    or settings)."""
    cfg = recipe.data
    if cfg.synthesize_prompts is None:
        return data
    hold_out = cfg.num_eval_prompts if cfg.dataset is None and cfg.eval_prompts is None else 0
    held_out_file = read_eval_prompts(cfg.eval_prompts) if cfg.eval_prompts else []  # never written as training
    synthesis = Synthesis(count=cfg.synthesize_prompts + hold_out, seed=cfg.target_seed,
                          temperature=cfg.synthesize_temperature, max_new_tokens=cfg.synthesize_max_tokens,
                          batch_size=cfg.target_batch_size,
                          openers=category_openers(cfg.synthesize_categories) if cfg.synthesize_categories else (),
                          exclude=prompt_texts(held_out_file))
    try:
        with args.main_process_first(desc="synthesized prompts"), generating_on(target, args.device):
            made = synthesize_prompt_rows(target, tokenizer, Path(cfg.target_data_dir) / "prompts", synthesis,
                                      target_id=recipe.model.target, progress=PartialState().is_main_process,
                                      engine=cfg.target_engine, vllm_python=recipe.eval.vllm_python,
                                      vllm_dtype=vllm_dtype_of(recipe))
    except SynthesisError as err:
        raise DataError(str(err)) from None
    except CacheMismatchError as err:
        raise CacheMismatchError(f"data.synthesize_prompts: {_for_recipes(err)}") from None
    prompts = [PromptRow(messages=({"role": "user", "content": row.text},), category=row.category) for row in made]
    prompts, evaluated = held_out(prompts, min(hold_out, max(len(prompts) - 1, 0)), recipe.train.seed,
                                  "data.synthesize_prompts")
    train = datasets.concatenate_datasets([data.train, prompt_training_rows(
        prompts, tokenizer, cfg, recipe.eval.chat_template).cast(data.train.features)])
    logger.info("%d prompts synthesized by the target (%d held out for acceptance)", len(made), len(evaluated))
    if not evaluated:
        return replace(data, train=train)
    eval_ids, categories = eval_prompt_set(evaluated, "chat", tokenizer, cfg.eval_prompt_tokens,
                                           recipe.eval.chat_template)
    return replace(data, train=train, eval_prompts=eval_ids, eval_categories=categories)


def vllm_dtype_of(recipe: Recipe) -> str:
    """The dtype vLLM is given for the recipe's eval.vllm_dtype (data.target_engine: vllm): auto = bfloat16 when vLLM
    runs on CUDA (it takes a GPU whenever there is one), else float32."""
    return resolve_vllm_dtype(recipe.eval.vllm_dtype)


def target_response_rows(cfg: DataConfig, rows: datasets.Dataset, target: nn.Module, draft: nn.Module,
                         tokenizer: PreTrainedTokenizerBase, *, target_id: str, progress: bool,
                         vllm_python: str | None = None, draft_kind: DraftingKind | None = None,
                         vllm_dtype: str = "float32") -> datasets.Dataset:
    """Training rows {input_ids, labels} = prompt + the target's response (labels on the response) for every row of
    `rows`; the responses are generated into cfg.target_data_dir on first use and read back afterwards.
    Raises CacheMismatchError when that folder holds responses of other inputs."""
    prompts = prompts_from_rows(rows, prompt_tokens=min(cfg.prompt_tokens, cfg.max_length - 1))
    # with target_gamma the draft proposes tokens for the speculative decoder (on the target's device, eval mode)
    decoder_draft = draft.to(next(target.parameters()).device) if cfg.target_gamma is not None else None
    shards = {"shard_size": VLLM_SHARD_SIZE} if cfg.target_engine == "vllm" else {}  # one vLLM start per shard
    try:
        with eval_mode(draft):
            responses = generate_target_data(
                target, tokenizer, prompts, cfg.target_data_dir, max_new_tokens=cfg.target_max_new_tokens,
                temperature=cfg.target_temperature, top_k=cfg.target_top_k, top_p=cfg.target_top_p,
                seed=cfg.target_seed, batch_size=cfg.target_batch_size, draft=decoder_draft, draft_kind=draft_kind,
                gamma=cfg.target_gamma or 1, target_id=target_id, progress=progress, engine=cfg.target_engine,
                vllm_python=vllm_python, vllm_dtype=vllm_dtype, **shards)
    except CacheMismatchError as err:
        raise CacheMismatchError(f"data.target_data_dir: {_for_recipes(err)}") from None
    return to_training_rows(responses, cfg.max_length, num_proc=cfg.num_proc)


def _for_recipes(err: CacheMismatchError) -> str:
    """The message with the Python API's advice (overwrite=True, not a recipe key) put in recipe terms."""
    return str(err).replace("or overwrite=True", "or delete this folder")


def mix_sources(dataset_rows: datasets.Dataset, target_rows: datasets.Dataset | None, cfg: DataConfig,
                seed: int) -> datasets.Dataset:
    """The rows of the sources with weight > 0; two sources are interleaved at random in proportion to their
    weights (seeded), stopping when one runs out."""
    weighted = [(rows, weight) for rows, weight in ((dataset_rows, cfg.dataset_weight),
                                                    (target_rows, cfg.target_weight)) if weight > 0]
    if len(weighted) == 1:
        return weighted[0][0]
    total = sum(weight for _, weight in weighted)
    aligned = [rows.cast(dataset_rows.features) for rows, _ in weighted]
    return datasets.interleave_datasets(aligned, probabilities=[weight / total for _, weight in weighted],
                                        seed=seed, stopping_strategy="first_exhausted")


def with_teacher_cache(rows: datasets.Dataset, collator: Callable[[list[dict]], Any], cfg: DistillKeys,
                       target: nn.Module, tokenizer: PreTrainedTokenizerBase, *, target_id: str, batch_size: int,
                       progress: bool) -> tuple[datasets.Dataset, TeacherCollator]:
    """The rows with the target's cached top-k columns attached, and a collator that pads them; the cache is built
    into cfg.teacher_cache on first use (resumed if interrupted). Raises CacheMismatchError when the folder holds
    a cache of another target, tokenizer or other rows."""
    try:
        cache = build_teacher_cache(target, rows, cfg.teacher_cache, k=cfg.teacher_topk, batch_size=batch_size,
                                    target_id=target_id, tokenizer=tokenizer, logprob_dtype=cfg.teacher_cache_dtype,
                                    chunk_size=cfg.chunk_size, progress=progress)
    except CacheMismatchError as err:
        raise CacheMismatchError(f"distill.teacher_cache: {_for_recipes(err)}") from None
    # build_teacher_cache has just checked (or made) the cache against these very rows: no second hash
    return with_teacher_columns(rows, cache, check=False), TeacherCollator(collator)


def on_policy_settings(recipe: Recipe, tokenizer: PreTrainedTokenizerBase,
                       target: nn.Module) -> OnPolicySettings | None:
    """What DistillTrainer needs to put in on-policy rows; None when distill.on_policy_fraction is 0."""
    if recipe.distill.on_policy_fraction == 0:
        return None
    return OnPolicySettings(
        fraction=recipe.distill.on_policy_fraction, max_new_tokens=recipe.distill.on_policy_max_new_tokens,
        temperature=recipe.distill.on_policy_temperature, prompt_tokens=recipe.data.prompt_tokens,
        max_length=recipe.data.max_length, eos_token_id=tokenizer.eos_token_id, pad_token_id=padding_id(tokenizer),
        vocab_size=lm_head_rows(target), seed=recipe.train.seed)
