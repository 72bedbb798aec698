"""The arms of scripts/bench_heads_objectives.py (docs/benchmarks/head_objectives.md): each arm's recipe overrides,
the arms that read their own hidden-state cache and those that train on their own rows."""
from __future__ import annotations

TTT4 = ["distill.ttt_steps=4", "distill.ttt_decay=0.8"]  # the training-time test over 4 steps, as the kind's default
AUX_TOP = "model.aux_layers=[2,15,29]"  # the deepest aux layer the input of the last layer (vLLM's default: 27)
# arm -> the overrides that make it (one change from the budget's recipe each; ttt4_*: one change from ttt4)
ARMS = {
    "recipe": [],                                          # the recipe as it is: forward KL
    "lk_hybrid": ["distill.loss=lk_hybrid"],               # acceptance-aimed: log of the acceptance + KL
    "tv": ["distill.loss=tv"],                             # total variation: 1 - acceptance, directly
    "nla": ["distill.loss=nla"],                           # negative log acceptance
    "kl_tv": ["distill.loss={forward_kl: 0.5, tv: 0.5}"],  # both
    "soft_t2": ["distill.temperature=2.0"],                # softer targets (both models' logits at T=2)
    "ttt4": TTT4,                                          # the training-time test over 4 steps
    "vocab16k": ["model.draft_vocab_size=16384"],          # twice the draft vocabulary
    "ttt7": ["distill.ttt_steps=7", "distill.ttt_decay=0.8"],   # EAGLE-3's 7 steps
    "ttt4_flat": ["distill.ttt_steps=4", "distill.ttt_decay=1.0"],  # every step of the test weighted alike
    "ttt4_vocab16k": [*TTT4, "model.draft_vocab_size=16384"],   # twice the draft vocabulary
    "ttt4_vocab4k": [*TTT4, "model.draft_vocab_size=4096"],     # half of it
    "ttt4_answers256": TTT4,                                    # ROWS: the same prompts, answers twice as long
    "ttt4_answers_t1": TTT4,                                    # ROWS: the same prompts, answers sampled at T=1
    # fewer weights to fit 256 rows with, or noisier features to fit them from (first on the recipe, then on ttt4)
    "frozen_lm_head": ["model.head_frozen=[lm_head]"],          # the target's lm_head rows, kept
    "frozen_out": ["model.head_frozen=[lm_head,norm,mlp]"],     # and its final norm and last MLP
    "noise": ["distill.feature_noise=0.2"],                     # the features + 0.2 of their RMS, Gaussian (EAGLE)
    "wd": ["train.weight_decay=0.1"],                           # AdamW's decoupled weight decay
    "lr1e-3": ["train.learning_rate=1e-3"],                     # a third of the recipe's learning rate
    "lr6e-3": ["train.learning_rate=6e-3"],                     # twice it
    "ttt4_frozen_lm_head": [*TTT4, "model.head_frozen=[lm_head]"],
    "ttt4_frozen_out": [*TTT4, "model.head_frozen=[lm_head,norm,mlp]"],
    "ttt4_noise": [*TTT4, "distill.feature_noise=0.2"],
    "ce_half": ["distill.ce_weight=0.5"],                       # half the loss cross-entropy on the target's tokens
    "aux_top": [AUX_TOP],                                       # the top aux layer the stream entering the last layer
    "ttt4_aux_top": [*TTT4, AUX_TOP],
    "topk10": ["distill.soft_target_top_k=10"],                 # top-k soft targets: the target's 10 likeliest (HASS)
    "ttt4_topk10": [*TTT4, "distill.soft_target_top_k=10"],
    "layers2": ["model.head_layers=2"],                         # a second decoder layer (vLLM serves N > 1)
    "ttt4_layers2": [*TTT4, "model.head_layers=2"],
    "all_tokens": ["data.loss_tokens=all"],                     # the rows' prompts trained on too, not only answers
    "answers": ["data.loss_tokens=assistant"],                  # the answers alone (a head's default is all)
    "ttt4_all_tokens": [*TTT4, "data.loss_tokens=all"],
    "ttt4_all_tokens_vocab16k": [*TTT4, "data.loss_tokens=all", "model.draft_vocab_size=16384"],
    "ttt4_all_tokens_kl_tv": [*TTT4, "data.loss_tokens=all", "distill.loss={forward_kl: 0.5, tv: 0.5}"],
    "ttt4_all_tokens_feat": [*TTT4, "data.loss_tokens=all", "distill.feature_weight=1.0"],  # EAGLE-1's regression
    "fc_last": ["model.head_fc_init=last_aux"],                 # fc starts as the identity on the deepest aux layer
    "fc_last_attn": ["model.head_fc_init=last_aux", "model.head_attn_init=target"],  # and attention from the target
    "ttt4_all_tokens_fc_last": [*TTT4, "data.loss_tokens=all", "model.head_fc_init=last_aux"],
    "ttt4_all_tokens_fc_last_aux_top": [*TTT4, "data.loss_tokens=all", "model.head_fc_init=last_aux", AUX_TOP],
    # and the first layer's attention from the target's last layer (hidden half): the head starts as that layer
    "ttt4_all_tokens_fc_last_attn": [*TTT4, "data.loss_tokens=all", "model.head_fc_init=last_aux",
                                     "model.head_attn_init=target"],
}
# arm -> its hidden-state cache beside --data's hidden_cache/ when it reads other aux layers (built on first use)
CACHES = {arm: "hidden_cache_aux_top" for arm, changes in ARMS.items() if AUX_TOP in changes}
# arm -> its own rows, a folder beside chat/ and the `specdistill data responses` options that write it from --data's
# prompts/ (the same prompts); the arm's hidden-state cache is built beside them by its first training
ROWS = {
    "ttt4_answers256": ("chat_answers256", ["--max-new-tokens", "256"]),
    "ttt4_answers_t1": ("chat_answers_t1", ["--max-new-tokens", "128", "--temperature", "1.0"]),
}
