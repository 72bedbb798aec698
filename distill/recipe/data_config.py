"""The `data:` section of a recipe: where the training rows come from and which prompts measure acceptance."""
from __future__ import annotations

import difflib
from typing import Literal

from pydantic import Field, model_validator

from distill.recipe.schema import Section, require

# What data.synthesize_categories may name: the categories of recipes/prompts/chat_eval.jsonl, each with its openers
# in distill.data.magpie.CATEGORY_OPENERS (keyed by these names, in this order).
PROMPT_CATEGORIES = ("writing", "qa", "math", "coding", "reasoning", "advice", "summarization", "extraction")


class DataConfig(Section):
    """Where the training rows come from (the dataset, the target's responses, mixed by weight), how they become
    token blocks, and which prompts measure acceptance."""

    section = "data"

    dataset: str | None = Field(None, min_length=1, description="Hub id, or local .txt/.json/.jsonl/.parquet file, "
                                                               "folder or glob (required unless "
                                                               "data.synthesize_prompts makes the prompts).")
    dataset_config: str | None = Field(None, description="Hub dataset configuration name.")
    split: str = Field("train", description="Split to train on (slicing such as train[:10%] works).")
    text_field: str = Field("text", description="Column holding plain text (format text).")
    messages_field: str = Field("messages", description="Column holding chat messages [{role, content}] (format chat).")
    format: Literal["auto", "text", "chat", "prompts"] = Field(
        "auto", description="text: pack documents into max_length blocks; chat: one conversation per row, loss on "
                            "assistant tokens only; prompts: one prompt per row (a .txt line, a 'prompt' field, a "
                            "conversation ending in a user turn), answered by the target (data.dataset_weight 0); "
                            "auto: prompts if the rows hold a 'prompt' column or conversations without an assistant "
                            "turn, chat if messages_field exists, else text.")
    loss_tokens: Literal["assistant", "all"] = Field(
        "assistant", description="Which tokens of a chat row are training targets: assistant = the assistant turns "
                                 "(with the template's end-of-turn tokens after them); all = every token, the system "
                                 "and user turns too: more targets from the same rows where the prompts are the "
                                 "target's own text (data.synthesize_prompts, specdistill-data prompts). Packed text "
                                 "trains on every token either way; a draft vocabulary is still counted on the "
                                 "assistant tokens. Unset with model.draft_kind eagle3: all (the kind's default).")
    max_length: int = Field(1024, ge=2, description="Tokens per training sequence (packed block or truncated "
                                                    "conversation).")
    text_sample_by: Literal["document", "paragraph", "line"] = Field(
        "document", description="What one document of a local .txt file is: document = the whole file (line breaks "
                                "kept, eos only at its end), paragraph = each blank-line-separated paragraph, line = "
                                "each line.")
    max_samples: int | None = Field(None, gt=0, description="Use at most this many rows of the dataset.")
    num_proc: int | None = Field(None, gt=0, description="Processes for tokenisation (datasets.map).")
    eval_prompts: str | None = Field(
        None, description="Acceptance prompts: .jsonl ('prompt' or 'messages' per line, optional 'category') or .txt "
                          "(one per line); null = hold out num_eval_prompts rows of the dataset.")
    num_eval_prompts: int = Field(16, ge=0, description="How many prompts to measure acceptance on.")
    eval_prompt_tokens: int = Field(128, gt=0, description="Prompts are truncated to this many tokens.")
    prompt_tokens: int = Field(
        32, gt=0, description="Prompt of a row trained from its first token (packed text): its first prompt_tokens "
                              "tokens, at most max_length - 1 (chat rows: the conversation before the first "
                              "assistant turn). Used by target responses and on-policy samples.")
    # sources of training rows (recipes/README.md, "Where the training rows come from")
    dataset_weight: float = Field(1.0, ge=0, description="Mixing weight of source 'dataset': the dataset's own rows, "
                                                         ">= 0.")
    target_weight: float = Field(
        0.0, ge=0, description="Mixing weight of source 'target': the target's responses to the rows' prompts "
                               "(sequence-level KD), >= 0. Rows are drawn from the sources at random in proportion "
                               "to the weights.")
    target_data_dir: str | None = Field(
        None, description="Folder of the target's responses: generated on first use, resumed if interrupted, reused "
                          "by later runs with the same inputs (required when target_weight > 0).")
    target_max_new_tokens: int = Field(256, gt=0, description="Tokens the target generates per response (stops "
                                                              "earlier at eos).")
    target_temperature: float = Field(0.0, ge=0, description="Sampling temperature of the target's responses; 0 = "
                                                             "greedy.")
    target_top_k: int | None = Field(None, gt=0, description="Top-k filter of the target's responses "
                                                             "(target_temperature > 0).")
    target_top_p: float | None = Field(None, gt=0, le=1, description="Top-p filter of the target's responses "
                                                                     "(target_temperature > 0).")
    target_seed: int = Field(0, description="Response i is sampled with seed target_seed + i.")
    target_gamma: int | None = Field(
        None, gt=0, description="Generate the responses with the speculative decoder, the initial draft proposing "
                                "this many tokens per target pass (greedy: the same tokens; sampled: the same "
                                "distribution); null = the target alone.")
    target_batch_size: int = Field(
        1, gt=0, description="Prompts the target answers at once (left-padded, the target alone; 1 with "
                             "data.target_gamma): greedy rows are the same at every size, sampled rows use the same "
                             "per-prompt seeds (recipes/README.md).")
    synthesize_prompts: int | None = Field(
        None, gt=0, description="Make this many prompts with the target itself (Magpie: the target is given its chat "
                                "template up to a user turn and writes the user message): sampled, deduplicated, "
                                "seeded by target_seed, stored in target_data_dir/prompts and resumed like the "
                                "responses; the target then answers them (needs target_weight > 0).")
    synthesize_categories: list[str] | None = Field(
        None, min_length=1, description="Write the synthesized prompts toward these categories, taking turns: each "
                                        "begins with a built-in opener of its category (writing, qa, math, coding, "
                                        "reasoning, advice, summarization, extraction; [all] for every one) and the "
                                        "target writes the rest; null = the bare user turn (mostly requests for "
                                        "advice and explanations).")
    synthesize_max_tokens: int = Field(128, gt=0, description="Longest synthesized prompt in tokens (longer "
                                                              "candidates are dropped).")
    synthesize_temperature: float = Field(1.0, gt=0, description="Sampling temperature of synthesized prompts.")
    target_engine: Literal["specdistill", "vllm"] = Field(
        "specdistill", description="Who generates the target's responses: specdistill = our decoder; vllm = vLLM's "
                                   "offline LLM in the serving venv (`make serving`; interpreter as "
                                   "eval.vllm_python), one vLLM run per shard.")

    @model_validator(mode="after")
    def _rules(self) -> DataConfig:
        """Rules between keys (each key's own range is in its Field)."""
        require(self.dataset is not None or self.synthesize_prompts is not None, "data.dataset", self.dataset,
                "a hub id or local file/folder (or data.synthesize_prompts: N to make prompts with the target)",
                involves=["data.synthesize_prompts"])
        require(self.synthesize_prompts is None or self.target_weight > 0, "data.synthesize_prompts",
                self.synthesize_prompts, "null unless data.target_weight > 0 (the target answers the prompts it "
                "makes)", involves=["data.target_weight"])
        require(self.synthesize_categories is None or self.synthesize_prompts is not None,
                "data.synthesize_categories", self.synthesize_categories, "null unless data.synthesize_prompts is set "
                "(the categories steer the prompts it makes)", involves=["data.synthesize_prompts"])
        if self.synthesize_categories is not None:
            known = [*PROMPT_CATEGORIES, "all"]
            unknown = [name for name in self.synthesize_categories if name not in known]
            close = difflib.get_close_matches(unknown[0], known, n=1) if unknown else []
            require(not unknown, "data.synthesize_categories", self.synthesize_categories,
                    f"names from {', '.join(known)} ({unknown[0] if unknown else ''!r} is not one"
                    + (f"; did you mean {close[0]!r}?)" if close else ")"))
        require(self.dataset is not None or self.dataset_weight == 0, "data.dataset_weight", self.dataset_weight,
                "0 without data.dataset (there are no dataset rows to train on)", involves=["data.dataset"])
        require(self.format != "prompts" or self.dataset_weight == 0, "data.dataset_weight", self.dataset_weight,
                "0 with data.format prompts (prompts alone are not training rows: the target writes the responses)",
                involves=["data.format"])
        require(self.dataset_weight + self.target_weight > 0, "data.target_weight", self.target_weight,
                "weights with data.dataset_weight + data.target_weight > 0 (at least one source)",
                involves=["data.dataset_weight"])
        require(self.target_engine == "specdistill" or self.target_gamma is None, "data.target_engine",
                self.target_engine, "specdistill when target_gamma is set (vLLM generates with the target alone)",
                involves=["data.target_gamma"])
        require(self.target_weight == 0 or bool(self.target_data_dir), "data.target_data_dir", self.target_data_dir,
                "a folder for the target's responses when data.target_weight > 0", involves=["data.target_weight"])
        require(self.target_gamma is None or self.target_batch_size == 1, "data.target_batch_size",
                self.target_batch_size, "1 with data.target_gamma (the speculative decoder runs one prompt at a time)",
                involves=["data.target_gamma"])
        return self
