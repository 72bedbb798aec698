"""The recipe keys of a P-EAGLE head (mixed into the recipe's model and distill sections, distill/recipe/sections.py;
recipes/README.md, "P-EAGLE heads"): an EAGLE-3 head's keys, the mask token and the gamma it drafts in one pass, and
the mask-slot blocks it trains on (the keys PARD drafts train with)."""
from __future__ import annotations

from pydantic import Field

from kinds.eagle3.options import Eagle3DistillOptions, Eagle3ModelOptions
from kinds.pard.options import PardDistillOptions


class PEagleModelOptions(Eagle3ModelOptions):
    ptd_gamma: int = Field(
        8, ge=2, description="p_eagle: the most tokens one head pass drafts (the newest token's successor and "
                             "ptd_gamma - 1 mask slots after it); eval gammas <= ptd_gamma.")
    ptd_token_id: int | None = Field(
        None, ge=0, description="p_eagle: the id of the token the mask slots read (vLLM reads `ptd_token_id` from the "
                                "head's config.json and embeds it with the target's embedding); null = the "
                                "tokenizer's mask token, else the first embedding row past the tokenizer; a "
                                "vocabulary without a spare row needs an id its text never holds (e.g. a reserved "
                                "special token).")


class PEagleDistillOptions(Eagle3DistillOptions, PardDistillOptions):
    """distill.pard_blocks and pard_position_decay (PARD's) place and weigh the mask slots; ttt_steps stays 1."""
