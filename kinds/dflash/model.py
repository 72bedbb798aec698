"""The DFlash draft: a few decoder layers that draft a whole block of tokens in ONE pass, reading the target's own
hidden states as context (z-lab's "DFlash: Block Diffusion for Flash Speculative Decoding", arXiv 2602.06036).

Semantics are those of vLLM's `qwen3_dflash.py` (the model) and `v1/spec_kinds/dflash/model.py` (the proposer), the
files a served DFlash draft runs in. With the committed tokens x_0..x_M, the target's hidden states h_0..h_{M-1}
(x_M = the newest token, not yet seen by the target) and gamma <= block_size - 1:

    c      = hidden_norm(fc(cat(h[t_1 + 1], .., h[t_k + 1])))          # [M, H]   context, positions 0..M-1
    z      = embed([x_M, mask, .., mask])                              # [gamma + 1, H]   positions M..M+gamma
    per layer:  x = input_layernorm(z)
                K = [rope(k_norm(k_proj(c))) ; rope(k_norm(k_proj(x)))]   # [M + gamma + 1, d] per kv head
                V = [v_proj(c) ; v_proj(x)]
                z = z + o_proj(softmax(rope(q_norm(q_proj(x))) K^T / sqrt(d)) V)   # no mask: non-causal
                z = z + mlp(post_attention_layernorm(z))
    logits = lm_head(norm(z))[1:]                                      # [gamma, V]   slot j drafts x_{M+j} itself

The context enters every layer only as keys and values, computed per layer with that layer's own k/v projections
and k_norm from the SAME normed context c (no input_layernorm, no earlier layer on it): vLLM precomputes them
(`precompute_and_store_context_kv`) and writes them into each layer's KV cache; the block's queries attend to
them and to the whole block, non-causally. Position p's rope position is p, for context and block alike.

Layer ids: `dflash_config.target_layer_ids` holds t = the 0-based index of the target decoder layer whose OUTPUT is
read (DFlash's and SpecForge's convention, the one the config file holds). That output is transformers'
`hidden_states[t + 1]` (index 0 is the embedding) and vLLM's aux hidden-state id t + 1 (vLLM adds 1 when it reads
the config): `context_layers` gives those t + 1, the ids the target's verify pass is asked for. t = L - 1 (the last
layer) is refused: transformers returns that one after the final norm, vLLM before it.

The token embedding and the lm_head are the target's own (frozen, shared, never saved): vLLM shares both when the
folder holds neither. Parameter names are those vLLM's loader maps (it prefixes `model.` to all of them).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import GenerationConfig, PretrainedConfig, Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half

from decode.inputs.checks import architectures, folder_architectures, read_text
from kinds.on_target import SharedEmbedding, size_problems, target_layer_shape

ARCHITECTURE = "DFlashDraftModel"  # vLLM's registry: -> qwen3_dflash.DFlashQwen3ForCausalLM (method "dflash")
WEIGHTS_FILE = "model.safetensors"
MASK_EMBEDDING_FILE = "mask_embedding.pt"  # vLLM's optional override of the mask token's embedding
DEFAULT_BLOCK_SIZE = 16  # SpecForge's and z-lab's (the "-b16" drafts)
# dflash_config keys vLLM reads for attention variants this decoder does not implement (all off by default)
UNSUPPORTED_OPTIONS = ("use_swa", "attention_sink_bias", "attention_value_scale")


# ---------------------------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------------------------
def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """DFlash's default spread (the reference implementation, SpecForge and SGLang): one draft layer reads the
    middle layer L // 2; n > 1 read n layers spread evenly over 1..L - 3. Ids must be distinct and at most L - 2
    (module docstring), so a shallow target's repeated or too deep id moves to the nearest free one. Ascending."""
    last = max(num_target_layers - 2, 0)  # the deepest layer whose output both transformers and vLLM read pre-norm
    if num_draft_layers == 1:
        wanted = [num_target_layers // 2]
    else:
        span = num_target_layers - 4
        wanted = [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]
    chosen: list[int] = []
    for layer in wanted:
        free = [i for i in range(last + 1) if i not in chosen]
        if free:
            chosen.append(min(free, key=lambda i: (abs(i - layer), -i)))
    return sorted(chosen)


def mask_token_id_for(tokenizer, vocab_size: int) -> int:
    """The mask token as SpecForge chooses it (vLLM reads it from dflash_config.mask_token_id and embeds it with the
    target's own embedding row): the tokenizer's mask token; else the first row past the tokenizer's tokens, which
    is the id SpecForge's added "<|MASK|>" token gets (z-lab's Qwen3 drafts: 151669). ValueError when the target's
    embedding has no such spare row (len(tokenizer) == vocab_size): name an id the text never holds instead."""
    if tokenizer.mask_token_id is not None and tokenizer.mask_token_id < vocab_size:
        return int(tokenizer.mask_token_id)
    if len(tokenizer) < vocab_size:
        return len(tokenizer)
    raise ValueError(f"the embedding has no spare row for a mask token (the tokenizer has "
                     f"{len(tokenizer)} tokens, vocab_size is {vocab_size}) and no mask token: pass mask_token_id, "
                     "an id the text never holds (e.g. a reserved special token)")


def zero_mask_row(weight: torch.Tensor, token: int) -> str | None:
    """Why `token` cannot be a mask token of a draft embedded with `weight` [V, H], or None. Its row must carry a
    signal: a row of zeros (a padding token's: transformers zeroes the embedding's padding_idx row and nn.Embedding
    never updates it) gives every mask slot the same zero input, so the slots of a block differ only through
    attention, and a one-layer draft's zero query attends uniformly (every slot then drafts alike: the cost is
    measured in docs/benchmarks/heads.md). A row sharded away (ZeRO-3: numel 0) is not checked."""
    if weight.dim() != 2 or weight.shape[0] <= token or weight[token].count_nonzero() > 0:
        return None
    return (f"token {token}'s embedding row is all zeros (a padding token's row never trains): every mask slot would "
            "read the same zero vector; name another id the text never holds (e.g. an unused special token)")


def dflash_config_for(target_config: PretrainedConfig, *, mask_token_id: int, num_layers: int = 1,
                      block_size: int = DEFAULT_BLOCK_SIZE, target_layer_ids: list[int] | None = None,
                      intermediate_size: int | None = None) -> Qwen3Config:
    """The draft's config, built from the target's: a Qwen3-style config (vLLM builds it as model_type qwen3) with
    the target's hidden size (the embedding and lm_head are shared), heads, rope and context; ``num_layers`` draft
    layers; ``block_size`` (gamma <= block_size - 1); dflash_config {mask_token_id, target_layer_ids (default:
    default_target_layer_ids)}. ``mask_token_id``: see mask_token_id_for. Raises ValueError for layer ids or a mask
    token the target does not have (the first of fit_problems)."""
    text = target_config.get_text_config()
    layers = list(target_layer_ids) if target_layer_ids is not None else default_target_layer_ids(
        text.num_hidden_layers, num_layers)
    config = Qwen3Config(
        architectures=[ARCHITECTURE],
        **target_layer_shape(text, intermediate_size),
        num_hidden_layers=num_layers,
        block_size=block_size,
        num_target_layers=text.num_hidden_layers,
        target_hidden_size=text.hidden_size,
        dflash_config={"mask_token_id": int(mask_token_id), "target_layer_ids": layers},
    )
    problems = fit_problems(config.to_dict(), target_config)
    if problems:
        raise ValueError(next(iter(problems.values())))
    return config


def is_dflash_config(config: dict | PretrainedConfig) -> bool:
    """Whether a config (a config.json dict or a loaded config) describes a DFlash draft."""
    return ARCHITECTURE in architectures(config)


def is_dflash_folder(path: str | Path) -> bool:
    """Whether `path` is a local folder holding a DFlash draft (by its config.json's architectures)."""
    return ARCHITECTURE in folder_architectures(path)


def read_config(folder: str | Path) -> dict:
    """A DFlash folder's config.json as a dict."""
    return json.loads(read_text(Path(folder) / "config.json"))


def fit_problems(config: dict, target_config: PretrainedConfig) -> dict[str, str]:
    """What keeps a DFlash draft (its config.json as a dict) from running next to this target, {check: one line}:
    hidden_size (hidden_size and target_hidden_size must be the target's: it shares the target's embedding and
    lm_head and reads its hidden states), vocab (vocab_size = the target's, no smaller draft vocabulary),
    target_layers (distinct, ascending ids
    in 0..L - 2), mask_token (an id of the target's embedding), block_size (>= 2), attention (variants this decoder
    does not implement: causal or sliding-window layers, sink bias, value scale)."""
    text = target_config.get_text_config()
    options = config.get("dflash_config") or {}
    problems = size_problems(config, text, "the DFlash draft's", "it was built for another target")
    if "vocab" not in problems and config.get("draft_vocab_size") not in (None, text.vocab_size):
        problems["vocab"] = (f"the DFlash draft has a draft vocabulary (draft_vocab_size="
                             f"{config['draft_vocab_size']}), which specdistill's decoder does not implement")
    layers, deepest = list(options.get("target_layer_ids") or []), text.num_hidden_layers - 2
    if not layers or layers != sorted(set(layers)) or min(layers) < 0 or max(layers) > deepest:
        problems["target_layers"] = (
            f"dflash_config.target_layer_ids {layers} must be distinct ascending ids in 0..{deepest} (the target has "
            f"{text.num_hidden_layers} layers; layer {text.num_hidden_layers - 1}'s output is read after the final "
            "norm by transformers and before it by vLLM)")
    mask = options.get("mask_token_id")
    if not isinstance(mask, int) or not 0 <= mask < text.vocab_size:
        problems["mask_token"] = (f"dflash_config.mask_token_id={mask!r} must be an id in 0..{text.vocab_size - 1} "
                                  "(the target's embedding embeds it)")
    if not isinstance(config.get("block_size"), int) or config["block_size"] < 2:
        problems["block_size"] = f"block_size={config.get('block_size')!r} must be an integer >= 2"
    variants = [f"dflash_config.{key}" for key in UNSUPPORTED_OPTIONS if options.get(key)]
    variants += ["causal layers"] if options.get("causal") or config.get("is_causal") else []
    variants += ["sliding-window layers"] if "sliding_attention" in (config.get("layer_types") or []) else []
    if variants:
        problems["attention"] = (f"the DFlash draft uses {', '.join(variants)}, which specdistill's decoder does not "
                                 "implement (only full, non-causal block attention)")
    return problems


# ---------------------------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------------------------
def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """rope: x [B, heads, T, d] rotated by cos, sin [B, T, d] (rotate-half, vLLM's neox style)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


class DFlashAttention(nn.Module):
    """q, k, v, o projections with per-head q_norm and k_norm (Qwen3's); the context enters as keys and values only."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        h, d, bias = config.hidden_size, config.head_dim, config.attention_bias
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=bias)
        self.q_norm = Qwen3RMSNorm(d, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(d, eps=config.rms_norm_eps)

    def heads(self, x: torch.Tensor, count: int) -> torch.Tensor:
        """[B, T, count * d] -> [B, count, T, d]."""
        return x.view(*x.shape[:2], count, self.head_dim).transpose(1, 2)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k = rope(k_norm(k_proj(x))), v = v_proj(x): x [B, T, H] -> [B, nkv, T, d] each."""
        k = rotate(self.k_norm(self.heads(self.k_proj(x), self.num_kv_heads)), cos, sin)
        return k, self.heads(self.v_proj(x), self.num_kv_heads)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, context_k: torch.Tensor,
                context_v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The block x [B, S, H] attending to the context's keys and values [B, nkv, C, d] then its own, all of
        them (or `mask` bool [B or 1, 1, S, C + S], True = may attend) -> [B, S, H]."""
        q = rotate(self.q_norm(self.heads(self.q_proj(x), self.num_heads)), cos, sin)  # [B, nh, S, d]
        k, v = self.keys_values(x, cos, sin)
        k, v = torch.cat([context_k, k], dim=2), torch.cat([context_v, v], dim=2)  # [B, nkv, C + S, d]
        groups = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # softmax(q k^T / sqrt(d) [+ mask]) v
        return self.o_proj(out.transpose(1, 2).flatten(2))


class DFlashLayer(nn.Module):
    """One pre-norm decoder layer: z += attention(input_layernorm(z)); z += mlp(post_attention_layernorm(z))."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, z: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, context_k: torch.Tensor,
                context_v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        z = z + self.self_attn(self.input_layernorm(z), cos, sin, context_k, context_v, mask)
        return z + self.mlp(self.post_attention_layernorm(z))


class DFlashDraft(nn.Module):
    """A DFlash draft (module docstring). The target's input embedding and lm_head are set by `bind_target` (not
    parameters of the draft, never saved). ``context_layers``: the target hidden-state ids it reads (t + 1)."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.config = config
        options = config.dflash_config
        self.target_layer_ids = list(options["target_layer_ids"])
        self.mask_token_id = int(options["mask_token_id"])
        self.block_size = int(config.block_size)
        target_hidden = getattr(config, "target_hidden_size", None) or config.hidden_size
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_hidden_layers))
        self.fc = nn.Linear(len(self.target_layer_ids) * target_hidden, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary = Qwen3RotaryEmbedding(config)  # buffers only, not saved
        self.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                                  pad_token_id=config.pad_token_id)
        self._target = SharedEmbedding()  # [embedding, lm_head] of the target: not submodules, never saved or copied

    # -- wiring ---------------------------------------------------------------------------------------------------
    @property
    def context_layers(self) -> tuple[int, ...]:
        """The target's hidden-state ids the draft reads: target_layer_ids + 1 (transformers' `hidden_states`
        index, vLLM's aux layer id)."""
        return tuple(t + 1 for t in self.target_layer_ids)

    @property
    def aux_layers(self) -> list[int]:
        """context_layers as the hidden-state cache and the target's verify pass name them."""
        return list(self.context_layers)

    def bind_target(self, target: nn.Module) -> DFlashDraft:
        """Use the target's input embedding and lm_head (shared and frozen). Returns self."""
        self._target = SharedEmbedding([target.get_input_embeddings(), target.get_output_embeddings()])
        return self

    @property
    def is_bound(self) -> bool:
        return bool(self._target)

    def shared(self) -> tuple[nn.Module, nn.Module]:
        if not self._target:
            raise RuntimeError("the DFlash draft has no embedding and lm_head: call bind_target(target)")
        return self._target[0], self._target[1]

    # -- the steps ------------------------------------------------------------------------------------------------
    def positions(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """rope's cos, sin [B, T, d] at position_ids [B, T] (in x's dtype)."""
        return self.rotary(x, position_ids)

    def context(self, aux: torch.Tensor) -> torch.Tensor:
        """c = hidden_norm(fc(aux)): the target's hidden states [..., T, k * H_target] -> [..., T, H]."""
        return self.hidden_norm(self.fc(aux))

    def context_kv(self, aux: torch.Tensor, position_ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's context keys and values [B, nkv, T, d] of the target's hidden states aux [B, T, k * H_target]
        at position_ids [B, T]: the same c for every layer, through that layer's k_proj, k_norm, rope and v_proj."""
        c = self.context(aux)
        cos, sin = self.positions(c, position_ids)
        return [layer.self_attn.keys_values(c, cos, sin) for layer in self.layers]

    def block_hidden(self, tokens: torch.Tensor, position_ids: torch.Tensor,
                     context: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor | None = None
                     ) -> torch.Tensor:
        """The block tokens [B, S] at position_ids [B, S], attending to each layer's `context` keys and values and
        to the whole block (or `mask`, see DFlashAttention) -> the final normed hidden states [B, S, H], which the
        target's lm_head reads out."""
        embed, _ = self.shared()
        z = embed(tokens).to(self.fc.weight.dtype)  # [B, S, H]
        cos, sin = self.positions(z, position_ids)
        for layer, (k, v) in zip(self.layers, context):
            z = layer(z, cos, sin, k, v, mask)
        return self.norm(z)

    def block_logits(self, tokens: torch.Tensor, position_ids: torch.Tensor,
                     context: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor | None = None
                     ) -> torch.Tensor:
        """block_hidden read out by the target's lm_head -> logits [B, S, V]."""
        return self.shared()[1](self.block_hidden(tokens, position_ids, context, mask))

    def forward(self, aux: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """One block, no cache: the context of positions 0..C-1 (the target's hidden states aux [B, C, k * H]) and
        the block tokens [B, S] at positions C..C+S-1 -> logits [B, S, V]."""
        b, c, s = tokens.shape[0], aux.shape[1], tokens.shape[1]
        positions = torch.arange(c + s, device=tokens.device).expand(b, -1)
        return self.block_logits(tokens, positions[:, c:], self.context_kv(aux, positions[:, :c]))

    # -- files ----------------------------------------------------------------------------------------------------
    def state_for_export(self) -> dict[str, torch.Tensor]:
        """The tensors of the served folder, under the names vLLM's loader maps (no rotary, no embedding, no
        lm_head: vLLM shares the target's)."""
        return {name: tensor.detach().contiguous() for name, tensor in self.state_dict().items()
                if not name.startswith("rotary.")}

    def save_pretrained(self, folder: str | Path, dtype: torch.dtype | None = None) -> None:
        """config.json (architectures [DFlashDraftModel], model_type qwen3, dflash_config), model.safetensors and
        generation_config.json into `folder`."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = self.state_for_export()
        if dtype is not None:
            state = {k: v.to(dtype) for k, v in state.items()}
        config = self.config.to_dict()
        config["architectures"] = [ARCHITECTURE]
        config["dtype"] = str(next(iter(state.values())).dtype).removeprefix("torch.")
        (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
        self.generation_config.save_pretrained(folder)

    @classmethod
    def from_pretrained(cls, folder: str | Path, target: nn.Module | None = None,
                        dtype: torch.dtype = torch.float32) -> DFlashDraft:
        """Load a draft saved by `save_pretrained` (or any folder in vLLM's dflash layout with the weights named as
        here), bound to `target` when given (then checked against it first, and in its dtype). Raises ValueError
        for a folder that is not a DFlash draft, does not fit the target, ships a mask_embedding.pt, or misses
        weights or holds others."""
        folder = Path(folder)
        config_dict = read_config(folder)
        if not is_dflash_config(config_dict):
            raise ValueError(f"{folder}: config.json's architectures is not [{ARCHITECTURE!r}]")
        if target is not None:
            problem = next(iter(fit_problems(config_dict, target.config).values()), None)
            if problem:
                raise ValueError(f"{folder}: {problem}")
            dtype = target.dtype
        if (folder / MASK_EMBEDDING_FILE).is_file():
            raise ValueError(f"{folder}: {MASK_EMBEDDING_FILE} (a separately trained mask embedding, which vLLM "
                             "reads) is not read by specdistill's decoder, which embeds the mask with the target's row")
        draft = cls(Qwen3Config.from_dict(config_dict))
        state = load_file(str(folder / WEIGHTS_FILE))
        expected = set(draft.state_for_export())
        missing, other = sorted(expected - set(state)), sorted(set(state) - expected)
        if missing or other:
            raise ValueError(f"{folder}: the DFlash weights " + "; ".join(
                part for part in (f"lack {', '.join(missing)}" if missing else "",
                                  f"hold {', '.join(other)}, which this decoder does not use (the embedding and "
                                  "lm_head are the target's)" if other else "") if part))
        draft.load_state_dict(state)
        if (folder / "generation_config.json").is_file():
            draft.generation_config = GenerationConfig.from_pretrained(folder)
        draft = draft.to(dtype)
        if target is not None:
            draft.bind_target(target)
        return draft.eval()
