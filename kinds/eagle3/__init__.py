"""An EAGLE-3 head: a decoder layer (or N) on the target's own hidden states (3 of its layers, fused), drafting gamma
tokens with gamma sequential head steps; vLLM's and SGLang's eagle3. Trained with training-time test (the head
unrolled K steps on its own outputs), from the target's logits restricted to a draft vocabulary.

    model.py     Eagle3Head: the maths, the files, vLLM's semantics
    layers.py    its decoder layers (the first on [embedding, hidden], a deeper head's Llama layers)
    drafter.py   HeadDrafter (our decoder, eager and compiled)
    options.py   its recipe keys: model.aux_layers, draft_vocab_size, head_intermediate_size, head_layers,
                 head_init, head_fc_init, head_attn_init, head_frozen; distill.ttt_steps, ttt_decay, feature_noise,
                 feature_weight, soft_target_top_k
    build.py     the plan from configs, the head built from the target, the draft vocabulary, checkpoints
    loss.py      training-time test: UnrolledHead, the per-step losses
    trainer.py   HeadTrainer
    deploy.py    its deployment checks and serving commands
    card.py      its model card's lines and usage
"""
from __future__ import annotations

from pathlib import Path

from kinds.base import Kind
from kinds.eagle3.options import Eagle3DistillOptions, Eagle3ModelOptions


class Eagle3Kind(Kind):
    name, title = "eagle3", "EAGLE-3 heads"
    summary = ("an EAGLE-3 head (one decoder layer, or model.head_layers, on the target's hidden states, served by "
               "vLLM; SGLang serves one-layer heads)")
    vllm_method, has_weights, trains = "eagle3", True, True
    assisted_refusal = ("transformers' assisted generation cannot run an EAGLE-3 head (it runs in specdistill's "
                        "decoder, vLLM and SGLang)")
    model_options, distill_options = Eagle3ModelOptions, Eagle3DistillOptions
    # What works for a head, where a recipe leaves the key unset: training-time test over 4 steps (without the
    # unrolling a head's second draft token is rarely accepted) and the warm-up that beat the others on both small
    # pairs (docs/benchmarks/heads.md, "A longer warmup"). The learning rate is left to the recipe: what works moves
    # with the target's size (6e-3 on the small pairs, 3e-3 on SmolLM2-135M, 1e-4 in the Llama-3.1-8B recipe).
    # Every token of a chat row trained, its prompt too: the best change on the real model at both budgets of
    # docs/benchmarks/head_objectives.md (+0.02 to +0.06 tau with the test, for 1.17-1.3x the training time). fc
    # started on the deepest aux layer: +0.01 to +0.02 on top of both at the quickstart's budget (two seeds), for free;
    # and the first layer's attention as the target's last layer's: +0.014 more at gamma 4 on the same VM, for free.
    defaults = {"distill.ttt_steps": 4, "distill.ttt_decay": 0.8, "train.warmup_steps": 0.2, "data.loss_tokens": "all",
                "model.head_fc_init": "last_aux", "model.head_attn_init": "target"}

    # -- decoding ---------------------------------------------------------------------------------------------------
    def recognises(self, draft: str) -> bool:
        from kinds.eagle3.model import is_eagle3_folder

        return is_eagle3_folder(Path(draft).expanduser())

    def holds(self, draft: object) -> bool:
        from kinds.eagle3.drafter import HeadDrafter
        from kinds.eagle3.model import Eagle3Head

        return isinstance(draft, (Eagle3Head, HeadDrafter))

    def fit_problem(self, draft: str, target: str, trust_remote_code: bool = False) -> str | None:
        """The head reads this target's hidden states and embedding (kinds.eagle3.model.fit_problems, on configs)."""
        from transformers import AutoConfig

        from kinds.eagle3.model import fit_problems, read_config

        target_config = AutoConfig.from_pretrained(target, trust_remote_code=trust_remote_code)
        return next(iter(fit_problems(read_config(draft), target_config).values()), None)

    def load(self, draft, target, device, dtype, trust_remote_code=False, earliest=False):
        """The head on the target's input embedding, in the target's dtype."""
        from kinds.eagle3.model import Eagle3Head

        shared = target.get_input_embeddings()
        head = Eagle3Head.from_pretrained(draft, shared, dtype=target.dtype).to(device)
        if head.bound_embeddings is not shared:  # a speculators folder's own embedding, moved with the head
            head.bind_embeddings(head.bound_embeddings.to(device))
        return head

    def drafter(self, draft, target, compile=False, capacity=0, max_gamma=8):
        from kinds.eagle3.drafter import HeadDrafter, bound_head

        if isinstance(draft, HeadDrafter):
            return draft
        return HeadDrafter(bound_head(draft, target), compile=compile, capacity=capacity, max_gamma=max_gamma)

    def reserve(self, draft, target, capacity, max_gamma):
        """The target's verify pass with the head's aux layers, and the head's own cache."""
        from decode.loop.static import session
        from kinds.eagle3.drafter import bound_head, head_cache

        session(target, "target", tuple(draft.aux_layers)).reserve(capacity)
        head_cache(bound_head(draft, target), capacity, True, max_gamma)

    def save(self, draft, folder: str | Path, gamma: int) -> None:
        """The served folder: Eagle3Head.save_pretrained (config.json for vLLM's and SGLang's eagle3, model.safetensors
        without the shared embedding) and generation_config.json drafting `gamma` tokens (constant, threshold 0: the
        same rule as standalone drafts, kinds.standalone.drafter.set_assisted_generation)."""
        from transformers import GenerationConfig

        draft.save_pretrained(folder)
        config = draft.config
        GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                         pad_token_id=config.pad_token_id, num_assistant_tokens=gamma,
                         num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0,
                         ).save_pretrained(folder)

    def speculators_fields(self, config: dict) -> dict:
        """eagle3 (peagle for a P-EAGLE head): the export serves with `vllm serve FOLDER` alone."""
        from kinds.eagle3.model import speculators_fields

        return speculators_fields(config)

    # -- deployment -------------------------------------------------------------------------------------------------
    def deploy_check(self, target, draft, trust_remote_code=False):
        from kinds.eagle3.deploy import check_head_deploy

        return check_head_deploy(target, draft, trust_remote_code)

    def serving_commands(self, report) -> str:
        from kinds.eagle3.deploy import head_commands

        return head_commands(report)

    @property
    def card(self):
        from kinds.eagle3.card import CARD

        return CARD

    # -- recipes ----------------------------------------------------------------------------------------------------
    def check_model(self, model) -> None:
        from distill.recipe.schema import require

        layers = model.aux_layers  # ids are checked against the target's config in distill.run.preflight
        require(layers is None or (len(layers) == 3 and layers == sorted(set(layers))), "model.aux_layers",
                layers, "null or 3 distinct, ascending layer ids >= 0 (vLLM's EAGLE-3 reads exactly 3, in layer order)")
        require(not model.head_frozen or model.head_init == "target", "model.head_frozen", model.head_frozen,
                "[] with model.head_init random (a frozen part keeps the target's weights: head_init target)")

    def check_recipe(self, recipe) -> None:
        from distill.losses.loss_mix import teacher_divergences
        from distill.recipe.schema import require
        from kinds.hidden_states import check_refusals

        check_refusals(recipe, self.name)
        distill, terms = recipe.distill, teacher_divergences(recipe.distill.loss)
        # KL(q || p) is infinite where p = 0, which a top-k teacher is outside its top k (jsd at beta 1 is that KL)
        reverse = "reverse_kl" in terms or ("jsd" in terms and distill.beta == 1.0)
        top_k = distill.soft_target_top_k
        require(top_k is None or not reverse, "distill.soft_target_top_k", top_k,
                "null with reverse KL in distill.loss (KL(q || p) is infinite where the top-k teacher's p is 0)",
                ["distill.loss", "distill.beta"])

    # -- training ---------------------------------------------------------------------------------------------------
    def check_plan(self, cfg, target_config, tokenizer, hidden_state_cache):
        """Aux layer ids and draft vocabulary against the target's config."""
        from kinds.eagle3.build import plan_head
        from kinds.hidden_states import check_sharded_plan

        check_sharded_plan("EAGLE-3 heads", hidden_state_cache)
        plan_head(cfg, target_config)

    def check_resume(self, recipe, resume):
        from kinds.eagle3.build import check_resume_head_shape

        check_resume_head_shape(recipe, resume)

    def build(self, cfg, target, dtype, lora):
        from kinds.eagle3.build import build_head

        return build_head(cfg, target, dtype)

    def prepare(self, recipe, draft, target, rows) -> None:
        """The head's vocabulary: the rows' most frequent label tokens; then its start from the target, and the parts
        model.head_frozen names kept there."""
        from kinds.eagle3.build import (
            attention_from_target,
            fc_from_last_aux,
            freeze_parts,
            init_from_target,
            served_head,
            set_draft_vocabulary,
        )

        set_draft_vocabulary(draft, rows.rows)
        if recipe.model.head_init == "target":  # lm_head rows, final norm, MLP: read out like the target from step 0
            copied = init_from_target(served_head(draft), target)
            freeze_parts(served_head(draft), recipe.model.head_frozen, copied)
        if recipe.model.head_fc_init == "last_aux":  # the residual stream starts as the target's deepest aux layer's
            fc_from_last_aux(served_head(draft))
        if recipe.model.head_attn_init == "target":  # the first layer's attention as the target's, on the hidden half
            attention_from_target(served_head(draft), target, required="model.head_attn_init" not in
                                  recipe.kind_defaults)

    def trainer(self) -> type:
        from kinds.eagle3.trainer import HeadTrainer

        return HeadTrainer

    def unwrap(self, model):
        from kinds.eagle3.loss import UnrolledHead

        return model.head if isinstance(model, UnrolledHead) else None

    def from_checkpoint(self, folder, final):
        from kinds.eagle3.build import head_at_checkpoint, served_head

        return head_at_checkpoint(folder, final) if served_head(final) is not None else None


KIND = Eagle3Kind()
