"""The recipe keys of a P-EAGLE head (mixed into the recipe's model and distill sections, distill/recipe/sections.py;
recipes/README.md, "P-EAGLE heads"): an EAGLE-3 head's keys, the mask token and the gamma it drafts in one pass (a
parallel draft's, kinds/parallel_drafting.py, under P-EAGLE's names: KEYS), and the mask-slot blocks it trains on
(the keys PARD drafts train with)."""
from __future__ import annotations

from kinds.eagle3.options import Eagle3DistillOptions, Eagle3ModelOptions
from kinds.parallel_drafting import ParallelKeys, gamma_field, token_field
from kinds.pard.options import PardDistillOptions

KEYS = ParallelKeys(kind="p_eagle", token="ptd_token_id", gamma="ptd_gamma", check="ptd_token", drafter="head",
                    unit="pass", embedding="target's")


class PEagleModelOptions(Eagle3ModelOptions):
    ptd_gamma: int = gamma_field(KEYS, "one head pass")
    ptd_token_id: int | None = token_field(KEYS, "the token the mask slots read",
                                           " and embeds it with the target's embedding")


class PEagleDistillOptions(Eagle3DistillOptions, PardDistillOptions):
    """distill.pard_blocks and pard_position_decay (PARD's) place and weigh the mask slots; ttt_steps stays 1."""
