"""The recipe keys of a PARD draft (mixed into the recipe's model and distill sections, distill/recipe/sections.py;
recipes/README.md, "PARD drafts"). Where the draft comes from is the standalone draft's keys (model.draft,
draft_layers, draft_config): a PARD draft is a standalone draft that learned to draft in parallel. Its gamma and mask
token are a parallel draft's (kinds/parallel_drafting.py) under PARD's names (KEYS)."""
from __future__ import annotations

from pydantic import BaseModel, Field

from kinds.parallel_drafting import ParallelKeys, gamma_field, token_field
from kinds.standalone.options import StandaloneModelOptions

KEYS = ParallelKeys(kind="pard", token="pard_token", gamma="pard_gamma", check="pard_token", drafter="draft",
                    unit="forward", embedding="draft's")


class PardModelOptions(StandaloneModelOptions):
    pard_gamma: int = gamma_field(KEYS, "one forward", " PARD's authors train 8.")
    pard_token: int | None = token_field(KEYS, "the mask token filling the slots")


class PardDistillOptions(BaseModel):
    pard_blocks: int = Field(
        32, ge=1, description="pard, p_eagle: blocks of mask slots trained per row and step, at random anchors "
                              "(positions whose first mask slot has a loss token); every row position also trains as "
                              "slot 0, the ordinary next-token prediction.")
    pard_position_decay: float | None = Field(
        None, gt=0, description="pard, p_eagle: w in the weight exp(-k / w) of mask slot k = 1..gamma - 1 (slot 0, "
                                "the ordinary prediction, weighs 1); null = every slot weighs 1, as PARD trains.")
