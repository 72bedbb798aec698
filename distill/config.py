"""Typed recipes: one dataclass per concern (model, lora, data, distill, train, eval, hub) under `Recipe`.

A recipe YAML file holds the fields of these dataclasses; defaults live here and nowhere else. Each section's
`__post_init__` checks types and ranges (distill/recipe_fields.py) and raises `RecipeError` naming the key, the bad
value and what is allowed. Reading a file, applying `section.key=value` overrides and writing the key reference
live in distill/recipe_loader.py (`load_recipe`).
"""
from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from distill.loss_mix import LossMix, LossSpecError, teacher_divergences
from distill.losses import LOSSES
from distill.recipe_fields import OVERRIDE_SOURCE, RecipeError, check_types, option, require

SECTIONS = ("model", "lora", "data", "distill", "train", "eval", "hub")

__all__ = ["OVERRIDE_SOURCE", "RecipeError", "Recipe", "SECTION_TYPES", "SECTIONS", "ModelConfig", "LoraConfig",
           "DataConfig", "DistillConfig", "TrainConfig", "EvalConfig", "HubConfig", "check_precision"]


# ---------------------------------------------------------------------------------------------------------------
# The sections
# ---------------------------------------------------------------------------------------------------------------

DRAFT_KINDS = ("standalone", "eagle3")
STANDALONE_KEYS = ("draft", "draft_layers", "draft_config")


@dataclass
class ModelConfig:
    """Which target to distil from and how the draft is made: a standalone model (exactly one of draft,
    draft_layers, draft_config) or an EAGLE-3 head on the target's hidden states (draft_kind eagle3)."""

    target: str = option("", "Target LLM: local folder or hub id (required).")
    draft_kind: Literal["standalone", "eagle3"] = option(
        "standalone", "standalone: a small LM of its own (model.draft / draft_layers / draft_config); eagle3: an "
                      "EAGLE-3 head (one decoder layer on the target's hidden states, served by vLLM and SGLang).")
    target_dtype: Literal["auto", "float32", "bfloat16", "float16"] = option(
        "auto", "dtype the frozen target is loaded in; auto = the dtype in its config.")
    draft: str | None = option(None, "Draft to fine-tune: local folder or hub id.")
    draft_layers: list[int] | None = option(
        None, "Build the draft from the target by keeping these decoder layers (0-based, increasing).")
    draft_config: dict[str, Any] | None = option(
        None, "Build the draft from scratch: the target's config with these keys overridden.")
    draft_dtype: Literal["float32", "bfloat16", "float16"] = option(
        "float32", "dtype of the trainable draft weights (use train.bf16 for mixed precision).")
    tokenizer: str | None = option(None, "Tokenizer folder or hub id; null = the target's.")
    trust_remote_code: bool = option(False, "Allow model code from the hub (only for repos you trust).")
    attn_implementation: str | None = option(None, "eager, sdpa, flash_attention_2, ...; null = transformers' pick.")
    # EAGLE-3 heads (draft_kind eagle3; recipes/README.md, "EAGLE-3 heads")
    aux_layers: list[int] | None = option(
        None, "eagle3: the target's layer ids whose hidden states the head reads (3 distinct, ascending, as vLLM "
              "requires; id i = the residual stream entering decoder layer i); null = vLLM's default "
              "(2, L // 2, L - 3), a repeated id moved to the nearest free layer.")
    draft_vocab_size: int | None = option(
        None, "eagle3: rows of the head's lm_head, the most frequent target tokens of the training data; null = the "
              "whole vocabulary when it has <= 32768 tokens, else 32768.")
    head_intermediate_size: int | None = option(
        None, "eagle3: the MLP width of the head's decoder layer; null = the target's intermediate_size.")
    head_init: Literal["target", "random"] = option(
        "target", "eagle3: target = start the head's lm_head from the target's lm_head rows of the draft "
                  "vocabulary, its final norm from the target's final norm, and its MLP (and the norm before it) from "
                  "the target's last decoder layer where the widths match; random = all fresh.")

    def __post_init__(self) -> None:
        check_types(self)
        require(bool(self.target), "target", self.target, "a local folder or hub id of the target model")
        chosen = [k for k in STANDALONE_KEYS if getattr(self, k) is not None]
        if self.draft_kind == "eagle3":
            require(not chosen, chosen[0] if chosen else "draft", getattr(self, chosen[0]) if chosen else None,
                    "null with model.draft_kind eagle3 (model.draft, draft_layers and draft_config are for "
                    "standalone drafts; a head is built from the target)")
            self._check_head_keys()
            return
        require(len(chosen) == 1, "draft", chosen or None,
                "exactly one of model.draft, model.draft_layers, model.draft_config")
        for key in ("aux_layers", "draft_vocab_size", "head_intermediate_size"):
            require(getattr(self, key) is None, key, getattr(self, key),
                    "null with model.draft_kind standalone (it is a key of EAGLE-3 heads: model.draft_kind eagle3)")
        if self.draft_layers is not None:
            layers = self.draft_layers
            require(len(layers) > 0 and min(layers) >= 0 and layers == sorted(set(layers)), "draft_layers", layers,
                    "a non-empty, strictly increasing list of layer indices >= 0")

    def _check_head_keys(self) -> None:
        """Ranges of the eagle3 keys that need no config (aux layer ids are checked against the target's config
        in distill.preflight)."""
        if self.aux_layers is not None:
            layers = self.aux_layers
            require(len(layers) == 3 and min(layers) >= 0 and layers == sorted(set(layers)), "aux_layers", layers,
                    "null or 3 distinct, ascending layer ids >= 0 (vLLM's EAGLE-3 reads exactly 3, in layer order)")
        require(self.draft_vocab_size is None or self.draft_vocab_size > 0, "draft_vocab_size",
                self.draft_vocab_size, "null or an integer > 0")
        require(self.head_intermediate_size is None or self.head_intermediate_size > 0, "head_intermediate_size",
                self.head_intermediate_size, "null or an integer > 0")


def _check_head_run(sections: dict[str, Any], source: str, override_keys: typing.Collection[str]) -> None:
    """What an EAGLE-3 head cannot be trained with: each refusal names the key."""
    refusals = [
        ("lora.enabled", sections["lora"].enabled, "false with model.draft_kind eagle3 (a head is one small "
                                                   "layer trained in full; LoRA adapts pre-trained drafts)"),
        ("distill.teacher_cache", sections["distill"].teacher_cache is not None,
         "null with model.draft_kind eagle3 (a head reads the target's hidden states at every step, which the "
         "cache of top-k log-probabilities does not hold)"),
        ("distill.on_policy_fraction", sections["distill"].on_policy_fraction > 0,
         "0 with model.draft_kind eagle3 (on-policy rows are sampled from standalone drafts only)"),
        ("train.gradient_checkpointing", sections["train"].gradient_checkpointing,
         "false with model.draft_kind eagle3 (a head is one layer: there is nothing to recompute)"),
        ("data.target_gamma", sections["data"].target_gamma is not None,
         "null with model.draft_kind eagle3 (the target's responses are generated by the target alone: an "
         "untrained head would only slow them down)"),
    ]
    for key, refused, allowed in refusals:
        if refused:
            section, name = key.split(".")
            value = getattr(sections[section], name)
            where = OVERRIDE_SOURCE if {key, "model.draft_kind"} & set(override_keys) else source
            raise RecipeError(key, f"got {value!r}; allowed: {allowed}", where)


LORA_ALL_LINEAR = "all-linear"


@dataclass
class LoraConfig:
    """LoRA adapters on the draft (peft): only the adapters (and modules_to_save) train; the export is merged."""

    enabled: bool = option(False, "Train LoRA adapters instead of every draft weight (needs model.draft or "
                                  "model.draft_layers: pre-trained weights to adapt).")
    r: int = option(16, "Rank of each adapter, > 0.")
    alpha: float = option(32.0, "Scaling: the update is (alpha / r) * B @ A, > 0.")
    dropout: float = option(0.0, "Dropout on the adapters' input, in [0, 1).")
    target_modules: list[str] | str = option(
        ["q_proj", "k_proj", "v_proj", "o_proj"],
        "Linear layers to adapt (names or name suffixes), or 'all-linear' (every linear layer but the lm_head).")
    modules_to_save: list[str] | None = option(
        None, "Modules trained in full next to the adapters (e.g. [lm_head]); null = none.")

    def __post_init__(self) -> None:
        check_types(self)
        require(self.r > 0, "r", self.r, "an integer > 0")
        require(self.alpha > 0, "alpha", self.alpha, "a number > 0")
        require(0.0 <= self.dropout < 1.0, "dropout", self.dropout, "a number in [0, 1)")
        if isinstance(self.target_modules, str):
            require(self.target_modules == LORA_ALL_LINEAR, "target_modules", self.target_modules,
                    f"a non-empty list of module names, or {LORA_ALL_LINEAR!r}")
        else:
            require(len(self.target_modules) > 0 and all(self.target_modules), "target_modules",
                    self.target_modules, f"a non-empty list of module names, or {LORA_ALL_LINEAR!r}")
        require(self.modules_to_save is None or (len(self.modules_to_save) > 0 and all(self.modules_to_save)),
                "modules_to_save", self.modules_to_save, "null or a non-empty list of module names")


def check_across_sections(sections: dict[str, Any], source: str, override_keys: typing.Collection[str]) -> None:
    """Rules that involve two sections (each section has already checked its own keys)."""
    lora, model = sections["lora"], sections["model"]
    if model.draft_kind == "eagle3":
        _check_head_run(sections, source, override_keys)
    else:
        distill = sections["distill"]
        for key, default in (("ttt_steps", 1), ("ttt_decay", 1.0)):
            if getattr(distill, key) != default:
                where = OVERRIDE_SOURCE if {f"distill.{key}", "model.draft_kind"} & set(override_keys) else source
                raise RecipeError(f"distill.{key}", f"got {getattr(distill, key)!r}; allowed: {default} with "
                                  "model.draft_kind standalone (training-time test unrolls EAGLE-3 heads: "
                                  "model.draft_kind eagle3)", where)
    if lora.enabled and model.draft_config is not None:
        where = OVERRIDE_SOURCE if {"lora.enabled", "model.draft_config"} & set(override_keys) else source
        raise RecipeError("lora.enabled", "got true with model.draft_config; allowed: false for a draft built from "
                          "scratch (LoRA adapts pre-trained weights, the random base would stay frozen); use "
                          "model.draft or model.draft_layers with LoRA", where)


@dataclass
class DataConfig:
    """Where the training rows come from (the dataset, the target's responses, mixed by weight), how they become
    token blocks, and which prompts measure acceptance."""

    dataset: str = option("", "Hub id, or local .txt/.json/.jsonl/.parquet file, folder or glob (required).")
    dataset_config: str | None = option(None, "Hub dataset configuration name.")
    split: str = option("train", "Split to train on (slicing such as train[:10%] works).")
    text_field: str = option("text", "Column holding plain text (format text).")
    messages_field: str = option("messages", "Column holding chat messages [{role, content}] (format chat).")
    format: Literal["auto", "text", "chat"] = option(
        "auto", "text: pack documents into max_length blocks; chat: one conversation per row, loss on assistant "
                "tokens only; auto: chat if messages_field exists, else text.")
    max_length: int = option(1024, "Tokens per training sequence (packed block or truncated conversation).")
    text_sample_by: Literal["document", "paragraph", "line"] = option(
        "document", "What one document of a local .txt file is: document = the whole file (line breaks kept, eos "
                    "only at its end), paragraph = each blank-line-separated paragraph, line = each line.")
    max_samples: int | None = option(None, "Use at most this many rows of the dataset.")
    num_proc: int | None = option(None, "Processes for tokenisation (datasets.map).")
    eval_prompts: str | None = option(
        None, "Acceptance prompts: .jsonl ('prompt' or 'messages' per line, optional 'category') or .txt (one per "
              "line); null = hold out num_eval_prompts rows of the dataset.")
    num_eval_prompts: int = option(16, "How many prompts to measure acceptance on.")
    eval_prompt_tokens: int = option(128, "Prompts are truncated to this many tokens.")
    prompt_tokens: int = option(
        32, "Prompt of a row trained from its first token (packed text): its first prompt_tokens tokens, at most "
            "max_length - 1 (chat rows: the conversation before the first assistant turn). Used by target responses "
            "and on-policy samples.")
    # sources of training rows (recipes/README.md, "Where the training rows come from")
    dataset_weight: float = option(1.0, "Mixing weight of source 'dataset': the dataset's own rows, >= 0.")
    target_weight: float = option(
        0.0, "Mixing weight of source 'target': the target's responses to the rows' prompts (sequence-level KD), "
             ">= 0. Rows are drawn from the sources at random in proportion to the weights.")
    target_data_dir: str | None = option(
        None, "Folder of the target's responses: generated on first use, resumed if interrupted, reused by later "
              "runs with the same inputs (required when target_weight > 0).")
    target_max_new_tokens: int = option(256, "Tokens the target generates per response (stops earlier at eos).")
    target_temperature: float = option(0.0, "Sampling temperature of the target's responses; 0 = greedy.")
    target_top_k: int | None = option(None, "Top-k filter of the target's responses (target_temperature > 0).")
    target_top_p: float | None = option(None, "Top-p filter of the target's responses (target_temperature > 0).")
    target_seed: int = option(0, "Response i is sampled with seed target_seed + i.")
    target_gamma: int | None = option(
        None, "Generate the responses with the speculative decoder, the initial draft proposing this many tokens "
              "per target pass (greedy: the same tokens; sampled: the same distribution); null = the target alone.")
    target_batch_size: int = option(
        1, "Prompts the target answers at once (left-padded, the target alone; 1 with data.target_gamma): greedy "
           "rows are the same at every size, sampled rows use the same per-prompt seeds (recipes/README.md).")
    target_engine: Literal["specdistill", "vllm"] = option(
        "specdistill", "Who generates the target's responses: specdistill = our decoder; vllm = vLLM's offline LLM "
        "in the serving venv (`make serving`; interpreter as eval.vllm_python), one vLLM run per shard.")

    def __post_init__(self) -> None:
        check_types(self)
        require(bool(self.dataset), "dataset", self.dataset, "a hub id or a local file, folder or glob")
        require(self.max_length >= 2, "max_length", self.max_length, "an integer >= 2")
        require(self.max_samples is None or self.max_samples > 0, "max_samples", self.max_samples, "null or > 0")
        require(self.num_proc is None or self.num_proc > 0, "num_proc", self.num_proc, "null or > 0")
        require(self.num_eval_prompts >= 0, "num_eval_prompts", self.num_eval_prompts, "an integer >= 0")
        require(self.eval_prompt_tokens > 0, "eval_prompt_tokens", self.eval_prompt_tokens, "an integer > 0")
        require(self.prompt_tokens > 0, "prompt_tokens", self.prompt_tokens, "an integer > 0")
        for key in ("dataset_weight", "target_weight"):
            require(getattr(self, key) >= 0, key, getattr(self, key), "a number >= 0")
        require(self.dataset_weight + self.target_weight > 0, "target_weight", self.target_weight,
                "weights with data.dataset_weight + data.target_weight > 0 (at least one source)")
        require(self.target_engine == "specdistill" or self.target_gamma is None, "target_engine", self.target_engine,
                "specdistill when target_gamma is set (vLLM generates with the target alone)")
        require(self.target_weight == 0 or bool(self.target_data_dir), "target_data_dir", self.target_data_dir,
                "a folder for the target's responses when data.target_weight > 0")
        require(self.target_max_new_tokens > 0, "target_max_new_tokens", self.target_max_new_tokens,
                "an integer > 0")
        require(self.target_temperature >= 0, "target_temperature", self.target_temperature, "a number >= 0")
        require(self.target_top_k is None or self.target_top_k > 0, "target_top_k", self.target_top_k,
                "null or an integer > 0")
        require(self.target_top_p is None or 0 < self.target_top_p <= 1, "target_top_p", self.target_top_p,
                "null or a number in (0, 1]")
        require(self.target_gamma is None or self.target_gamma > 0, "target_gamma", self.target_gamma,
                "null or an integer > 0")
        require(self.target_batch_size > 0, "target_batch_size", self.target_batch_size, "an integer > 0")
        require(self.target_gamma is None or self.target_batch_size == 1, "target_batch_size",
                self.target_batch_size, "1 with data.target_gamma (the speculative decoder runs one prompt at a time)")


@dataclass
class DistillConfig:
    """The per-token objective: a divergence between target and draft next-token distributions, plus optional CE,
    or a weighted combination of such losses (distill.loss_mix)."""

    loss: str | dict[str, Any] = option(
        "forward_kl", f"One of {', '.join(LOSSES)}; or a weighted combination {{name: weight}}, each weight a "
                      "number >= 0 or a linear schedule {start, end, steps} over optimizer steps (held at end after "
                      "steps; steps left out = the whole run). recipes/README.md, 'Which loss to pick'.")
    beta: float = option(0.5, "Mixture weight of the generalised JSD (loss jsd), in [0, 1].")
    temperature: float = option(1.0, "Softmax temperature applied to both models' logits, > 0.")
    ce_weight: float = option(0.0, "w in loss = (1 - w) * divergence + w * cross-entropy on data tokens, in [0, 1]; "
                                   "0 with a combination (put ce in it).")
    chunk_size: int = option(1024, "Token positions per chunk when computing logits (bounds memory), > 0.")
    # cached teacher (recipes/README.md, "Cached teacher")
    teacher_cache: str | None = option(
        None, "Folder of the target's top-k log-probabilities (plus tail mass) at every training position: built "
              "on first use (resumable), reused while target, tokenizer and rows are unchanged; training then never "
              "runs the target. Needs temperature 1; null = run the target at every step.")
    teacher_topk: int = option(32, "k: cached tokens per position, in [1, the target's vocabulary size].")
    teacher_cache_dtype: Literal["float16", "float32"] = option(
        "float16", "dtype of the cached log-probabilities (float16: half the bytes, ~5e-4 relative error).")
    # on-policy source (recipes/README.md, "On-policy")
    on_policy_fraction: float = option(
        0.0, "lambda in [0, 1]: each training row is, with this probability, replaced by the draft's own "
             "continuation of its prompt (source 'draft', on-policy distillation); 0 = off.")
    on_policy_max_new_tokens: int = option(
        128, "Tokens the draft samples per on-policy row (stops earlier at eos; the row stays <= data.max_length).")
    on_policy_temperature: float = option(1.0, "Sampling temperature of the draft's on-policy samples; 0 = greedy.")
    # training-time test of EAGLE-3 heads (recipes/README.md, "EAGLE-3 heads")
    ttt_steps: int = option(
        1, "eagle3: K, steps the head is unrolled on its own outputs in training (training-time test; EAGLE-3 "
           "uses 7); step j is scored against the target at its position. >= 1; 1 = no unrolling.")
    ttt_decay: float = option(
        1.0, "eagle3: step j's loss is weighted by ttt_decay ** j, in (0, 1].")

    def __post_init__(self) -> None:
        check_types(self)
        if isinstance(self.loss, str):
            require(self.loss in LOSSES, "loss", self.loss, "one of " + ", ".join(LOSSES)
                    + " (or a mapping {name: weight})")
        else:
            try:
                LossMix.parse(self.loss)
            except LossSpecError as err:
                raise RecipeError(err.key, err.problem) from None
            require(self.ce_weight == 0.0, "ce_weight", self.ce_weight,
                    "0 when distill.loss is a combination (give ce its weight inside distill.loss)")
        teacher_terms = teacher_divergences(self.loss)
        require(0.0 <= self.beta <= 1.0, "beta", self.beta, "a number in [0, 1]")
        require(self.temperature > 0, "temperature", self.temperature, "a number > 0")
        require(0.0 <= self.ce_weight <= 1.0, "ce_weight", self.ce_weight, "a number in [0, 1]")
        require(self.chunk_size > 0, "chunk_size", self.chunk_size, "an integer > 0")
        require(self.teacher_topk > 0, "teacher_topk", self.teacher_topk, "an integer > 0")
        require(0.0 <= self.on_policy_fraction <= 1.0, "on_policy_fraction", self.on_policy_fraction,
                "a number in [0, 1]")
        require(self.on_policy_max_new_tokens > 0, "on_policy_max_new_tokens", self.on_policy_max_new_tokens,
                "an integer > 0")
        require(self.on_policy_temperature >= 0, "on_policy_temperature", self.on_policy_temperature,
                "a number >= 0")
        require(self.ttt_steps >= 1, "ttt_steps", self.ttt_steps, "an integer >= 1")
        require(0.0 < self.ttt_decay <= 1.0, "ttt_decay", self.ttt_decay, "a number in (0, 1]")
        require(self.on_policy_fraction == 0 or bool(teacher_terms), "on_policy_fraction", self.on_policy_fraction,
                "0 with distill.loss ce (cross-entropy on the draft's own samples teaches nothing)")
        if self.teacher_cache is not None:
            require(self.temperature == 1.0, "temperature", self.temperature,
                    "1.0 with distill.teacher_cache (cached log-probabilities are at temperature 1)")
            require(bool(teacher_terms), "teacher_cache", self.teacher_cache, "null with distill.loss ce (no teacher)")
            require(self.on_policy_fraction == 0, "on_policy_fraction", self.on_policy_fraction,
                    "0 with distill.teacher_cache (the draft's samples are not in the cache)")

    @property
    def needs_teacher(self) -> bool:
        """Whether the loss has a divergence term (the target, or its cache, must be read)."""
        return bool(teacher_divergences(self.loss))

    def loss_at(self, step: int, total_steps: int) -> str | dict[str, float]:
        """distill_loss's `loss` at optimizer step `step` of total_steps: the name, or the combination's weights."""
        return self.loss if isinstance(self.loss, str) else LossMix.parse(self.loss).at(step, total_steps)


@dataclass
class TrainConfig:
    """The optimisation loop (passed to transformers.TrainingArguments)."""

    output_dir: str = option("outputs/draft", "Checkpoints, logs, acceptance.jsonl and the exported best draft.")
    max_steps: int = option(-1, "Optimizer steps; -1 = run num_train_epochs.")
    num_train_epochs: float = option(1.0, "Epochs over the training set when max_steps is -1.")
    per_device_train_batch_size: int = option(8, "Sequences per process per micro-batch.")
    gradient_accumulation_steps: int = option(1, "Micro-batches per optimizer step.")
    learning_rate: float = option(1e-4, "Peak learning rate.")
    lr_scheduler_type: str = option("cosine", "transformers scheduler name (linear, cosine, constant, ...).")
    warmup_ratio: float = option(0.03, "Fraction of steps with linear warm-up, in [0, 1).")
    weight_decay: float = option(0.0, "AdamW weight decay.")
    optim: str = option("adamw_torch", "transformers optimizer name.")
    max_grad_norm: float = option(1.0, "Gradient clipping norm; 0 = off.")
    logging_steps: int = option(10, "Log loss, kd, tv, learning rate and tokens/s every this many steps.")
    save_steps: int = option(500, "Save a checkpoint (and measure acceptance) every this many steps.")
    save_total_limit: int | None = option(3, "Keep at most this many checkpoints (the best is always kept).")
    seed: int = option(42, "Random seed (model init, data order, held-out prompts).")
    bf16: bool = option(False, "bfloat16 mixed precision (needs a GPU with bfloat16: Ampere or newer).")
    fp16: bool = option(False, "float16 mixed precision with loss scaling (needs a GPU; refused on CPU).")
    gradient_checkpointing: bool = option(
        False, "Recompute draft activations in the backward pass (less activation memory, ~30% more compute).")
    resume_from_checkpoint: str | bool | None = option(
        None, "A checkpoint folder, or true for the latest checkpoint in output_dir.")
    overwrite_output_dir: bool = option(
        False, "Start a new run in an output_dir that holds one (its checkpoints, logs and export are deleted); "
               "without it such a run is refused.")
    report_to: list[str] = option(["tensorboard"], "Trackers (tensorboard, wandb, ...); [] = none.")
    dataloader_num_workers: int = option(0, "Data loader worker processes.")
    ddp_timeout: int = option(1800, "Seconds a process waits for the others (acceptance runs on rank 0 only).")

    def __post_init__(self) -> None:
        check_types(self)
        require(bool(self.output_dir), "output_dir", self.output_dir, "a folder path")
        require(self.max_steps == -1 or self.max_steps > 0, "max_steps", self.max_steps, "-1 or an integer > 0")
        require(self.num_train_epochs > 0, "num_train_epochs", self.num_train_epochs, "a number > 0")
        for key in ("per_device_train_batch_size", "gradient_accumulation_steps", "logging_steps", "save_steps"):
            require(getattr(self, key) > 0, key, getattr(self, key), "an integer > 0")
        require(self.learning_rate > 0, "learning_rate", self.learning_rate, "a number > 0")
        require(0.0 <= self.warmup_ratio < 1.0, "warmup_ratio", self.warmup_ratio, "a number in [0, 1)")
        require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "a number >= 0")
        require(self.max_grad_norm >= 0, "max_grad_norm", self.max_grad_norm, "a number >= 0")
        require(self.save_total_limit is None or self.save_total_limit > 0, "save_total_limit",
                self.save_total_limit, "null or an integer > 0")
        require(not (self.bf16 and self.fp16), "fp16", self.fp16, "false when train.bf16 is true")
        require(self.resume_from_checkpoint is not False, "resume_from_checkpoint", False,
                "null, true or a checkpoint folder")
        require(not (self.overwrite_output_dir and self.resume_from_checkpoint), "overwrite_output_dir", True,
                "false with train.resume_from_checkpoint (resume keeps the run, overwrite deletes it)")
        require(self.dataloader_num_workers >= 0, "dataloader_num_workers", self.dataloader_num_workers, ">= 0")
        require(self.ddp_timeout > 0, "ddp_timeout", self.ddp_timeout, "an integer > 0")


def check_precision(cfg: TrainConfig, source: str | None = None) -> None:
    """Refuse mixed precision this machine cannot run, before TrainingArguments sees it.

    Raises RecipeError naming train.fp16 on a CPU-only run (accelerate would silently train in float32 there) and
    train.bf16 without a bfloat16-capable GPU (transformers refuses it with use_cpu unset, as train.py leaves it).
    """
    import torch
    from accelerate.utils import parse_flag_from_env
    from transformers.utils import is_torch_bf16_gpu_available

    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6: cuda, xpu, mps, ...
    has_gpu = accelerator.is_available() if accelerator is not None else torch.cuda.is_available()
    on_cpu = not has_gpu or parse_flag_from_env("ACCELERATE_USE_CPU")
    if cfg.fp16 and on_cpu:
        raise RecipeError("train.fp16", "got true on a CPU-only run; allowed: false. float16 mixed precision needs "
                          "a GPU (on CPU accelerate would silently train in float32); leave train.fp16 and "
                          "train.bf16 false on CPU", source)
    if cfg.bf16 and (on_cpu or not is_torch_bf16_gpu_available()):
        raise RecipeError("train.bf16", "got true without a bfloat16-capable GPU; allowed: false. bfloat16 mixed "
                          "precision needs an Ampere-or-newer GPU here (transformers refuses it on CPU unless "
                          "TrainingArguments(use_cpu=True)); on CPU leave it false, or load bfloat16 weights with "
                          "model.draft_dtype / model.target_dtype", source)


@dataclass
class EvalConfig:
    """Acceptance measured with decode.evaluate at every checkpoint (see docs/INTERFACES.md)."""

    gammas: list[int | Literal["auto"]] = option(
        [1, 2, 4], "Draft lengths to measure; the best one goes into generation_config. 'auto' = chosen at every "
        "step from the running acceptance and the measured costs (its row reports mean_gamma).")
    temperatures: list[float] = option(
        [0.0], "Sampling temperatures to measure; the first one picks the best checkpoint.")
    max_new_tokens: int = option(64, "Tokens generated per prompt.")
    top_k: int | None = option(None, "Top-k sampling filter (temperature > 0).")
    top_p: float | None = option(None, "Top-p sampling filter (temperature > 0).")
    seed: int = option(0, "Sampling seed.")
    repeats: int = option(1, "Timing repeats per prompt.")
    at_checkpoints: bool = option(True, "Measure at every checkpoint; false = only at the end of training.")
    chat_template: Literal["auto", "on", "off"] = option(
        "auto", "Render acceptance prompts with the tokenizer's chat template: auto = conversations only (in a "
                "chat-format run every prompt is a conversation); on = every prompt (error without a template); "
                "off = raw text (decode.prompts).")
    compile: bool = option(
        False, "Measure on the static-cache, torch.compiled decode path (compiled once, reused at every checkpoint).")
    serving_engine: Literal["none", "vllm"] = option(
        "none", "After export, also measure the exported draft inside a serving engine: vllm = vLLM's offline LLM "
        "(the serving venv of `make serving`) at the integer gammas and the first temperature; train_results.json "
        "and the model card then show vLLM's tau next to ours.")
    vllm_python: str | None = option(
        None, "Interpreter with vLLM for serving_engine: vllm; null = $SPECDISTILL_VLLM_PYTHON, else "
        ".venv-vllm/bin/python.")

    def __post_init__(self) -> None:
        check_types(self)
        require(len(self.gammas) > 0 and all(g == "auto" or g > 0 for g in self.gammas), "gammas", self.gammas,
                "a non-empty list of integers > 0 and/or 'auto'")
        require(len(self.temperatures) > 0 and all(t >= 0 for t in self.temperatures), "temperatures",
                self.temperatures, "a non-empty list of numbers >= 0")
        require(self.max_new_tokens > 0, "max_new_tokens", self.max_new_tokens, "an integer > 0")
        require(self.top_k is None or self.top_k > 0, "top_k", self.top_k, "null or an integer > 0")
        require(self.top_p is None or 0 < self.top_p <= 1, "top_p", self.top_p, "null or a number in (0, 1]")
        require(self.repeats > 0, "repeats", self.repeats, "an integer > 0")
        require(self.serving_engine == "none" or any(g != "auto" for g in self.gammas), "serving_engine",
                self.serving_engine, "none, unless eval.gammas holds an integer gamma (vLLM drafts a fixed number)")


@dataclass
class HubConfig:
    """Publishing the exported draft (distill.hub.push_to_hub)."""

    push_to_hub: bool = option(False, "Push the exported best draft at the end of training.")
    repo_id: str | None = option(None, "Hub repository, e.g. you/qwen2.5-0.5b-draft (required to push).")
    private: bool = option(True, "Create the repository as private.")

    def __post_init__(self) -> None:
        check_types(self)
        require(not self.push_to_hub or bool(self.repo_id), "repo_id", self.repo_id,
                "a hub repository id when hub.push_to_hub is true")


SECTION_TYPES: dict[str, type] = {
    "model": ModelConfig, "lora": LoraConfig, "data": DataConfig, "distill": DistillConfig,
    "train": TrainConfig, "eval": EvalConfig, "hub": HubConfig,
}


@dataclass
class Recipe:
    """A whole training run; each attribute is one section of the YAML file."""

    model: ModelConfig
    data: DataConfig
    lora: LoraConfig = field(default_factory=LoraConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    hub: HubConfig = field(default_factory=HubConfig)
