"""The EAGLE-3 draft head: decoder layers (one by default) that read the target's own hidden states (Li et al. 2025).

Semantics are those of vLLM's `llama_eagle3.py`, the file a served head runs in:

    fused   = fc(cat(h_target[l_1], h_target[l_2], h_target[l_3]))          # [T, H]   first draft step only
    x       = cat(input_layernorm(embed(token)), hidden_norm(hidden))       # [T, 2H]  hidden = fused or fed back
    r       = hidden + o_proj(attention(x))                                 #          residual = un-normed hidden
                                                                            #  (normed: norm_before_residual)
    s_0     = r + mlp(post_attention_layernorm(r))                          # [T, H]   layer 0 (`midlayer`)
    s_i     = r_i + mlp_i(post_attention_layernorm_i(r_i)),                 #          layers 1..N-1 (`layers.i`,
              r_i = s_{i-1} + o_proj_i(attention_i(input_layernorm_i(s_{i-1})))   a Llama decoder layer on H)
    prenorm = s_{N-1}                                                       # [T, H]   fed back at the next step
    logits  = lm_head(norm(prenorm))                                        # [T, V_draft]
    target id of draft id i = i + d2t[i]                                    # logits scattered into the target's V

Position p of the head holds (token x_{p+1}, hidden state of position p) and predicts x_{p+2}; the target's hidden
state of layer id i is the residual stream entering decoder layer i (`hidden_states[i]` of a transformers forward).
The token embedding is the target's own (frozen, shared, not saved): vLLM shares it when the folder has none.

N = config.num_hidden_layers (model.head_layers; vLLM serves N > 1 as above, each layer its own KV cache). The
attention of each layer is handed in (`run(..., attention)`): decoding (a KV cache per layer, kinds/eagle3/drafter.py),
the training-time test (an unrolled mask, kinds/eagle3/loss.py) and P-EAGLE's blocks use the same weights the same
way, and differ only in which keys a query sees.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig, PretrainedConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from decode.deploy.speculators import folder_speculators_type, speculators_type
from decode.inputs.checks import architectures, folder_architectures, read_text
from kinds.eagle3.layers import Attention, DecoderLayer, MidLayer
from kinds.on_target import SharedEmbedding, size_problems, target_layer_shape

ARCHITECTURE = "LlamaForCausalLMEagle3"  # what vLLM and SGLang dispatch on
WEIGHTS_FILE = "model.safetensors"


def default_aux_layers(num_layers: int) -> list[int]:
    """vLLM's default layer ids for EAGLE-3 aux hidden states, (2, L // 2, L - 3), made distinct: vLLM keeps one
    hidden state per distinct id, so a shallow target's repeated id (L = 6 gives (2, 3, 3)) would leave fc with
    too few inputs there; a repeated id moves to the nearest free layer (the deeper one on a tie). Ascending."""
    chosen: list[int] = []
    for wanted in (min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0)):
        free = [i for i in range(num_layers) if i not in chosen]
        if free:
            chosen.append(min(free, key=lambda i: (abs(i - wanted), -i)))
    return sorted(chosen)


def is_eagle3_config(config: dict | PretrainedConfig) -> bool:
    """Whether a config (a config.json dict or a loaded config) describes an EAGLE-3 head."""
    return ARCHITECTURE in architectures(config)


def is_eagle3_folder(path: str | Path) -> bool:
    """Whether `path` is a local folder holding an EAGLE-3 head: its config.json's architectures, or the speculators
    format's eagle3 / peagle (a P-EAGLE head is an EAGLE-3 head with a mask token)."""
    return ARCHITECTURE in folder_architectures(path) or folder_speculators_type(path) in SPECULATORS_TYPES


def read_config(folder: str | Path) -> dict:
    """A head folder's config.json as a dict in this layout (vLLM's eagle3 `LlamaForCausalLMEagle3`): a folder that
    speculators wrote is read through `from_speculators`."""
    config = json.loads(read_text(Path(folder) / "config.json"))
    if ARCHITECTURE not in architectures(config) and speculators_type(config) in SPECULATORS_TYPES:
        return from_speculators(config, folder)
    return config


# -- the speculators format (decode.deploy.speculators) ---------------------------------------------------------------
SPECULATORS_TYPES = ("eagle3", "peagle")  # the EAGLE-3 heads vLLM reads in the speculators format
SPECULATORS_LAYER = "layers.0."  # speculators' (and vLLM's) name of the head's first decoder layer, midlayer. here
SPECULATORS_UNSUPPORTED = ("norm_before_fc", "fc_norm", "norm_output")  # variants this head does not implement
LAYER_KEYS = ("attention_bias", "attention_dropout", "head_dim", "hidden_act", "hidden_size", "intermediate_size",
              "max_position_embeddings", "mlp_bias", "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
              "rope_parameters", "vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")


def speculators_fields(config: dict) -> dict:
    """The speculators keys of a head (its config.json in this layout): eagle3, or peagle for a P-EAGLE head, with
    the decoder layer as `transformer_layer_config` and the residual taken before hidden_norm (this head's and
    EAGLE-3's; vLLM reads a missing `norm_before_residual` as true)."""
    mask = parallel_token(config)
    layer = {key: config[key] for key in LAYER_KEYS if key in config}
    layer.update(model_type="llama", num_hidden_layers=config.get("num_hidden_layers") or 1, tie_word_embeddings=False)
    fields = {"speculators_model_type": "eagle3" if mask is None else "peagle", "transformer_layer_config": layer,
              "draft_vocab_size": config.get("draft_vocab_size") or config["vocab_size"],
              "target_hidden_size": config.get("target_hidden_size") or config["hidden_size"],
              "eagle_aux_hidden_state_layer_ids": aux_layer_ids(config),
              "norm_before_residual": bool(config.get("norm_before_residual", False)),
              **dict.fromkeys(SPECULATORS_UNSUPPORTED, False)}
    if mask is not None:
        fields["mask_token_id"] = mask
    return fields


def from_speculators(config: dict, folder: str | Path = "") -> dict:
    """A speculators eagle3 / peagle config.json (written by speculators' Eagle3SpeculatorConfig) as this layout's
    dict, read as vLLM reads it (vllm.transformers_utils.configs.speculators.algos): the decoder layer's keys from
    transformer_layer_config; norm_before_residual true when missing; peagle's mask_token_id as the P-EAGLE mask
    token. Raises ValueError naming a variant this head does not implement."""
    used = [key for key in SPECULATORS_UNSUPPORTED if config.get(key)]
    if used:
        raise ValueError(f"{folder}: the speculators head sets {', '.join(used)}, which specdistill's EAGLE-3 head "
                         "does not implement (vLLM serves it; measure it with --engine vllm)")
    layer = dict(config.get("transformer_layer_config") or {})
    ours = {key: layer[key] for key in LAYER_KEYS if key in layer}
    ours.update(architectures=[ARCHITECTURE], model_type="llama", num_hidden_layers=layer.get("num_hidden_layers") or 1,
                tie_word_embeddings=False,
                draft_vocab_size=config.get("draft_vocab_size") or layer.get("vocab_size"),
                target_hidden_size=config.get("target_hidden_size") or layer.get("hidden_size"),
                norm_before_residual=bool(config.get("norm_before_residual", True)),
                eagle_config={"eagle_aux_hidden_state_layer_ids": list(config.get("eagle_aux_hidden_state_layer_ids")
                                                                       or []), "use_aux_hidden_state": True},
                speculators_model_type=speculators_type(config))
    if speculators_type(config) == "peagle":
        ours["ptd_token_id"] = config.get("mask_token_id")
    return ours


def parallel_token(config: dict | PretrainedConfig) -> int | None:
    """The mask token of a head that drafts in parallel (P-EAGLE: `ptd_token_id`, as vLLM reads it), else None."""
    token = config.get("ptd_token_id") if isinstance(config, dict) else getattr(config, "ptd_token_id", None)
    return None if token is None else int(token)


def aux_layer_ids(config: dict) -> list[int]:
    """The aux layer ids of a head's config dict ([] when it names none)."""
    return list((config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or [])


def fit_problems(config: dict, target_config: PretrainedConfig) -> dict[str, str]:
    """What keeps a head (its config.json as a dict) from reading this target, {check: one line}:
    hidden_size (the head's hidden_size and target_hidden_size must be the target's: it shares the target's
    embedding and reads its hidden states), vocab (vocab_size = the target's), aux_layers (ids among the target's
    layers)."""
    text = target_config.get_text_config()
    problems = size_problems(config, text, "the head's", "this head was trained for another target")
    layers = aux_layer_ids(config)
    if not layers or min(layers) < 0 or max(layers) >= text.num_hidden_layers:
        problems["aux_layers"] = (f"the head reads the target's layers {layers} but the target has "
                                  f"{text.num_hidden_layers} (ids 0..{text.num_hidden_layers - 1})")
    return problems


def head_config(target_config: PretrainedConfig, *, aux_layers: list[int] | None = None,
                draft_vocab_size: int | None = None, intermediate_size: int | None = None,
                num_layers: int = 1) -> LlamaConfig:
    """The head's config, built from the target's: same hidden size (the embedding is shared), heads, rope and
    context; `num_layers` decoder layers (one by default); `draft_vocab_size` output rows (default the whole
    vocabulary). Raises ValueError for an aux layer the target does not have."""
    if num_layers < 1:
        raise ValueError(f"a head has at least one decoder layer, got {num_layers}")
    text = target_config.get_text_config()
    layers = list(aux_layers) if aux_layers is not None else default_aux_layers(text.num_hidden_layers)
    if not layers or min(layers) < 0 or max(layers) >= text.num_hidden_layers:
        raise ValueError(f"aux layer ids {layers} must lie in 0..{text.num_hidden_layers - 1} (the target has "
                         f"{text.num_hidden_layers} decoder layers)")
    if layers != sorted(set(layers)):  # vLLM concatenates one hidden state per distinct id, in layer order
        raise ValueError(f"aux layer ids {layers} must be distinct and ascending (vLLM concatenates the hidden "
                         f"states in layer order, one per id): e.g. {sorted(set(layers))}")
    return LlamaConfig(
        architectures=[ARCHITECTURE],
        **target_layer_shape(text, intermediate_size),
        num_hidden_layers=num_layers,
        draft_vocab_size=draft_vocab_size or text.vocab_size,
        target_hidden_size=text.hidden_size,
        eagle_config={"eagle_aux_hidden_state_layer_ids": layers, "use_aux_hidden_state": True},
    )


class Eagle3Head(nn.Module):
    """An EAGLE-3 head. `embed_tokens` is the target's input embedding (set by `bind_embeddings`; not a parameter
    of the head, never saved). Buffers: d2t [V_draft] (target id = draft id + d2t), t2d [V] (is the target id in
    the draft vocabulary). A P-EAGLE head (config.ptd_token_id set, kinds/p_eagle) has one more parameter,
    mask_hidden [1, k * H_target]: the aux hidden states its mask slots read, saved under that name (vLLM's)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        aux = config.eagle_config["eagle_aux_hidden_state_layer_ids"]
        self.aux_layers = list(aux)
        self.fc = nn.Linear(len(aux) * config.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = MidLayer(config)
        # layers 1..N-1, named as vLLM names them (layers.1.*, ...); none for a one-layer head
        self.layers = nn.ModuleDict({str(i): DecoderLayer(config) for i in range(1, self.num_layers)})
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.rotary = LlamaRotaryEmbedding(config=config)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool))
        if parallel_token(config) is not None:  # a P-EAGLE head: the learned aux hidden states of its mask slots
            self.mask_hidden = nn.Parameter(torch.zeros(1, len(aux) * config.target_hidden_size))
        self._embed = SharedEmbedding()  # not a submodule: the target's, never saved, not copied

    @property
    def num_layers(self) -> int:
        """N, the head's decoder layers (config.num_hidden_layers)."""
        return int(getattr(self.config, "num_hidden_layers", 1) or 1)

    def layer(self, index: int) -> MidLayer | DecoderLayer:
        """Decoder layer `index`: 0 is `midlayer`, i >= 1 `layers.i`."""
        return self.midlayer if index == 0 else self.layers[str(index)]

    @property
    def norm_before_residual(self) -> bool:
        """The residual is hidden_norm(hidden) rather than hidden (config.norm_before_residual: a speculators head's
        option, false for this project's heads and EAGLE-3's)."""
        return bool(getattr(self.config, "norm_before_residual", False))

    # -- wiring ---------------------------------------------------------------------------------------------------
    def bind_embeddings(self, embed_tokens: nn.Module) -> Eagle3Head:
        """Use the target's input embedding (shared and frozen). Returns self."""
        self._embed = SharedEmbedding([embed_tokens])
        return self

    @property
    def has_embeddings(self) -> bool:
        return bool(self._embed)

    @property
    def bound_embeddings(self) -> nn.Module | None:
        """The target's input embedding set by `bind_embeddings` (None before)."""
        return self._embed[0] if self._embed else None

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if not self._embed:
            raise RuntimeError("the head has no token embedding: call bind_embeddings(target.get_input_embeddings())")
        return self._embed[0](input_ids)

    def set_vocab(self, draft_to_target: torch.Tensor) -> None:
        """Set the draft vocabulary: `draft_to_target` [V_draft] holds the target id of every draft id, ascending."""
        ids = draft_to_target.to(device=self.d2t.device, dtype=torch.long)
        if ids.shape != self.d2t.shape:
            raise ValueError(f"need {self.d2t.numel()} target ids, got {ids.numel()}")
        # d2t[i] = t_i - i;  t2d[t] = t is one of the t_i
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    @property
    def target_ids(self) -> torch.Tensor:
        """The target id of every draft id, [V_draft]."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    # -- the steps ------------------------------------------------------------------------------------------------
    def fuse(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        """fc over the concatenated aux hidden states: [B, T, k * H_target] -> [B, T, H]."""
        return self.fc(aux_hidden)

    def mask_input(self) -> torch.Tensor:
        """What a P-EAGLE mask slot reads as its hidden state, fc(mask_hidden): [H] (vLLM's
        combine_hidden_states(mask_hidden))."""
        return self.fc(self.mask_hidden.view(-1))

    def project(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer 0's q [B, nh, T, d], k and v [B, nkv, T, d] (rope applied at `position_ids` [B, T]) and its residual
        [B, T, H], for tokens `input_ids` [B, T] read with `hidden` [B, T, H]."""
        layer = self.midlayer
        normed = layer.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden  # EAGLE-3 and this head: the un-normed hidden
        x = torch.cat([layer.input_layernorm(self.embed(input_ids)), normed], dim=-1)  # [B, T, 2H]
        return (*self.qkv(layer, x, position_ids), residual)

    def qkv(self, layer: MidLayer | DecoderLayer, x: torch.Tensor, position_ids: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`layer`'s q [B, nh, T, d], k and v [B, nkv, T, d] of its input x [B, T, 2H or H], rope at position_ids."""
        attn = layer.self_attn
        b, t, _ = x.shape
        q = attn.q_proj(x).view(b, t, attn.num_heads, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, t, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
        cos, sin = self.rotary(v, position_ids)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
               layer: int = 0) -> torch.Tensor:
        """softmax(q k^T / sqrt(d) + mask) v, then layer `layer`'s o_proj: q [B, nh, Tq, d], k, v [B, nkv, Tk, d], mask
        bool [B or 1, 1, Tq, Tk] (True = may attend) -> [B, Tq, H]."""
        attn = self.layer(layer).self_attn
        groups = attn.num_heads // attn.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, nh, Tq, d]
        return attn.o_proj(out.transpose(1, 2).flatten(2))

    def run(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
            attention: Attention) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer over tokens `input_ids` [B, T] read with `hidden` [B, T, H] at `position_ids` [B, T], each
        layer's attention done by `attention(i, q, k, v)`; then the final norm: (normed [B, T, H] for the lm_head,
        prenorm [B, T, H] fed back as the next step's hidden)."""
        q, k, v, residual = self.project(input_ids, hidden, position_ids)
        stream = self.midlayer.feed_forward(attention(0, q, k, v), residual)
        for index in range(1, self.num_layers):  # s_i = r_i + mlp_i(...), r_i = s_{i-1} + attention_i(...)
            layer = self.layer(index)
            q, k, v = self.qkv(layer, layer.input_layernorm(stream), position_ids)
            stream = layer.feed_forward(attention(index, q, k, v), stream)
        return self.norm(stream), stream

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [..., V_draft]."""
        return self.lm_head(normed)

    def to_target_vocab(self, draft_values: torch.Tensor, fill: float = float("-inf")) -> torch.Tensor:
        """Scatter [..., V_draft] values into the target's vocabulary [..., V]; ids outside the draft vocabulary
        get `fill` (-inf for logits, 0 for probabilities)."""
        out = draft_values.new_full((*draft_values.shape[:-1], self.config.vocab_size), fill)
        out[..., self.target_ids] = draft_values
        return out

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass over a whole sequence, causal (or `mask`): (draft logits [B, T, V_draft], prenorm [B, T, H])."""
        if mask is None:
            t = input_ids.shape[1]
            mask = torch.ones(t, t, dtype=torch.bool, device=input_ids.device).tril().view(1, 1, t, t)
        normed, prenorm = self.run(input_ids, hidden, position_ids,
                                   lambda layer, q, k, v: self.attend(q, k, v, mask, layer))
        return self.logits(normed), prenorm

    # -- files ----------------------------------------------------------------------------------------------------
    @property
    def full_vocab(self) -> bool:
        """Whether the draft vocabulary is the target's whole vocabulary (d2t all zero)."""
        return self.config.draft_vocab_size == self.config.vocab_size

    def state_for_export(self) -> dict[str, torch.Tensor]:
        """The tensors of the served folder, under the names vLLM and SGLang load (no rotary, no embedding). A
        head over the whole vocabulary has no d2t/t2d: vLLM 0.32 then has no parameter to load them into, and
        refuses the folder ("no module or parameter named 'draft_id_to_target_id'")."""
        vocab_maps = ("d2t", "t2d") if self.full_vocab else ()
        return {name: tensor.detach().contiguous() for name, tensor in self.state_dict().items()
                if not name.startswith("rotary.") and name not in vocab_maps}

    def save_pretrained(self, folder: str | Path, dtype: torch.dtype | None = None) -> None:
        """config.json (vLLM's eagle3 format) and model.safetensors into `folder`."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = self.state_for_export()
        if dtype is not None:
            state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        stored = next(v.dtype for v in state.values() if v.is_floating_point())
        config = self.config.to_dict()
        config["architectures"] = [ARCHITECTURE]
        config["dtype"] = str(stored).removeprefix("torch.")
        (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(cls, folder: str | Path, embed_tokens: nn.Module | None = None,
                        dtype: torch.dtype = torch.float32) -> Eagle3Head:
        """Load a head saved by `save_pretrained` (or any folder in vLLM's eagle3 layout whose weights are named
        midlayer.*, fc.weight, norm.weight, lm_head.weight, d2t, t2d, or one that speculators wrote: layers.0.*, and
        its own embed_tokens, which then replaces `embed_tokens` as it does in vLLM). Raises ValueError for a folder
        that is not an EAGLE-3 head or misses weights (a deeper head's later layers are layers.1.*, ...)."""
        folder = Path(folder)
        config_dict = read_config(folder)
        if not is_eagle3_config(config_dict):
            raise ValueError(f"{folder}: config.json's architectures is not [{ARCHITECTURE!r}]")
        config_dict.pop("architectures", None)
        config = LlamaConfig(architectures=[ARCHITECTURE], **config_dict)
        config.draft_vocab_size = config_dict.get("draft_vocab_size") or config.vocab_size
        head = cls(config)
        state = {"midlayer." + name.removeprefix(SPECULATORS_LAYER) if name.startswith(SPECULATORS_LAYER) else name:
                 tensor  # speculators names the first layer layers.0
                 for name, tensor in load_file(str(folder / WEIGHTS_FILE)).items()}
        own_embedding = state.pop("embed_tokens.weight", None)  # vLLM reads a folder's own embedding over the target's
        expected = set(head.state_for_export()) | {"d2t", "t2d"}
        missing = sorted(expected - set(state) - {"t2d"} - ({"d2t"} if head.full_vocab else set()))
        if missing:
            raise ValueError(f"{folder}: the head's weights lack {', '.join(missing)}")
        state.setdefault("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))  # whole vocabulary
        if "t2d" not in state:  # vLLM ignores t2d; rebuild it from d2t
            state["t2d"] = torch.zeros(config.vocab_size, dtype=torch.bool)
            state["t2d"][torch.arange(config.draft_vocab_size) + state["d2t"]] = True
        head.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)
        head = head.to(dtype)
        if own_embedding is not None:
            embed_tokens = nn.Embedding.from_pretrained(own_embedding.to(dtype), freeze=True)
        if embed_tokens is not None:
            head.bind_embeddings(embed_tokens)
        return head.eval()


def target_aux_hidden(hidden_states: tuple[torch.Tensor, ...], layers: list[int]) -> torch.Tensor:
    """The target's aux hidden states, concatenated: `hidden_states` of a transformers forward with
    output_hidden_states=True (index i = the residual stream entering decoder layer i) -> [B, T, k * H_target]."""
    return torch.cat([hidden_states[i] for i in layers], dim=-1)
