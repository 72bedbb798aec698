"""The recipe keys of a DFlash draft (mixed into the recipe's model and distill sections,
distill/recipe/sections.py; recipes/README.md, "DFlash drafts")."""
from __future__ import annotations

from pydantic import BaseModel, Field

from kinds.standalone.options import LayerIds


class DFlashModelOptions(BaseModel):
    dflash_layers: int = Field(
        1, ge=1, description="dflash: decoder layers of the draft (z-lab's Qwen3-8B drafts have 5; each costs about "
                             "one target layer per step, whatever gamma is).")
    dflash_block_size: int = Field(
        8, ge=2, description="dflash: the block the draft fills in one forward: the newest token and block_size - 1 "
                             "mask tokens, so gamma <= block_size - 1 (vLLM's and z-lab's drafts use 16).")
    dflash_target_layers: LayerIds | None = Field(
        None, description="dflash: 0-based ids of the target layers whose OUTPUT the draft reads (DFlash's and "
                          "vLLM's config convention; at most L - 2); null = DFlash's spread (one layer: L // 2, more: "
                          "spread over 1..L - 3).")
    dflash_mask_token_id: int | None = Field(
        None, ge=0, description="dflash: the id whose target embedding fills the block's masked slots; null = the "
                                "tokenizer's mask token, else the first embedding row past the tokenizer (SpecForge's "
                                "choice); a target without a spare row needs an id its text never holds (e.g. a "
                                "reserved special token).")
    dflash_init_layers: LayerIds | None = Field(
        None, description="dflash: target decoder layers copied into the draft's layers (one id per draft layer: "
                          "attention and MLP weights and norms; q_norm / k_norm start at 1); null = random.")


class DFlashDistillOptions(BaseModel):
    dflash_blocks: int = Field(
        16, ge=1, description="dflash: blocks trained per row and step, at random anchors (positions whose next "
                              "token is a loss token); SpecForge samples 512 per long row.")
    dflash_position_decay: float | None = Field(
        4.0, gt=0, description="dflash: w in the weight exp(-(k - 1) / w) of block position k = 1..block_size - 1 "
                               "(the field uses 7 for blocks of 16, 4 for 8); null = every position weighs 1.")
