"""On-policy rows (source 'draft'; GKD, Agarwal et al. 2024): the draft's own continuations of the rows' prompts.

For each micro-batch, before its loss tokens are counted (DistillTrainer.get_batch_samples):
  select    each row independently with probability lambda = distill.on_policy_fraction, from a generator seeded
            by (train.seed, process, optimizer step, micro-batch): every process draws its own rows, and a resumed
            run draws the rows the interrupted one would have drawn
  prompt    the tokens before the row's first trained label (chat: the conversation up to the assistant's turn);
            a row trained from its first token (packed text) gives its first data.prompt_tokens tokens
  sample    the current draft (eval mode, no grad, KV cache) continues all selected prompts at once, left-padded;
            row i draws from its own generator, so its tokens do not depend on the other rows of the batch
  rebuild   prompt + continuation (eos kept, at most data.max_length tokens), labels -100 on the prompt, right-padded
            like DistillCollator; the loss against the target is then taken on these rows as on any other.
No collective is called: every process generates for its own rows, so DDP and DeepSpeed keep working.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from decode.loop.batched import batched_generate
from decode.loop.sampling import SamplingConfig
from distill.data.rows import DistillCollator
from distill.utils import IGNORE_INDEX, eval_mode

BATCH_KEYS = ("input_ids", "attention_mask", "labels")


@dataclass(frozen=True)
class OnPolicySettings:
    """What on-policy replacement needs, from the recipe (distill.on_policy_*, data.*) and the tokenizer."""

    fraction: float  # lambda: probability that a row is replaced
    max_new_tokens: int
    temperature: float  # 0 = greedy
    prompt_tokens: int  # prompt length of rows trained from their first token
    max_length: int  # longest row after replacement
    eos_token_id: int | None
    pad_token_id: int
    vocab_size: int  # sample among the first vocab_size ids (those the target has)
    seed: int

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"on-policy fraction (lambda) must be in [0, 1], got {self.fraction!r}")
        if self.max_new_tokens < 1 or self.prompt_tokens < 1 or self.max_length < 2 or self.vocab_size < 1:
            raise ValueError(f"need max_new_tokens, prompt_tokens, vocab_size >= 1 and max_length >= 2, got {self}")


@dataclass
class OnPolicyRows:
    """Which rows of a micro-batch were replaced, and the seed each replaced row sampled with."""

    selected: list[int]
    seeds: list[int]  # seeds[j] belongs to row selected[j]


# ---------------------------------------------------------------------------------------------------------------
# Which rows, which seeds
# ---------------------------------------------------------------------------------------------------------------

def micro_batch_generator(seed: int, process_index: int, step: int, micro_batch: int) -> torch.Generator:
    """A CPU generator seeded from (seed, process, optimizer step, micro-batch) through numpy's SeedSequence."""
    state = np.random.SeedSequence([seed, process_index, step, micro_batch]).generate_state(1, dtype=np.uint64)
    return torch.Generator().manual_seed(int(state[0]))


def select_rows(batch_size: int, fraction: float, generator: torch.Generator) -> OnPolicyRows:
    """Each row independently with probability `fraction`, and a sampling seed per selected row.

    Both draws always consume the same amount of randomness, so the seeds do not depend on which rows were chosen.
    """
    chosen = torch.rand(batch_size, generator=generator) < fraction  # [B]; rand in [0, 1): lambda = 1 takes all
    seeds = torch.randint(0, 2**62, (batch_size,), generator=generator)  # [B]
    selected = chosen.nonzero(as_tuple=True)[0].tolist()
    return OnPolicyRows(selected=selected, seeds=[int(seeds[i]) for i in selected])


def prompt_length(labels: torch.Tensor, length: int, prompt_tokens: int) -> int:
    """Tokens of a row's prompt: those before its first trained label; rows trained from their first token
    (packed text) give their first prompt_tokens. labels [T] (right-padded); length = the row's real tokens."""
    trained = (labels[:length] != IGNORE_INDEX).nonzero(as_tuple=True)[0]
    first = int(trained[0]) if trained.numel() else length
    return first if first > 0 else min(prompt_tokens, length - 1)


# ---------------------------------------------------------------------------------------------------------------
# Sampling from the draft, batched, with a KV cache
# ---------------------------------------------------------------------------------------------------------------

def sample_continuations(draft: nn.Module, prompts: list[torch.Tensor], *, max_new_tokens: int,
                         sampling: SamplingConfig, seeds: list[int], eos_token_id: int | None, pad_token_id: int,
                         vocab_size: int | None = None) -> list[list[int]]:
    """The draft's continuation of each prompt (decode.loop.batched.batched_generate, the draft in eval mode meanwhile):
    up to max_new_tokens tokens, ending at eos (kept); prompt i samples with seeds[i]. Raises ValueError for an
    empty prompt."""
    with eval_mode(draft):
        return batched_generate(draft, prompts, max_new_tokens=max_new_tokens, sampling=sampling, seeds=seeds,
                                eos_token_id=eos_token_id, pad_token_id=pad_token_id, vocab_size=vocab_size)


# ---------------------------------------------------------------------------------------------------------------
# One micro-batch
# ---------------------------------------------------------------------------------------------------------------

def on_policy_batch(batch: dict[str, torch.Tensor], draft: nn.Module, settings: OnPolicySettings,
                    generator: torch.Generator) -> tuple[dict[str, torch.Tensor], OnPolicyRows]:
    """The micro-batch with the selected rows replaced by prompt + the draft's continuation (module docstring).

    batch: right-padded {input_ids, attention_mask, labels} [B, T] (DistillCollator). Returns the very same batch
    object when no row is selected. Raises ValueError for a batch with other keys (e.g. cached teacher columns).
    """
    if set(batch) != set(BATCH_KEYS):
        raise ValueError(f"on-policy rows need batches of exactly {BATCH_KEYS}, got {sorted(batch)}")
    rows = select_rows(batch["input_ids"].shape[0], settings.fraction, generator)
    if not rows.selected:
        return batch, rows
    lengths = batch["attention_mask"].sum(dim=1).tolist()  # real tokens per row
    prompts, room = [], []
    for i in rows.selected:
        n = prompt_length(batch["labels"][i], lengths[i], settings.prompt_tokens)
        prompts.append(batch["input_ids"][i, :n])
        room.append(min(settings.max_new_tokens, settings.max_length - n))
    sampling = SamplingConfig(temperature=settings.temperature)
    continuations = sample_continuations(draft, prompts, max_new_tokens=max(room), sampling=sampling,
                                         seeds=rows.seeds, eos_token_id=settings.eos_token_id,
                                         pad_token_id=settings.pad_token_id, vocab_size=settings.vocab_size)
    replaced = {i: (p.tolist(), c[:r]) for i, p, c, r in zip(rows.selected, prompts, continuations, room)}
    examples = []
    for i, length in enumerate(lengths):
        if i in replaced:
            prompt, continuation = replaced[i]
            # loss on the continuation only: labels -100 on the prompt
            examples.append({"input_ids": prompt + continuation,
                             "labels": [IGNORE_INDEX] * len(prompt) + continuation})
        else:
            examples.append({"input_ids": batch["input_ids"][i, :length].tolist(),
                             "labels": batch["labels"][i, :length].tolist()})
    device = batch["input_ids"].device
    rebuilt = DistillCollator(settings.pad_token_id)(examples)
    return {key: value.to(device) for key, value in rebuilt.items()}, rows
