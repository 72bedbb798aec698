"""A standalone draft: a small causal LM of its own (a folder or hub id, a copy of some target layers, or a config),
drafting gamma tokens with gamma sequential forwards; vLLM's draft_model, SGLang's STANDALONE, transformers'
assistant_model. Trained by DistillTrainer on the target's logits (distill/run/trainer.py).

    drafter.py   ModelDrafter (our decoder; with a draft vocabulary, SubsetHeadLM reads out those lm_head rows
                 only: kinds/draft_vocab.py), the assisted-generation settings
    options.py   its recipe keys: model.draft | draft_layers | draft_config
    deploy.py    its deployment checks and serving commands
    card.py      its model card's lines and usage
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from kinds.base import Kind
from kinds.standalone.options import SOURCE_KEYS, StandaloneModelOptions


class StandaloneKind(Kind):
    name, aliases, title = "standalone", ("model",), "standalone drafts"
    summary = "a small LM of its own (model.draft / draft_layers / draft_config)"
    vllm_method, has_weights, trains, language_model = "draft_model", True, True, True
    model_options = StandaloneModelOptions

    # -- decoding ---------------------------------------------------------------------------------------------------
    def recognises(self, draft: str) -> bool:
        return True  # any folder or hub id that no other kind claims

    def holds(self, draft: object) -> bool:
        import torch

        from kinds.standalone.drafter import ModelDrafter

        return isinstance(draft, (torch.nn.Module, ModelDrafter))

    def load(self, draft, target, device, dtype, trust_remote_code=False, earliest=False):
        """The model; a folder's draft_vocab.json (kinds/draft_vocab.py) becomes its ``draft_vocab_ids``."""
        from decode.inputs.loading import load_causal_lm
        from decode.inputs.vocab import lm_head_rows
        from kinds.draft_vocab import read_draft_vocab

        model = load_causal_lm(draft, device, dtype, trust_remote_code)
        if Path(draft).is_dir():
            model.draft_vocab_ids = read_draft_vocab(draft, lm_head_rows(model))
        return model

    def drafter(self, draft, target, compile=False, capacity=0, max_gamma=8):
        """Our decoder's drafter; a model's ``draft_vocab_ids`` (a draft vocabulary, None or absent: every row)."""
        from kinds.standalone.drafter import ModelDrafter

        if isinstance(draft, ModelDrafter):
            return draft
        return ModelDrafter(draft, compile=compile, capacity=capacity, vocab=getattr(draft, "draft_vocab_ids", None),
                            max_gamma=max_gamma)

    def reserve(self, draft, target, capacity, max_gamma):
        """The static cache of what the drafter runs: the model, or its SubsetHeadLM when it has a draft vocabulary."""
        from decode.loop.static import session
        from kinds.standalone.drafter import subset_lm

        ids = getattr(draft, "draft_vocab_ids", None)
        session(draft if ids is None else subset_lm(draft, ids), "draft").reserve(capacity)

    def assisted_generate(self, target, draft, prompt, gamma, **generate_kwargs):
        # transformers 5 reads the draft length from the assistant's generation_config (generate() kwargs are
        # ignored); the caller's settings are put back afterwards
        from kinds.standalone.drafter import ASSISTED_SETTINGS, set_assisted_generation

        gc = draft.generation_config
        saved = {name: getattr(gc, name) for name in ASSISTED_SETTINGS}
        set_assisted_generation(draft, gamma)
        try:
            return target.generate(prompt, assistant_model=draft, **generate_kwargs)
        finally:
            for name, value in saved.items():
                setattr(gc, name, value)

    def save(self, draft, folder: str | Path, gamma: int) -> None:
        """A standard model folder (safetensors, config, generation config drafting `gamma` tokens)."""
        from kinds.standalone.drafter import set_assisted_generation

        set_assisted_generation(draft, gamma)
        draft.save_pretrained(folder, safe_serialization=True)
        ids = getattr(draft, "draft_vocab_ids", None)
        if ids is not None:  # beside the weights, which stay whole: transformers and vLLM read out every row
            from decode.inputs.vocab import lm_head_rows
            from kinds.draft_vocab import write_draft_vocab

            write_draft_vocab(folder, ids, lm_head_rows(draft))

    # -- deployment -------------------------------------------------------------------------------------------------
    def deploy_check(self, target, draft, trust_remote_code=False):
        from kinds.standalone.deploy import check_model_deploy

        return check_model_deploy(target, draft, trust_remote_code)

    def serving_commands(self, report) -> str:
        from kinds.standalone.deploy import model_commands

        return model_commands(report, self.vllm_method)

    @property
    def card(self):
        from kinds.standalone.card import CARD

        return CARD

    # -- recipes ----------------------------------------------------------------------------------------------------
    def check_model(self, model: Any) -> None:
        """Exactly one of model.draft, draft_layers, draft_config; layers strictly increasing."""
        from distill.recipe.schema import require

        chosen = [k for k in SOURCE_KEYS if getattr(model, k) is not None]
        others = "the other" if len(chosen) == 2 else "all but one"
        drop = f" (drop {others} with {' or '.join(f'model.{k}=null' for k in chosen)})" if len(chosen) > 1 else ""
        require(len(chosen) == 1, "model.draft", chosen or None,
                f"exactly one of model.draft, model.draft_layers, model.draft_config{drop}",
                [f"model.{k}" for k in chosen])
        layers = model.draft_layers
        require(layers is None or layers == sorted(set(layers)), "model.draft_layers", layers,
                "a non-empty, strictly increasing list of layer indices >= 0")

    def check_recipe(self, recipe: Any) -> None:
        """No hidden-state cache (it holds what hidden-state drafts read); LoRA adapts pre-trained weights only."""
        from distill.recipe.schema import require, rule_error

        require(recipe.distill.hidden_state_cache is None, "distill.hidden_state_cache",
                recipe.distill.hidden_state_cache, "null with model.draft_kind standalone (it holds the target "
                "features an EAGLE-3 head or a DFlash draft reads; a standalone draft caches its teacher with "
                "distill.teacher_cache)", ["model.draft_kind"])
        if recipe.lora.enabled and recipe.model.draft_config is not None:
            raise rule_error("lora.enabled", "got true with model.draft_config; allowed: false for a draft built from "
                             "scratch (LoRA adapts pre-trained weights, the random base would stay frozen); use "
                             "model.draft or model.draft_layers with LoRA", ["model.draft_config"])

    # -- training ---------------------------------------------------------------------------------------------------
    def check_plan(self, cfg, target_config, tokenizer, hidden_state_cache):
        from kinds.standalone.build import check_standalone_plan

        check_standalone_plan(cfg, target_config, tokenizer)

    def check_resume(self, recipe, resume):
        from kinds.standalone.build import check_resume_shape

        check_resume_shape(recipe, resume)

    def build(self, cfg, target, dtype, lora):
        from kinds.standalone.build import build_standalone

        return build_standalone(cfg, target, dtype, lora)

    def prepare(self, recipe, draft, target, rows) -> None:
        """With model.draft_vocab_size: the draft vocabulary, the rows' most frequent label tokens."""
        if recipe.model.draft_vocab_size is not None:
            from kinds.standalone.build import set_draft_vocabulary

            set_draft_vocabulary(draft, rows.rows, recipe.model.draft_vocab_size)

    def trainer(self) -> type:
        from distill.run.trainer import DistillTrainer

        return DistillTrainer


KIND = StandaloneKind()
