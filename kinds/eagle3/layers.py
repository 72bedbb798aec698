"""The decoder layers of an EAGLE-3 head (kinds/eagle3/model.py has the maths that runs them): the first, which reads
[embedding, hidden] at 2H (`midlayer.*`), and the later ones of a deeper head, Llama decoder layers on H (`layers.i.*`),
named as vLLM's `llama_eagle3.py` loads them."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm


class HeadAttention(nn.Module):
    """Attention whose q, k, v read `input_size` features (layer 0: the 2H-wide [embedding, hidden]; later layers:
    H); o_proj back to H."""

    def __init__(self, config: LlamaConfig, input_size: int) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.q_proj = nn.Linear(input_size, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(input_size, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(input_size, self.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)


class HeadMLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class HeadLayer(nn.Module):
    """What every head layer does after attention: r = residual + attn_out; r + mlp(post_attention_layernorm(r))."""

    mlp: HeadMLP
    post_attention_layernorm: LlamaRMSNorm

    def feed_forward(self, attn_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        r = residual + attn_out
        return r + self.mlp(self.post_attention_layernorm(r))


class MidLayer(HeadLayer):
    """The head's first decoder layer, which reads [embedding, hidden]; parameter names are the checkpoint's
    `midlayer.*` (vLLM's `layers.0.*`)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = HeadAttention(config, 2 * config.hidden_size)
        self.mlp = HeadMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class DecoderLayer(HeadLayer):
    """A later decoder layer (1..N-1) of a deeper head: a Llama decoder layer on the previous layer's output;
    parameter names are vLLM's `layers.i.*`."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = HeadAttention(config, config.hidden_size)
        self.mlp = HeadMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)


# attention(layer index, q [B, nh, T, d], k and v [B, nkv, T, d]) -> o_proj'd output [B, T, H]: what a caller
# does with each layer's keys (a KV cache, an unrolled mask) and which of them each query sees
Attention = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
