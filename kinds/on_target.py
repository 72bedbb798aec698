"""What the drafts that live on the target share (an EAGLE-3 head, a DFlash draft: they read its hidden states and
use its embedding): decoder layers shaped like the target's, the checks that a saved config fits a target, and the
holder of the target's modules a draft uses without owning them."""
from __future__ import annotations

from transformers import PretrainedConfig


def target_layer_shape(text: PretrainedConfig, intermediate_size: int | None = None) -> dict:
    """The config keys of a draft layer shaped like the target's (its text config): widths, heads, activation, norm
    epsilon, rope, context and vocabulary, untied (a drafter that reads the target's embedding and hidden states:
    an EAGLE-3 head, a DFlash draft)."""
    return dict(
        hidden_size=text.hidden_size,
        intermediate_size=intermediate_size or text.intermediate_size,
        num_attention_heads=text.num_attention_heads,
        num_key_value_heads=getattr(text, "num_key_value_heads", None) or text.num_attention_heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
        hidden_act=getattr(text, "hidden_act", "silu"),
        rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6),
        max_position_embeddings=text.max_position_embeddings,
        rope_parameters=dict(getattr(text, "rope_parameters", None) or {"rope_type": "default",
                                                                           "rope_theta": 10000.0}),
        vocab_size=text.vocab_size,
        tie_word_embeddings=False,
        bos_token_id=text.bos_token_id, eos_token_id=text.eos_token_id, pad_token_id=text.pad_token_id,
    )


def size_problems(config: dict, text: PretrainedConfig, draft: str, why: str) -> dict[str, str]:
    """hidden_size and vocab: a drafter on the target's embedding and hidden states (``draft``: "the head's", ...)
    must have the target's hidden size and vocabulary; ``why`` ends each line."""
    problems = {}
    sizes = {"hidden_size": config.get("hidden_size"), "target_hidden_size": config.get("target_hidden_size")}
    wrong = {name: size for name, size in sizes.items() if size is not None and size != text.hidden_size}
    if wrong:
        problems["hidden_size"] = (f"{draft} {', '.join(f'{k}={v}' for k, v in wrong.items())} but the target's "
                                   f"hidden_size is {text.hidden_size}: {why}")
    if config.get("vocab_size") != text.vocab_size:
        problems["vocab"] = (f"{draft} vocab_size={config.get('vocab_size')} but the target's is {text.vocab_size}: "
                             f"{why}")
    return problems


class SharedEmbedding(list):
    """Holds the target's input embedding for a head without registering it as a submodule; a deep copy of the head
    (a checkpoint's copy, a sharded head's whole copy) reads the same embedding instead of copying the target's."""

    def __deepcopy__(self, memo: dict) -> SharedEmbedding:
        return self
