"""Step 1 of the quickstart, the tokenizer: a byte-level BPE trained on the corpus's train split.

:func:`train_tokenizer` trains a byte-level BPE on ``train.jsonl`` only (of a corpus written by
:func:`scripts.quickstart_corpus.build_corpus`). Ids 0-5 are special tokens::

    0 <|pad|>   1 <|bos|>   2 <|endoftext|> (eos)   3 <|system|>   4 <|user|>   5 <|assistant|>

Encoding adds no special tokens, so ``decode(encode(x)) == x`` for any text; packing code appends ``eos`` after
each document. The chat template marks assistant turns with ``{% generation %}`` so that
``apply_chat_template(..., return_dict=True, return_assistant_tokens_mask=True)`` gives a loss mask.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from scripts.quickstart_corpus import CorpusPaths, read_jsonl

TOKENIZER_FORMAT = 1

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN = "<|pad|>", "<|bos|>", "<|endoftext|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, *ROLE_TOKENS)  # their ids are their positions here

# One turn = role token, newline, content, eos. Only the assistant's content and eos are inside {% generation %}.
# (Jinja runs with trim_blocks, so the template is one line: a newline after a block tag would be eaten.)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown chat role ' + message['role'] + '; expected system, user or assistant') }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def _train_bpe(texts: Iterator[str], vocab_size: int, min_frequency: int, progress: bool) -> Tokenizer:
    """A byte-level BPE trained on ``texts``, with :data:`SPECIAL_TOKENS` at ids 0, 1, ..."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=progress,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def train_tokenizer(
    corpus_paths: CorpusPaths,
    out_dir: Path,
    *,
    vocab_size: int = 4096,
    min_frequency: int = 2,
    progress: bool = True,
) -> PreTrainedTokenizerFast:
    """Train (or reuse) a byte-level BPE on ``train.jsonl`` and save it with ``save_pretrained`` to ``out_dir``.

    Special tokens and the chat template are described in the module docstring. The tokenizer is reused when
    ``out_dir/corpus_tokenizer.json`` records the same ``vocab_size``, ``min_frequency`` and corpus manifest hash.
    Raises ``ValueError`` if ``vocab_size`` cannot hold the 256 byte symbols plus the special tokens.
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size={vocab_size}: expected at least {256 + len(SPECIAL_TOKENS)} "
                         "(256 byte symbols plus the special tokens)")
    out_dir = Path(out_dir)
    meta_path = out_dir / "corpus_tokenizer.json"
    key = {"format": TOKENIZER_FORMAT, "vocab_size": vocab_size, "min_frequency": min_frequency,
           "corpus_manifest_sha256": corpus_paths.manifest_sha256()}
    if meta_path.exists() and (out_dir / "tokenizer.json").exists():
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("key") == key:
            return PreTrainedTokenizerFast.from_pretrained(out_dir)
    meta_path.unlink(missing_ok=True)

    texts = (row["text"] for row in read_jsonl(corpus_paths.train))  # never the held-out split
    backend = _train_bpe(texts, vocab_size, min_frequency, progress)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD_TOKEN, bos_token=BOS_TOKEN, eos_token=EOS_TOKEN,
        clean_up_tokenization_spaces=False,  # cleaning would rewrite " ." into "." and break exact round trips
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir)

    heldout = [row["text"] for row in read_jsonl(corpus_paths.heldout)]
    heldout_tokens = sum(len(ids) for ids in backend.encode_batch(heldout, add_special_tokens=False)) \
        if heldout else 0
    heldout_chars = sum(len(t) for t in heldout)
    meta = {
        "key": key,
        "vocab_size_actual": backend.get_vocab_size(),
        "special_tokens": {token: backend.token_to_id(token) for token in SPECIAL_TOKENS},
        "heldout_chars": heldout_chars,
        "heldout_tokens": heldout_tokens,
        "heldout_chars_per_token": heldout_chars / heldout_tokens if heldout_tokens else None,
    }
    meta_path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")  # written last, as for the corpus
    return tokenizer
