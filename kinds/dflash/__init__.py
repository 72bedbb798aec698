"""A DFlash draft: a few decoder layers that fill a whole block of mask tokens in ONE forward, reading the target's
own hidden states as context and using the target's embedding and lm_head (z-lab's DFlash; vLLM's dflash). Its
cost per step does not grow with gamma. Trained on blocks at random anchors of each row, every block position
scored against the target's distribution with position weights exp(-(k-1)/w).

    model.py     DFlashDraft: the maths, the files, vLLM's semantics
    drafter.py   DFlashDrafter (our decoder)
    options.py   its recipe keys: model.dflash_layers, dflash_block_size, dflash_target_layers, dflash_init_layers;
                 distill.dflash_blocks, dflash_position_decay
    build.py     the draft built from the target's config (and layers), a checkpoint read back
    loss.py      block training: anchors, the block attention mask, the weighted per-position loss
    trainer.py   DFlashTrainer
    deploy.py    its deployment checks and serving commands
    card.py      its model card's lines and usage
"""
from __future__ import annotations

from pathlib import Path

from kinds.base import Kind
from kinds.dflash.options import DFlashDistillOptions, DFlashModelOptions


class DFlashKind(Kind):
    name, title = "dflash", "DFlash drafts"
    summary = ("a DFlash block drafter (a few layers on the target's hidden states drafting a whole block in one "
               "forward, served by vLLM)")
    vllm_method, has_weights, trains = "dflash", True, True
    assisted_refusal = ("transformers' assisted generation cannot run a DFlash draft (it runs in specdistill's "
                        "decoder and vLLM)")
    model_options, distill_options = DFlashModelOptions, DFlashDistillOptions

    # -- decoding ---------------------------------------------------------------------------------------------------
    def recognises(self, draft: str) -> bool:
        from kinds.dflash.model import is_dflash_folder

        return is_dflash_folder(Path(draft).expanduser())

    def holds(self, draft: object) -> bool:
        from kinds.dflash.drafter import DFlashDrafter
        from kinds.dflash.model import DFlashDraft

        return isinstance(draft, (DFlashDraft, DFlashDrafter))

    def fit_problem(self, draft: str, target: str, trust_remote_code: bool = False) -> str | None:
        """The draft reads this target's hidden states, embedding and lm_head (kinds.dflash.model.fit_problems)."""
        from transformers import AutoConfig

        from kinds.dflash.model import fit_problems, read_config

        target_config = AutoConfig.from_pretrained(target, trust_remote_code=trust_remote_code)
        return next(iter(fit_problems(read_config(draft), target_config).values()), None)

    def load(self, draft, target, device, dtype, trust_remote_code=False, earliest=False):
        """The draft on the target's embedding and lm_head, in the target's dtype."""
        from kinds.dflash.model import DFlashDraft

        return DFlashDraft.from_pretrained(draft, target).to(device)

    def drafter(self, draft, target, compile=False, capacity=0, max_gamma=8):
        """Eager drafting (``compile`` compiles the target's steps only)."""
        from kinds.dflash.drafter import DFlashDrafter, bound_draft

        if isinstance(draft, DFlashDrafter):
            return draft
        return DFlashDrafter(bound_draft(draft, target), capacity=capacity, max_gamma=max_gamma)

    def reserve(self, draft, target, capacity, max_gamma):
        """The target's verify pass with the draft's hidden-state layers (the draft itself runs eagerly)."""
        from decode.loop.static import session

        session(target, "target", self.drafter(draft, target, max_gamma=max_gamma).aux_layers).reserve(capacity)

    def save(self, draft, folder: str | Path, gamma: int) -> None:
        """The served folder: DFlashDraft.save_pretrained (config.json for vLLM's dflash, model.safetensors without
        the shared embedding and lm_head) with a generation config drafting `gamma` tokens (the same rule as
        standalone drafts, kinds.standalone.drafter.set_assisted_generation)."""
        from kinds.standalone.drafter import set_assisted_generation

        set_assisted_generation(draft, gamma)
        draft.save_pretrained(folder)

    def speculators_fields(self, config: dict) -> dict:
        """dflash: the export also serves with `vllm serve FOLDER` alone."""
        from kinds.dflash.deploy import speculators_fields

        return speculators_fields(config)

    # -- deployment -------------------------------------------------------------------------------------------------
    def deploy_check(self, target, draft, trust_remote_code=False):
        from kinds.dflash.deploy import check_dflash_deploy

        return check_dflash_deploy(target, draft, trust_remote_code)

    def serving_commands(self, report) -> str:
        from kinds.dflash.deploy import dflash_commands

        return dflash_commands(report)

    @property
    def card(self):
        from kinds.dflash.card import CARD

        return CARD

    # -- recipes ----------------------------------------------------------------------------------------------------
    def check_recipe(self, recipe) -> None:
        """The hidden-state kinds' refusals; the measured gammas fit in a block (gamma <= block_size - 1)."""
        from distill.recipe.schema import require
        from kinds.hidden_states import check_refusals

        check_refusals(recipe, self.name)
        largest = recipe.model.dflash_block_size - 1
        gammas = recipe.eval.fixed_gammas
        require(all(g <= largest for g in gammas), "eval.gammas", recipe.eval.gammas,
                f"gammas <= {largest} with model.dflash_block_size {largest + 1} (a block drafts at most block_size - "
                "1 tokens)", ["model.dflash_block_size"])

    # -- training ---------------------------------------------------------------------------------------------------
    def check_plan(self, cfg, target_config, tokenizer, hidden_state_cache):
        """The draft's config from the target's: layer ids, the mask token, the block size."""
        from kinds.dflash.build import plan_dflash
        from kinds.hidden_states import check_sharded_plan

        check_sharded_plan("DFlash drafts", hidden_state_cache)
        plan_dflash(cfg, target_config, tokenizer)

    def build(self, cfg, target, dtype, lora):
        from kinds.dflash.build import build_dflash

        return build_dflash(cfg, target, dtype)

    def trainer(self) -> type:
        from kinds.dflash.trainer import DFlashTrainer

        return DFlashTrainer

    def unwrap(self, model):
        from kinds.dflash.loss import BlockTraining

        return model.draft if isinstance(model, BlockTraining) else None

    def from_checkpoint(self, folder, final):
        from kinds.dflash.build import dflash_at_checkpoint

        return dflash_at_checkpoint(folder, final)


KIND = DFlashKind()
