"""The recipe keys of a standalone draft (mixed into the recipe's model section, distill/recipe/sections.py, which
checks them like every recipe key)."""
from __future__ import annotations

from typing import Annotated

from annotated_types import Ge, MinLen
from pydantic import BaseModel, Field, JsonValue

LayerIds = Annotated[list[Annotated[int, Ge(0)]], MinLen(1)]
SOURCE_KEYS = ("draft", "draft_layers", "draft_config")  # exactly one says where the draft comes from


class StandaloneModelOptions(BaseModel):
    draft: str | None = Field(None, description="standalone: the draft to fine-tune, a local folder or hub id.")
    draft_layers: LayerIds | None = Field(
        None, description="standalone: build the draft from the target by keeping these decoder layers (0-based, "
                          "increasing).")
    draft_config: dict[str, JsonValue] | None = Field(
        None, description="standalone: build the draft from scratch: the target's config with these keys "
                          "overridden.")
    draft_vocab_size: int | None = Field(
        None, gt=0, description="eagle3, standalone, pard: the draft proposes only the most frequent target tokens "
                                "of the training data, this many. eagle3: the rows of the head's lm_head; null = the "
                                "whole vocabulary when it has <= 32768 tokens, else 32768. standalone, pard: the draft "
                                "keeps its whole lm_head (transformers and vLLM load it unchanged) and stores the ids "
                                "in draft_vocab.json, whose rows alone our decoder reads out (FR-Spec; a PARD draft's "
                                "every slot); null = every row.")
