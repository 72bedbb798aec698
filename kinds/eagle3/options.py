"""The recipe keys of an EAGLE-3 head (mixed into the recipe's model and distill sections,
distill/recipe/sections.py; recipes/README.md, "EAGLE-3 heads")."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from kinds.standalone.options import LayerIds, StandaloneModelOptions


class Eagle3ModelOptions(BaseModel):
    aux_layers: LayerIds | None = Field(
        None, description="eagle3: the target's layer ids whose hidden states the head reads (3 distinct, ascending, "
                          "as vLLM requires; id i = the residual stream entering decoder layer i); null = vLLM's "
                          "default (2, L // 2, L - 3), a repeated id moved to the nearest free layer.")
    draft_vocab_size: int | None = StandaloneModelOptions.model_fields["draft_vocab_size"]  # one key, two kinds
    head_intermediate_size: int | None = Field(
        None, gt=0, description="eagle3: the MLP width of the head's decoder layer; null = the target's "
                                "intermediate_size.")
    head_layers: int = Field(
        1, ge=1, description="eagle3: N, the head's decoder layers: the first reads [embedding, hidden] (EAGLE-3's), "
                             "the others are Llama decoder layers on its output (vLLM serves N > 1; SGLang one).")
    head_init: Literal["target", "random"] = Field(
        "target", description="eagle3: target = start the head's lm_head from the target's lm_head rows of the "
                              "draft vocabulary, its final norm from the target's final norm, its first layer's MLP "
                              "(and the norm before it) from the target's decoder layer L - N where the widths match, "
                              "and a deeper head's layer i from the target's layer L - N + i whole; random = all "
                              "fresh (fc and the first layer's attention as head_fc_init and head_attn_init say).")
    head_fc_init: Literal["random", "last_aux"] = Field(
        "random", description="eagle3: how fc (the projection fusing the 3 aux hidden states) starts: random; "
                              "last_aux = the identity on the deepest aux layer's hidden state and 0 on the others, so "
                              "the head's residual stream starts as the target's own at that layer. Unset with "
                              "model.draft_kind eagle3: last_aux (the kind's default).")
    head_attn_init: Literal["random", "target"] = Field(
        "random", description="eagle3: how the first layer's attention starts: random; target = from the target's "
                              "layer L - N, the layer head_init target starts its MLP from: q, k and v read the "
                              "hidden half of [embedding, hidden] with that layer's projections (0 on the embedding "
                              "half), hidden_norm is its input_layernorm, o_proj its own; with head_fc_init last_aux "
                              "the head starts as that whole layer on the deepest aux layer's stream. Unset with "
                              "model.draft_kind eagle3: target (the kind's default; a target whose layer does not "
                              "fit: random, with a warning).")
    head_frozen: list[Literal["lm_head", "norm", "mlp"]] = Field(
        [], description="eagle3: parts of the head kept at the target's weights in training (needs head_init target): "
                        "lm_head (the target's rows of the draft vocabulary), norm (the final norm), mlp (the first "
                        "decoder layer's MLP and the norm before it); [] = every weight trains.")


class Eagle3DistillOptions(BaseModel):
    ttt_steps: int = Field(
        1, ge=1, description="eagle3: K, steps the head is unrolled on its own outputs in training (training-time "
                             "test; EAGLE-3 uses 7); step j is scored against the target at its position. >= 1; 1 = "
                             "no unrolling. Unset with model.draft_kind eagle3: 4 (the kind's default).")
    ttt_decay: float = Field(
        1.0, gt=0, le=1, description="eagle3: step j's loss is weighted by ttt_decay ** j, in (0, 1]. Unset with "
                                     "model.draft_kind eagle3: 0.8.")
    feature_noise: float = Field(
        0.0, ge=0, description="eagle3: in training, Gaussian noise of this standard deviation, relative to each "
                               "position's RMS, added to the fused target features the head reads (EAGLE's feature "
                               "augmentation: a head that drafts from slightly wrong features); 0 = none.")
    feature_weight: float = Field(
        0.0, ge=0, description="eagle3: w, adds w times the smooth-L1 distance (beta 1, mean over the hidden size) "
                               "between the head's normed output and the target's final normed hidden state at the "
                               "same position to every scored step's per-token loss (EAGLE-1's feature regression; "
                               "p_eagle: its row's step); 0 = none.")
    soft_target_top_k: int | None = Field(
        None, gt=0, description="eagle3: the head learns the target's distribution cut to its k most likely tokens of "
                                "the draft vocabulary and renormalised (top-k soft targets, as HASS's objective "
                                "weights the target's top-k): every other token's target probability is 0 (so not with "
                                "reverse KL, infinite there); null = the whole distribution.")
