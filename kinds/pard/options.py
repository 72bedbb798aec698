"""The recipe keys of a PARD draft (mixed into the recipe's model and distill sections, distill/recipe/sections.py;
recipes/README.md, "PARD drafts"). Where the draft comes from is the standalone draft's keys (model.draft,
draft_layers, draft_config): a PARD draft is a standalone draft that learned to draft in parallel."""
from __future__ import annotations

from pydantic import BaseModel, Field

from kinds.standalone.options import StandaloneModelOptions


class PardModelOptions(StandaloneModelOptions):
    pard_gamma: int = Field(
        8, ge=2, description="pard: the most tokens one forward drafts (the newest token's successor and pard_gamma "
                             "- 1 mask slots after it); eval gammas <= pard_gamma. PARD's authors train 8.")
    pard_token: int | None = Field(
        None, ge=0, description="pard: the id of the mask token filling the slots (vLLM reads `pard_token` from the "
                                "draft's config.json); null = the tokenizer's mask token, else the first embedding "
                                "row past the tokenizer; a vocabulary without a spare row needs an id its text never "
                                "holds (e.g. a reserved special token).")


class PardDistillOptions(BaseModel):
    pard_blocks: int = Field(
        32, ge=1, description="pard, p_eagle: blocks of mask slots trained per row and step, at random anchors "
                              "(positions whose first mask slot has a loss token); every row position also trains as "
                              "slot 0, the ordinary next-token prediction.")
    pard_position_decay: float | None = Field(
        None, gt=0, description="pard, p_eagle: w in the weight exp(-k / w) of mask slot k = 1..gamma - 1 (slot 0, "
                                "the ordinary prediction, weighs 1); null = every slot weighs 1, as PARD trains.")
