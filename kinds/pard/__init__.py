"""A PARD draft (PARallel Draft, AMD): a standalone causal LM that drafts all gamma tokens in ONE forward, fed the
newest token and gamma - 1 copies of a mask token (`pard_token`); vLLM's draft_model with parallel_drafting. Built
like a standalone draft (model.draft, draft_layers or draft_config: a sequential draft converts by training) and
trained on the row (slot 0) plus blocks of mask slots at random anchors, each slot scored against the target's
distribution. What it shares with a P-EAGLE head (parallel drafting: the gamma and mask-token keys and checks, the
slots' mask and weighted loss, the card's usage) is written once in kinds/parallel_drafting.py, under PARD's names.

    options.py   its recipe keys: the standalone draft's, model.pard_gamma, pard_token; distill.pard_blocks,
                 pard_position_decay
    build.py     the standalone draft with its mask token written into its config
    drafter.py   ParallelDrafter (our decoder)
    loss.py      slot 0 and the mask slots: anchors, the 4D attention mask, the per-slot weighted loss
    trainer.py   PardTrainer
    deploy.py    its deployment checks and serving commands
    card.py      its model card's lines and usage
"""
from __future__ import annotations

from pathlib import Path

from kinds.base import Kind
from kinds.pard.options import KEYS, PardDistillOptions, PardModelOptions
from kinds.standalone import KIND as STANDALONE


class PardKind(Kind):
    name, title = "pard", "PARD drafts"
    summary = ("a PARD draft (a small LM of its own drafting all gamma tokens in one forward from mask tokens, served "
               "by vLLM's parallel drafting)")
    vllm_method, has_weights, trains, language_model = "draft_model", True, True, True
    assisted_refusal = ("transformers' assisted generation drafts one token per forward and cannot run a PARD draft in "
                        "parallel (it runs in specdistill's decoder and vLLM)")
    model_options, distill_options = PardModelOptions, PardDistillOptions

    # -- decoding ---------------------------------------------------------------------------------------------------
    def recognises(self, draft: str) -> bool:
        """A folder whose config.json names a `pard_token`."""
        import json

        config = Path(draft).expanduser() / "config.json"
        try:
            return config.is_file() and KEYS.token in json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False  # the standalone kind's loading reports an unreadable config

    def holds(self, draft: object) -> bool:
        from kinds.pard.drafter import ParallelDrafter

        return isinstance(draft, ParallelDrafter) or getattr(getattr(draft, "config", None), KEYS.token,
                                                             None) is not None

    def load(self, draft, target, device, dtype, trust_remote_code=False, earliest=False):
        return STANDALONE.load(draft, target, device, dtype, trust_remote_code)

    def drafter(self, draft, target, compile=False, capacity=0, max_gamma=8):
        from kinds.pard.drafter import ParallelDrafter

        if isinstance(draft, ParallelDrafter):
            return draft
        return ParallelDrafter(draft, compile=compile, capacity=capacity, max_gamma=max_gamma,
                               vocab=getattr(draft, "draft_vocab_ids", None))

    def reserve(self, draft, target, capacity, max_gamma):
        """A standalone draft's static cache, with room for the mask slots past the committed end."""
        STANDALONE.reserve(draft, target, capacity + 2 * max_gamma, max_gamma)

    def vllm_options(self) -> dict:
        from kinds.parallel_drafting import VLLM_OPTIONS

        return dict(VLLM_OPTIONS)

    def save(self, draft, folder: str | Path, gamma: int) -> None:
        """A standard model folder whose config.json names pard_token and pard_gamma (and draft_vocab.json beside the
        whole weights with a draft vocabulary, as a standalone draft's)."""
        STANDALONE.save(draft, folder, gamma)

    # -- deployment -------------------------------------------------------------------------------------------------
    def deploy_check(self, target, draft, trust_remote_code=False):
        from kinds.pard.deploy import check_pard_deploy

        return check_pard_deploy(target, draft, trust_remote_code)

    def serving_commands(self, report) -> str:
        from kinds.pard.deploy import pard_commands

        return pard_commands(report)

    @property
    def card(self):
        from kinds.pard.card import CARD

        return CARD

    # -- recipes ----------------------------------------------------------------------------------------------------
    def check_model(self, model) -> None:
        STANDALONE.check_model(model)

    def check_recipe(self, recipe) -> None:
        """The standalone draft's rules; no teacher cache (the slots read the target at other positions than the
        cache keeps); the measured gammas within the trained ones (gamma <= model.pard_gamma)."""
        from distill.recipe.schema import require
        from kinds.parallel_drafting import check_trained_gammas

        STANDALONE.check_recipe(recipe)
        require(recipe.distill.teacher_cache is None, "distill.teacher_cache", recipe.distill.teacher_cache,
                "null with model.draft_kind pard (its mask slots read the target's distribution at every position, "
                "which a top-k cache does not keep)", ["model.draft_kind"])
        check_trained_gammas(recipe, KEYS)

    # -- training ---------------------------------------------------------------------------------------------------
    def check_plan(self, cfg, target_config, tokenizer, hidden_state_cache):
        from kinds.pard.build import check_pard_plan

        check_pard_plan(cfg, target_config, tokenizer)

    def check_resume(self, recipe, resume):
        STANDALONE.check_resume(recipe, resume)

    def build(self, cfg, target, dtype, lora):
        from kinds.pard.build import build_pard

        return build_pard(cfg, target, dtype, lora)

    def prepare(self, recipe, draft, target, rows) -> None:
        """With model.draft_vocab_size: the draft vocabulary (every slot reads out the same rows), as a standalone
        draft's."""
        STANDALONE.prepare(recipe, draft, target, rows)

    def trainer(self) -> type:
        from kinds.pard.trainer import PardTrainer

        return PardTrainer


KIND = PardKind()
