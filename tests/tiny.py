"""Tiny models and tokenizers built inside the tests: nothing is downloaded.

Every model is saved to a directory and loaded back through the real ``from_pretrained`` path.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

ARCHITECTURES = ("llama", "qwen2", "mistral", "gpt2")

TINY_TEXT = (
    "def add(a, b):\n    return a + b\n\n"
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
    "for i in range(10):\n    print(i, i * i)\n\n"
    "import os\nimport sys\nprint(os.path.join('a', 'b'))\n"
) * 8


def tiny_config(arch: str = "llama", vocab_size: int = 96, hidden: int = 32, layers: int = 2, seed_tie: bool = False):
    """A config for a tiny causal LM of the given family."""
    common = dict(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=seed_tie)
    if arch == "llama":
        return LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, **common)
    if arch == "qwen2":
        return Qwen2Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, **common)
    if arch == "mistral":
        return MistralConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                             sliding_window=None, **common)
    if arch == "gpt2":
        return GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=512, vocab_size=vocab_size,
                          bos_token_id=1, eos_token_id=2, pad_token_id=0)
    raise ValueError(f"unknown tiny architecture {arch!r}; choose from {ARCHITECTURES}")


def tiny_model(arch: str = "llama", seed: int = 0, **config_kwargs) -> torch.nn.Module:
    """A randomly initialised tiny causal LM in float32 eval mode; logits scaled up so argmaxes are well separated."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **config_kwargs))
    with torch.no_grad():
        # Random init gives near-uniform logits; sharpen them so distributions look like a trained LM's.
        model.get_output_embeddings().weight.mul_(8.0)
    return model.eval()


def perturbed_copy(model: torch.nn.Module, scale: float, seed: int = 1) -> torch.nn.Module:
    """A copy of ``model`` with Gaussian noise of relative size ``scale`` on every weight (partial acceptance)."""
    g = torch.Generator().manual_seed(seed)
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * (p.std() if p.numel() > 1 else 1.0))
    return other.eval()


def save_and_load(model: torch.nn.Module, path: Path, tokenizer=None) -> torch.nn.Module:
    """Round-trip ``model`` through ``save_pretrained``/``from_pretrained``."""
    model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def tiny_tokenizer(vocab_size: int = 320, text: str = TINY_TEXT) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``text`` with ids 0..3 = <pad>, <s>, </s>, <unk>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([text], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
