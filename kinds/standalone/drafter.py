"""A standalone draft's drafter for our decoder: a small causal LM with its own KV cache, gamma sequential
forwards per step; and the settings that make transformers' assisted generation draft exactly gamma tokens."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.modeling_outputs import CausalLMOutputWithPast

from decode.loop.cache import CachedLM, cache_keyword
from decode.loop.sampling import draw, probs_from_logits
from decode.loop.static import StaticLM, cached_lm

# transformers' assisted generation reads these from the draft's generation_config (decode.measure.evaluate, the export)
ASSISTED_SETTINGS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


class SubsetHeadLM(torch.nn.Module):
    """A causal LM whose logits are only those of ``ids`` (a draft vocabulary, kinds/draft_vocab.py): the decoder
    stack runs as it is, and its last hidden states are multiplied by the lm_head's rows ``ids`` alone:

        logits[:, j] = h W[ids[j]]^T (+ b[ids[j]])        [T, |ids|] instead of [T, V]

    Called like the model (input ids, a KV cache, use_cache, logits_to_keep, output_hidden_states), so CachedLM and
    StaticLM run it unchanged. ``refresh()`` copies the rows in again (a draft in training changes between checks);
    the copy lives in one buffer, so a compiled step keeps reading it in place."""

    def __init__(self, model: torch.nn.Module, ids: torch.Tensor) -> None:
        super().__init__()
        self.lm = model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.decoder, self.head = base.get_decoder(), base.get_output_embeddings()
        self.config = base.config
        self.cache_keyword = cache_keyword(base)
        weight = self.head.weight
        self.register_buffer("ids", ids.to(device=weight.device, dtype=torch.long), persistent=False)
        self.register_buffer("weight", torch.empty(ids.numel(), weight.shape[1], dtype=weight.dtype,
                                                   device=weight.device), persistent=False)
        bias = getattr(self.head, "bias", None)
        self.register_buffer("bias", None if bias is None else torch.empty(ids.numel(), dtype=bias.dtype,
                                                                           device=bias.device), persistent=False)
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        self.weight.copy_(self.head.weight.index_select(0, self.ids))
        if self.bias is not None:
            self.bias.copy_(self.head.bias.index_select(0, self.ids))

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.lm.get_input_embeddings()

    def get_output_embeddings(self) -> torch.nn.Module:
        return self  # its .weight is the rows read out: lm_head_rows() counts |ids|

    def forward(self, input_ids: torch.Tensor, past_key_values: object = None, use_cache: bool = True,
                logits_to_keep: int = 0, output_hidden_states: bool = False,
                attention_mask: torch.Tensor | None = None) -> CausalLMOutputWithPast:
        # the KV cache comes as past_key_values (decode.loop.cache.cache_keyword of this forward) and is handed on
        # under the decoder's own keyword; a 4-D causal mask (decode.loop.cache.CachedLM.causal_mask) as it came
        out = self.decoder(input_ids=input_ids, use_cache=use_cache, output_hidden_states=output_hidden_states,
                           attention_mask=attention_mask, **{self.cache_keyword: past_key_values})
        hidden = out.last_hidden_state
        hidden = hidden[:, -logits_to_keep:] if logits_to_keep else hidden
        return CausalLMOutputWithPast(logits=F.linear(hidden, self.weight, self.bias),
                                      hidden_states=out.hidden_states)


def subset_lm(model: torch.nn.Module, ids: torch.Tensor) -> SubsetHeadLM:
    """``model``'s SubsetHeadLM over ``ids``, made once and kept on the model (outside its modules: nothing is added
    to its state_dict), so the compiled steps of its static cache are reused from prompt to prompt; its rows are
    copied in again on every call."""
    made = model.__dict__.get("_specdistill_subset_lm")
    weight = made.head.weight if made is not None else None
    if (made is None or made.weight.device != weight.device or made.weight.dtype != weight.dtype
            or not torch.equal(made.ids.cpu(), ids.cpu())):
        made = SubsetHeadLM(model, ids)
        model.__dict__["_specdistill_subset_lm"] = made
    else:
        made.refresh()
    return made


def readout_lm(model: torch.nn.Module, vocab: torch.Tensor | None, target_vocab_size: int) -> torch.nn.Module:
    """What a drafter runs: ``model``, or with a draft vocabulary its subset_lm (whose ``ids`` map draft ids back to
    target ids). Raises ValueError for an id past the target's logits."""
    if vocab is None:
        return model
    if int(vocab.max()) >= target_vocab_size:
        raise ValueError(f"the draft vocabulary holds id {int(vocab.max())}, outside the target's "
                         f"{target_vocab_size} logits")
    return subset_lm(model, vocab)


def greedy_pick(shared_vocab: int, ids: torch.Tensor | None):
    """The greedy draft token of a row of logits [1, V_draft] -> [1], as a target id (``ids`` maps a draft
    vocabulary's ids back to the target's; None: the same ids). A plain function of tensors, so a compiled chain of
    draft steps (decode.loop.static.Session.chain) runs it inside its graph."""
    def pick(logits: torch.Tensor) -> torch.Tensor:
        token = logits[:, :shared_vocab].argmax(dim=-1)
        return token if ids is None else ids[token]
    return pick


class ModelDrafter:
    """A small causal LM as the draft, with its own KV cache (static when ``compile``, ``capacity`` positions then
    preallocated, with compiled steps of 1 and 2 tokens and, greedy, the round's gamma steps as one compiled call:
    decode.loop.static.Session.chain). ``vocab``: a draft vocabulary [k] (ascending target
    ids, kinds/draft_vocab.py): only those lm_head rows are read out and only those tokens proposed; None: all."""

    aux_layers: tuple[int, ...] = ()

    def __init__(self, model: torch.nn.Module, compile: bool = False, capacity: int = 0,
                 vocab: torch.Tensor | None = None, max_gamma: int = 0) -> None:
        self.model = model
        self.compile, self.capacity, self.max_gamma = compile, capacity, max_gamma
        self.vocab = vocab
        self.lm: CachedLM | StaticLM | None = None
        self.pending: list[torch.Tensor] = []  # committed tokens not yet in the cache, each [1, 1]
        self.proposed: torch.Tensor | None = None
        self.shared_vocab = 0
        self.pad_to = 0

    def start(self, prefix: torch.Tensor, target_vocab_size: int) -> None:
        capacity = max(self.capacity, prefix.shape[1] + 1)
        lm = readout_lm(self.model, self.vocab, target_vocab_size)
        if self.vocab is not None:
            self.ids = lm.ids
        # compiled steps of 1 token (a draft step) and 2 (the catch-up after a round that kept every draft: d_k, cur)
        self.lm = cached_lm(lm, self.compile, "draft", capacity, (1, 2))
        # A padded lm_head (Qwen-style 151936 vs 152064) is harmless: both sides work on the shared ids.
        self.shared_vocab = min(self.lm.vocab_size, target_vocab_size)
        ids = self.ids if self.vocab is not None else None
        self.pick = greedy_pick(self.shared_vocab, ids)
        self.pick_name = f"greedy/{self.shared_vocab}/{'all' if ids is None else id(ids)}"
        if isinstance(self.lm, StaticLM) and self.max_gamma > 1:  # greedy rounds of max_gamma drafts: one call each
            self.lm.precompile_chain((1, 2), self.max_gamma, self.pick, self.pick_name)
        self.pad_to = target_vocab_size
        self.embed_size = self.model.get_input_embeddings().weight.shape[0]
        self.pending = []
        if prefix.shape[1] > 0:
            self.lm.forward(prefix.clamp_max(self.embed_size - 1), last_only=True)

    def propose(self, history, cur, gamma, cfg, generator):
        assert self.lm is not None, "start() first"
        if gamma == 0:  # nothing to draft: cur joins the tokens still to be fed
            self.pending.append(cur)
            self.proposed = cur.new_empty(0)
            return self.proposed, None
        # ids beyond the draft's embedding (a target's padded lm_head rows, never real tokens) are clamped: only
        # the draft's proposals can suffer from it, and the target verifies every proposal.
        feed = torch.cat([*self.pending, cur], dim=1).clamp_max(self.embed_size - 1)  # [1, 1 or 2]
        self.pending = []
        if cfg.greedy and isinstance(self.lm, StaticLM) and gamma == self.max_gamma > 1:  # one compiled call (start)
            chained = self.lm.chain(feed, gamma, self.pick, self.pick_name)
            if chained is not None:
                self.proposed = chained
                return chained, None
        tokens, rows = [], []
        for _ in range(gamma):
            logits = self.lm.forward(feed, last_only=True)[-1:, : self.shared_vocab]  # [1, V_shared] or [1, |vocab|]
            if cfg.greedy:
                token = logits.argmax(dim=-1)
            else:
                q = probs_from_logits(logits, cfg)
                token = draw(q, cfg, generator)
                rows.append(q)
            if self.vocab is not None:
                token = self.ids[token]  # draft id -> target id
            tokens.append(token)
            feed = token.view(1, 1)
        self.proposed = torch.cat(tokens) if tokens else cur.new_empty(0)
        if cfg.greedy or not rows:
            return self.proposed, None
        q = torch.cat(rows)  # [k, V_shared] or [k, |vocab|]
        if self.vocab is not None:  # q is 0 outside the vocabulary: those tokens are never proposed
            return self.proposed, q.new_zeros(q.shape[0], self.pad_to).index_copy_(1, self.ids, q)
        return self.proposed, F.pad(q, (0, self.pad_to - self.shared_vocab))

    def commit(self, num_accepted: int) -> None:
        assert self.lm is not None and self.proposed is not None
        drafted = self.proposed.numel()
        if drafted == 0:
            return
        # The cache holds cur, d_1..d_{k-1}; keep cur, d_1..d_n.
        if num_accepted < drafted:
            self.lm.rollback(drafted - 1 - num_accepted)
        else:  # every draft token accepted: d_k was never fed to the draft
            self.pending = [self.proposed[-1:].view(1, 1)]




def set_assisted_generation(draft: torch.nn.Module, gamma: int) -> None:
    """Make transformers' assisted generation draft exactly `gamma` tokens per step, as measured.

    A constant schedule with confidence threshold 0 reproduces the measured setting; the defaults (20 tokens,
    'constant', threshold 0.4) would stop drafting early on low-confidence tokens and draft far more than measured.
    """
    draft.generation_config.num_assistant_tokens = gamma
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
