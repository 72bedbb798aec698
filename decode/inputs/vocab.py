"""Target and draft must share a tokenizer: same token -> id mapping and special tokens (padded lm_head rows allowed);
and the one count of an lm_head's rows."""
from __future__ import annotations

from collections.abc import Mapping

from torch import nn

LM_HEAD_NAMES = ("lm_head.weight",)
EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")


def lm_head_rows(weights: nn.Module | Mapping[str, dict], tied: bool = False) -> int | None:
    """V, the rows of an lm_head: the width of the logits (it may exceed len(tokenizer): padded rows).

    `weights`: a model in memory (its output embedding), or the {name: {"shape", ...}} of stored weights (a
    safetensors header), where a `tied` model that stores no lm_head counts its input embedding's rows; None when
    the stored weights hold neither."""
    if isinstance(weights, nn.Module):
        return weights.get_output_embeddings().weight.shape[0]
    names = [n for n in weights if n.endswith(LM_HEAD_NAMES)]
    if not names and tied:
        names = [n for n in weights if n.endswith(EMBEDDING_SUFFIXES)]
    return int(weights[names[0]]["shape"][0]) if names else None


class TokenizerMismatchError(ValueError):
    """The draft's tokenizer does not match the target's."""


SPECIAL = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")


def describe(tokenizer) -> str:
    return f"{getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__} ({len(tokenizer)} tokens)"


def check_tokenizers_compatible(target_tokenizer, draft_tokenizer) -> None:
    """Raise TokenizerMismatchError naming both vocabularies if the two tokenizers map tokens to ids differently."""
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab != draft_vocab:
        differing = [tok for tok, i in target_vocab.items() if draft_vocab.get(tok) != i]
        only_draft = [tok for tok in draft_vocab if tok not in target_vocab]
        example = differing[:3] or only_draft[:3]
        raise TokenizerMismatchError(
            f"draft tokenizer {describe(draft_tokenizer)} does not match target tokenizer "
            f"{describe(target_tokenizer)}: "
            f"{len(differing)} target tokens have another id or are missing in the draft, {len(only_draft)} draft "
            f"tokens are unknown to the target (e.g. {example!r}); speculative decoding needs one shared vocabulary"
        )
    for name in SPECIAL:
        a, b = getattr(target_tokenizer, name, None), getattr(draft_tokenizer, name, None)
        if a is not None and b is not None and a != b:
            raise TokenizerMismatchError(
                f"draft tokenizer {describe(draft_tokenizer)} has {name}={b} but target tokenizer "
                f"{describe(target_tokenizer)} has {name}={a}"
            )
