"""The data of a run: `build_data` reads data.dataset and gives the tokenised training rows and the acceptance
prompts (DistillData), whichever form the rows take:

  prompts   prompts alone, answered by the target (distill.data.prompt_rows)
  text      documents packed into max_length blocks (distill.data.rows.text_rows); a .txt corpus read as whole
            files has its acceptance prompts held out as packed blocks
  chat      conversations with labels on the assistant turns (distill.data.rows.chat_rows)
"""
from __future__ import annotations

import datasets
import torch
from transformers import PreTrainedTokenizerBase

from distill.data.prompt_rows import dataset_prompt_rows, holds_prompts_only, prompts_data
from distill.data.rows import (
    DataError,
    DistillData,
    chat_rows,
    eval_prompt_set,
    is_text_pieces,
    load_rows,
    read_eval_prompts,
    resolve_format,
    text_rows,
)
from distill.recipe.sections import DataConfig


def build_data(cfg: DataConfig, tokenizer: PreTrainedTokenizerBase, seed: int = 0,
               chat_template: str = "auto") -> DistillData:
    """Tokenised training rows and acceptance prompts (rendered under eval.chat_template = ``chat_template``, with
    the categories of a prompt file's rows or of a held-out 'category' column) for a recipe's data section.

    Raises DataError: missing file (named), missing column (named, with the available ones), no usable rows.
    """
    if cfg.dataset is None:  # data.synthesize_prompts alone: the prompts come from the target (tokenise step)
        return prompts_data(cfg, [], tokenizer, seed, chat_template)
    rows = load_rows(cfg)
    if cfg.format == "prompts" or (cfg.format == "auto" and holds_prompts_only(cfg, rows)):
        if cfg.dataset_weight > 0:
            raise DataError(f"data.dataset: {cfg.dataset} holds prompts alone (no assistant turns to train on): let "
                            "the target answer them with data.dataset_weight=0 data.target_weight=1 "
                            "data.target_data_dir=DIR")
        return prompts_data(cfg, dataset_prompt_rows(cfg, rows), tokenizer, seed, chat_template)
    fmt = resolve_format(cfg, rows.column_names)
    field = cfg.messages_field if fmt == "chat" else cfg.text_field
    whole_files = is_text_pieces(rows) and cfg.text_sample_by == "document"
    if whole_files and not cfg.eval_prompts and cfg.num_eval_prompts > 0:  # "" (a recipe's placeholder): not given
        return _from_whole_files(rows, cfg, tokenizer, seed, chat_template)
    categories = None
    if cfg.eval_prompts:
        held_out = read_eval_prompts(cfg.eval_prompts)[: cfg.num_eval_prompts]
    elif cfg.num_eval_prompts > 0:
        if len(rows) <= cfg.num_eval_prompts:
            raise DataError(f"data.num_eval_prompts: cannot hold out {cfg.num_eval_prompts} prompts from "
                            f"{len(rows)} rows of {cfg.dataset}; lower it or give data.eval_prompts")
        split = rows.train_test_split(test_size=cfg.num_eval_prompts, shuffle=True, seed=seed)
        rows, held_out = split["train"], split["test"][field]
        categories = split["test"]["category"] if "category" in split["test"].column_names else None
    else:
        held_out = []
    train = chat_rows(rows, cfg, tokenizer) if fmt == "chat" else text_rows(rows, cfg, tokenizer)
    check_usable(train, cfg, fmt, len(rows))
    prompts, prompt_categories = eval_prompt_set(held_out, fmt, tokenizer, cfg.eval_prompt_tokens, chat_template,
                                                 categories)
    return DistillData(train=train, eval_prompts=prompts, format=fmt, eval_categories=prompt_categories)


def check_usable(train: datasets.Dataset, cfg: DataConfig, fmt: str, num_rows: int) -> None:
    """Raises DataError when no training row is left."""
    if len(train) == 0:
        what = ("no conversation keeps an assistant token (a dataset of prompts alone is answered by the target: "
                "data.dataset_weight=0 data.target_weight=1)" if fmt == "chat"
                else f"the text does not fill one {cfg.max_length}-token block")
        raise DataError(f"no usable rows in {cfg.dataset}: {what} (data.max_length={cfg.max_length}, "
                        f"{num_rows} rows)")


def _from_whole_files(rows: datasets.Dataset, cfg: DataConfig, tokenizer: PreTrainedTokenizerBase,
                      seed: int, chat_template: str = "auto") -> DistillData:
    """A .txt corpus read as whole documents has few rows (one per file), so the acceptance prompts are held out
    as packed blocks instead: num_eval_prompts blocks (seeded) leave training, their first eval_prompt_tokens
    tokens are the prompts (with eval.chat_template on, their text is served as one user turn each)."""
    blocks = text_rows(rows, cfg, tokenizer)
    check_usable(blocks, cfg, "text", len(rows))
    if len(blocks) <= cfg.num_eval_prompts:
        raise DataError(f"data.num_eval_prompts: cannot hold out {cfg.num_eval_prompts} prompts from the "
                        f"{len(blocks)} blocks of {cfg.max_length} tokens in {cfg.dataset}; lower it or give "
                        "data.eval_prompts")
    split = blocks.train_test_split(test_size=cfg.num_eval_prompts, shuffle=True, seed=seed)
    heads = [ids[: cfg.eval_prompt_tokens] for ids in split["test"]["input_ids"]]
    if chat_template == "on":
        prompts, _ = eval_prompt_set([tokenizer.decode(h) for h in heads], "text", tokenizer,
                                     cfg.eval_prompt_tokens, chat_template)
    else:
        prompts = [torch.tensor(h, dtype=torch.long) for h in heads]
    return DistillData(train=split["train"], eval_prompts=prompts, format="text",
                       eval_categories=[None] * len(prompts))
