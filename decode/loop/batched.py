"""Plain decoding of several prompts at once: left padding, an attention mask, positions that count real tokens only,
a KV cache, and one random generator per prompt.

    rows = batched_generate(model, [[5, 6, 7], [8, 9]], max_new_tokens=64, sampling=SamplingConfig(0.0),
                            seeds=[0, 1], eos_token_id=2, pad_token_id=0)

Row i is decoded as decode.autoregressive_generate decodes it alone: greedy takes the argmax of row i's logits;
sampling draws row i's token with next_token on its own [1, V] logits and its own generator (seeded seeds[i]), so a
row consumes exactly the random numbers it would consume alone and never those of another row. What batching can
change is float rounding: padded shapes give logits that may differ from batch-1 ones in the last bits, which flips
a token only where two candidates are that close (greedy: a near-tie of the argmax; sampled: a draw falling on the
boundary between two tokens). Rows that reach eos leave the batch (their cache rows are dropped).
"""
from __future__ import annotations

import inspect

import torch
from torch import nn

from decode.loop.cache import cache_keyword, returned_cache
from decode.loop.sampling import SamplingConfig, next_token


def accepts_logits_to_keep(model: nn.Module) -> bool:
    """Whether model.forward takes logits_to_keep (named, or through **kwargs as a peft model passes it on)."""
    parameters = inspect.signature(model.forward).parameters
    return "logits_to_keep" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def left_pad(prompts: list[torch.Tensor], pad_token_id: int,
             device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask [B, L] of the prompts (1-D), each right-aligned (left-padded) to the longest."""
    width = max(p.numel() for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long, device=device)  # [B, L]
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)  # [B, L]
    for i, prompt in enumerate(prompts):
        input_ids[i, width - prompt.numel():] = prompt
        attention_mask[i, width - prompt.numel():] = 1
    return input_ids, attention_mask


def draw_rows(logits: torch.Tensor, sampling: SamplingConfig, generators: list[torch.Generator]) -> torch.Tensor:
    """One token per row of logits [B, V] -> [B]; row i draws from generators[i] exactly as decode does for a
    single sequence (next_token on [1, V]), so a row's tokens match decode.autoregressive_generate's."""
    if sampling.greedy:
        return logits.argmax(dim=-1)
    return torch.cat([next_token(logits[i:i + 1], sampling, g) for i, g in enumerate(generators)])


# no_grad, not inference_mode: on-policy rows decode with the draft being trained, whose DeepSpeed / FSDP hooks may
# write parameters in place (which inference_mode forbids)
@torch.no_grad()
def batched_generate(model: nn.Module, prompts: list[torch.Tensor] | list[list[int]], *, max_new_tokens: int,
                     sampling: SamplingConfig, seeds: list[int], eos_token_id: int | None, pad_token_id: int,
                     vocab_size: int | None = None) -> list[list[int]]:
    """The model's continuation of each prompt: up to max_new_tokens tokens, ending at eos (kept).

    prompts: token ids (1-D tensors or lists), left-padded into one batch; prompt i samples with a generator seeded
    with seeds[i]. vocab_size limits decoding to the first vocab_size ids (None: all of the model's). The model
    should be in eval mode. Raises ValueError for an empty prompt or a seed count that differs from the prompts'.
    """
    device = next(model.parameters()).device
    prompts = [torch.as_tensor(p, dtype=torch.long, device=device) for p in prompts]
    if any(p.numel() == 0 for p in prompts):
        raise ValueError("batched decoding needs at least one prompt token per row")
    if len(seeds) != len(prompts):
        raise ValueError(f"got {len(seeds)} seeds for {len(prompts)} prompts; one seed per prompt")
    rows: list[list[int]] = [[] for _ in prompts]
    if not prompts or max_new_tokens < 1:
        return rows
    generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]
    input_ids, attention_mask = left_pad(prompts, pad_token_id, device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)  # [B, L]: pads do not advance positions
    last_only = {"logits_to_keep": 1} if accepts_logits_to_keep(model) else {}  # no [B, L, V] prefill logits
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
                **last_only)
    cache, logits = returned_cache(out), out.logits[:, -1, :vocab_size]  # [B, V]
    keyword = cache_keyword(model)
    active = list(range(len(prompts)))  # the prompt of each batch row still decoding
    for step in range(max_new_tokens):
        token = draw_rows(logits, sampling, [generators[i] for i in active])  # [b]
        for i, t in zip(active, token.tolist()):
            rows[i].append(t)
        running = token != eos_token_id if eos_token_id is not None else torch.ones_like(token, dtype=torch.bool)
        if step == max_new_tokens - 1 or not bool(running.any()):
            break
        if not bool(running.all()):  # rows that reached eos leave the batch
            keep = running.nonzero(as_tuple=True)[0]  # [b']
            cache.batch_select_indices(keep)
            token, attention_mask, position_ids = token[keep], attention_mask[keep], position_ids[keep]
            active = [active[j] for j in keep.tolist()]
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(active), 1)], dim=1)  # [b, L + t]
        position_ids = position_ids[:, -1:] + 1  # [b, 1]
        out = model(input_ids=token[:, None], attention_mask=attention_mask, position_ids=position_ids,
                    **{keyword: cache}, use_cache=True)
        cache, logits = returned_cache(out), out.logits[:, -1, :vocab_size]  # [b, V]
    return rows
