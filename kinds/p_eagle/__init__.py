"""A P-EAGLE head (parallel EAGLE, AWS): an EAGLE-3 head that drafts all gamma tokens in ONE pass, its mask slots
reading a mask token (`ptd_token_id`) and a learned hidden state (`mask_hidden`); vLLM's eagle3 with
parallel_drafting. Built and served as an EAGLE-3 head (kinds/eagle3) with those two additions; trained on the row
(slot 0, the head's own first step) plus blocks of mask slots at random anchors, as a PARD draft is. What the two share
(parallel drafting) is written once in kinds/parallel_drafting.py, under P-EAGLE's names.

    options.py   its recipe keys: an EAGLE-3 head's, model.ptd_gamma, ptd_token_id; distill.pard_blocks,
                 pard_position_decay
    build.py     the head with its mask token and gamma in its config and mask_hidden
    drafter.py   ParallelHeadDrafter (our decoder, eager and compiled)
    loss.py      ParallelHead (the row and the blocks' slots in one pass), anchors, slot labels, teacher rows
    trainer.py   PEagleTrainer
    deploy.py    its deployment checks and serving commands
    card.py      its model card's lines and usage
"""
from __future__ import annotations

from pathlib import Path

from kinds.eagle3 import Eagle3Kind
from kinds.p_eagle.options import KEYS, PEagleDistillOptions, PEagleModelOptions


class PEagleKind(Eagle3Kind):
    name, title = "p_eagle", "P-EAGLE heads"
    summary = ("a P-EAGLE head (an EAGLE-3 head drafting all gamma tokens in one pass from mask slots, served by "
               "vLLM's eagle3 with parallel drafting)")
    assisted_refusal = ("transformers' assisted generation cannot run an EAGLE-3 head, parallel or not (it runs in "
                        "specdistill's decoder and vLLM)")
    model_options, distill_options = PEagleModelOptions, PEagleDistillOptions
    # No training-time test (the decoder never feeds the head its own outputs: the mask slots draft instead); the
    # EAGLE-3 head's warm-up.
    defaults = {"train.warmup_steps": 0.2}

    # -- decoding ---------------------------------------------------------------------------------------------------
    def recognises(self, draft: str) -> bool:
        """An EAGLE-3 head folder whose config.json names a `ptd_token_id`."""
        from kinds.eagle3.model import is_eagle3_folder, parallel_token, read_config

        folder = Path(draft).expanduser()
        try:
            return is_eagle3_folder(folder) and parallel_token(read_config(folder)) is not None
        except (OSError, ValueError):
            return False  # the EAGLE-3 kind's loading reports an unreadable config

    def holds(self, draft: object) -> bool:
        from kinds.eagle3.model import Eagle3Head, parallel_token
        from kinds.p_eagle.drafter import ParallelHeadDrafter

        return isinstance(draft, ParallelHeadDrafter) or (isinstance(draft, Eagle3Head)
                                                          and parallel_token(draft.config) is not None)

    def drafter(self, draft, target, compile=False, capacity=0, max_gamma=8):
        from kinds.eagle3.drafter import bound_head
        from kinds.p_eagle.drafter import ParallelHeadDrafter

        if isinstance(draft, ParallelHeadDrafter):
            return draft
        return ParallelHeadDrafter(bound_head(draft, target), compile=compile, capacity=capacity, max_gamma=max_gamma)

    def reserve(self, draft, target, capacity, max_gamma):
        """The target's verify pass with the head's aux layers, and the head's own cache with its feed lengths."""
        from decode.loop.static import session
        from kinds.eagle3.drafter import bound_head
        from kinds.p_eagle.drafter import ParallelHeadDrafter

        session(target, "target", tuple(draft.aux_layers)).reserve(capacity)
        ParallelHeadDrafter(bound_head(draft, target), compile=True, max_gamma=max_gamma).new_cache(capacity)

    def vllm_options(self) -> dict:
        from kinds.parallel_drafting import VLLM_OPTIONS

        return dict(VLLM_OPTIONS)

    # -- deployment -------------------------------------------------------------------------------------------------
    def deploy_check(self, target, draft, trust_remote_code=False):
        from kinds.p_eagle.deploy import check_p_eagle_deploy

        return check_p_eagle_deploy(target, draft, trust_remote_code)

    def serving_commands(self, report) -> str:
        from kinds.p_eagle.deploy import p_eagle_commands

        return p_eagle_commands(report)

    @property
    def card(self):
        from kinds.p_eagle.card import CARD

        return CARD

    # -- recipes ----------------------------------------------------------------------------------------------------
    def check_recipe(self, recipe) -> None:
        """The EAGLE-3 head's rules; no training-time test (ttt_steps 1); the measured gammas within the trained
        ones (gamma <= model.ptd_gamma)."""
        from distill.recipe.schema import require
        from kinds.parallel_drafting import check_trained_gammas

        super().check_recipe(recipe)
        require(recipe.distill.ttt_steps == 1, "distill.ttt_steps", recipe.distill.ttt_steps,
                "1 with model.draft_kind p_eagle (its mask slots draft the later tokens: the decoder never feeds the "
                "head its own outputs)", ["model.draft_kind"])
        check_trained_gammas(recipe, KEYS)

    # -- training ---------------------------------------------------------------------------------------------------
    def check_plan(self, cfg, target_config, tokenizer, hidden_state_cache):
        """The EAGLE-3 head's plan and the mask token."""
        from kinds.p_eagle.build import plan_p_eagle

        super().check_plan(cfg, target_config, tokenizer, hidden_state_cache)
        plan_p_eagle(cfg, target_config, tokenizer)

    def build(self, cfg, target, dtype, lora):
        from kinds.p_eagle.build import build_p_eagle

        return build_p_eagle(cfg, target, dtype)

    def trainer(self) -> type:
        from kinds.p_eagle.trainer import PEagleTrainer

        return PEagleTrainer


KIND = PEagleKind()
