"""Prompts alone as a dataset (data.format prompts): the target writes every training row.

A row is one prompt, read the way evaluation reads prompts (decode.inputs.prompts): a .txt file is one prompt per line,
a .jsonl/.json/.parquet row or a dataset row has a 'prompt' string or a conversation whose last user turn is answered.
With a chat template a plain prompt becomes one user turn (as held-out prompts do in a chat run), and each prompt is
rendered with the template's generation prompt under eval.chat_template.

The rows handed on are {input_ids: the rendered prompt, labels: all -100}: nothing of them is trained on
(data.dataset_weight is 0); distill.data.target_data.prompts_from_rows takes every token of such a row as the
prompt the target answers. `num_eval_prompts` prompts (seeded) are held out for acceptance unless
data.eval_prompts names a file. With data.synthesize_prompts and no data.dataset there are no rows yet: the prompts
come from the target in the tokenise step (distill.data.magpie), which holds the acceptance prompts out of them.
"""
from __future__ import annotations

import random
from pathlib import Path

import datasets
from transformers import PreTrainedTokenizerBase

from decode.inputs.loading import LoadError
from decode.inputs.prompts import PromptFields, PromptRow, read_prompt_file, to_prompt_row
from distill.data.rows import (
    DataError,
    DistillData,
    as_prompt_row,
    eval_prompt_set,
    local_data_files,
    prompt_ids,
    read_eval_prompts,
)
from distill.recipe.sections import DataConfig
from distill.utils import IGNORE_INDEX

PROMPT_FEATURES = datasets.Features({"input_ids": datasets.List(datasets.Value("int64")),
                                     "labels": datasets.List(datasets.Value("int64"))})


def holds_prompts_only(cfg: DataConfig, rows: datasets.Dataset) -> bool:
    """data.format auto: whether the rows are prompts alone: a 'prompt' column without messages or text, or
    conversations none of which has an assistant turn."""
    columns = rows.column_names
    if cfg.messages_field in columns:
        return not any(isinstance(m, dict) and m.get("role") == "assistant"
                       for conversation in rows[cfg.messages_field] for m in (conversation or []))
    return "prompt" in columns and cfg.text_field not in columns


def dataset_prompt_rows(cfg: DataConfig, rows: datasets.Dataset) -> list[PromptRow]:
    """The prompts of data.dataset: .txt files one per line, other rows through their 'prompt' or messages field.
    Raises DataError naming the file, row and field."""
    fields = PromptFields(messages_field=None if cfg.messages_field == "messages" else cfg.messages_field)
    local = local_data_files(cfg.dataset)
    try:
        if local is not None and local[0] == "text":  # one prompt per line, as prompt files are read by eval
            prompts = [row for file in local[1] for row in read_prompt_file(Path(file), fields)]
        else:
            prompts = [to_prompt_row(row, fields, f"data.dataset {cfg.dataset} row {i}") for i, row in enumerate(rows)]
    except LoadError as err:
        raise DataError(str(err) if str(err).startswith("data.dataset") else f"data.dataset: {err}") from None
    prompts = [p for p in prompts if p.is_conversation or (p.text or "").strip()]
    return prompts[: cfg.max_samples] if cfg.max_samples is not None else prompts


def prompt_training_rows(prompts: list[PromptRow], tokenizer: PreTrainedTokenizerBase, cfg: DataConfig,
                         chat_template: str) -> datasets.Dataset:
    """{input_ids: the rendered prompt (its last max_length - 1 tokens when templated), labels: all -100} per
    non-empty prompt."""
    fmt = "chat" if getattr(tokenizer, "chat_template", None) else "text"
    encoded = [prompt_ids(as_prompt_row(p, fmt), tokenizer, cfg.max_length - 1, chat_template).tolist()
               for p in prompts]
    encoded = [ids for ids in encoded if ids]
    return datasets.Dataset.from_dict({"input_ids": encoded, "labels": [[IGNORE_INDEX] * len(ids) for ids in encoded]},
                                      features=PROMPT_FEATURES)


def held_out(prompts: list[PromptRow], count: int, seed: int, where: str) -> tuple[list[PromptRow], list[PromptRow]]:
    """(the prompts kept for training, `count` held out at random with `seed`); DataError when too few."""
    if count == 0:
        return prompts, []
    if len(prompts) <= count:
        raise DataError(f"data.num_eval_prompts: cannot hold out {count} prompts from the {len(prompts)} prompts of "
                        f"{where}; lower it or give data.eval_prompts")
    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)
    out = set(order[:count])
    return [p for i, p in enumerate(prompts) if i not in out], [prompts[i] for i in order[:count]]


def prompts_data(cfg: DataConfig, prompts: list[PromptRow], tokenizer: PreTrainedTokenizerBase, seed: int,
                 chat_template: str) -> DistillData:
    """DistillData of a prompts-only dataset (module docstring); with no prompts (data.synthesize_prompts alone)
    an empty training set, the acceptance prompts then held out of the synthesized ones."""
    if cfg.eval_prompts is not None:
        evaluated = read_eval_prompts(cfg.eval_prompts)[: cfg.num_eval_prompts]
    elif prompts:
        prompts, evaluated = held_out(prompts, cfg.num_eval_prompts, seed, str(cfg.dataset))
    else:
        evaluated = []
    train = prompt_training_rows(prompts, tokenizer, cfg, chat_template)
    if cfg.dataset is not None and len(train) == 0:
        raise DataError(f"no usable rows in {cfg.dataset}: no prompt left (data.format prompts)")
    fmt = "chat" if getattr(tokenizer, "chat_template", None) else "text"
    eval_ids, categories = eval_prompt_set(evaluated, fmt, tokenizer, cfg.eval_prompt_tokens, chat_template,
                                           [p.category for p in evaluated])
    return DistillData(train=train, eval_prompts=eval_ids, format="prompts", eval_categories=categories)
