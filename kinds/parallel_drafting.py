"""Parallel drafting: a draft that drafts all gamma tokens of a round in ONE forward, fed the newest token x_M and
gamma - 1 copies of a mask token m (its mask slots), each slot's output row a next-token distribution of its own:

    one round   [x_M, m, ..., m] at positions M..M+gamma-1, causal -> q_1..q_gamma;  d_j ~ q_j independently

(d_1 from x_M's row, d_{k+1} from mask slot k's; greedy: each row's argmax). q_j is what d_j was drawn from, all the
acceptance rule needs, so the output stays the target's. Two kinds draft so, under their own names (ParallelKeys):
a PARD draft (kinds/pard: a small causal LM; `pard_token`, `pard_gamma`) and a P-EAGLE head (kinds/p_eagle: an EAGLE-3
head whose slots also read a learned hidden state; `ptd_token_id`, `ptd_gamma`). What they share lives here:

    recipe      gamma_field, token_field (model.<gamma>, model.<token>); check_trained_gammas (eval gammas <= gamma)
    build       mask_token_for (model.<token> or a default, checked against the embedding), check_mask_row
    decoding    VLLM_OPTIONS; feed_lengths (the compiled query lengths); draw_slots (each slot from its own row)
    training    block_positions, block_allowed (the row and its blocks of mask slots as one query under one mask);
                slot_weights, slot_counts, weighted_slot_loss (each slot's mean, weighted); anchor_generator,
                step_slot_counts, step_loss (an optimizer step's counts over every process and its loss)
    deployment  token_problems, gamma_problems (config.json's mask token and trained gamma); parallel_commands
    model card  parallel_line (the "Draft:" line's part), usage_section

Module-level imports are the standard library's and pydantic's alone: every kind's options import this module when
the registry loads (`import kinds` loads no torch). torch, decode/, distill/ and kinds.dflash are imported where used,
never a module that imports the registry (decode.deploy.deploy_check: the caller hands its DEFAULT_GAMMA in).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from decode.deploy.deploy_check import DeployReport
    from decode.loop.sampling import SamplingConfig
    from distill.losses.distill_loss import LossSums


@dataclass(frozen=True)
class ParallelKeys:
    """One kind's names for the same things (its recipe keys are also its config.json keys)."""

    kind: str       # model.draft_kind: "pard"
    token: str      # the mask token's key: "pard_token"
    gamma: str      # the trained gamma's key: "pard_gamma"
    check: str      # the deployment check of the mask token: "pard_token"
    drafter: str    # what drafts, in messages: "draft"
    unit: str       # what one round runs, in messages: "forward"
    embedding: str  # whose embedding holds the mask token, in messages: "draft's"


# -- recipe -------------------------------------------------------------------------------------------------------

TOKEN_DEFAULT = ("null = the tokenizer's mask token, else the first embedding row past the tokenizer; a vocabulary "
                 "without a spare row needs an id its text never holds (e.g. a reserved special token).")


def gamma_field(keys: ParallelKeys, round_runs: str, note: str = "") -> Any:
    """model.<gamma>, 8 by default, at least 2; ``round_runs``: what drafts the tokens ("one forward"); ``note``
    ends the description."""
    return Field(8, ge=2, description=f"{keys.kind}: the most tokens {round_runs} drafts (the newest token's "
                                      f"successor and {keys.gamma} - 1 mask slots after it); eval gammas <= "
                                      f"{keys.gamma}.{note}")


def token_field(keys: ParallelKeys, slots: str, embeds: str = "") -> Any:
    """model.<token>, null by default; ``slots``: what the id is of ("the mask token filling the slots"),
    ``embeds``: how vLLM embeds it, when the description says."""
    return Field(None, ge=0, description=f"{keys.kind}: the id of {slots} (vLLM reads `{keys.token}` from the "
                                         f"{keys.drafter}'s config.json{embeds}); {TOKEN_DEFAULT}")


def check_trained_gammas(recipe: Any, keys: ParallelKeys) -> None:
    """The measured gammas within the trained one (eval.gammas <= model.<gamma>): slots past it are never trained.
    One RecipeError naming eval.gammas."""
    from distill.recipe.schema import require

    largest = getattr(recipe.model, keys.gamma)
    require(all(g <= largest for g in recipe.eval.fixed_gammas), "eval.gammas", recipe.eval.gammas,
            f"gammas <= {largest} with model.{keys.gamma} {largest} (slots past it are never trained)",
            [f"model.{keys.gamma}"])


# -- build --------------------------------------------------------------------------------------------------------

def mask_token_for(cfg: Any, keys: ParallelKeys, vocab_size: int, tokenizer: PreTrainedTokenizerBase) -> int:
    """model.<token>, or the tokenizer's mask token, or the first embedding row past the tokenizer. Raises
    ModelSetupError naming model.<token> when there is none or it is outside the embedding holding it."""
    from distill.utils import ModelSetupError
    from kinds.dflash.model import mask_token_id_for

    token = getattr(cfg, keys.token)
    if token is None:
        try:
            token = mask_token_id_for(tokenizer, vocab_size)
        except ValueError as err:
            raise ModelSetupError(f"model.{keys.token}: {str(err).replace('pass mask_token_id', 'name one')}") \
                from None
    if token >= vocab_size:
        raise ModelSetupError(f"model.{keys.token}: got {token}; allowed: an id of the {keys.embedding} embedding, "
                              f"0..{vocab_size - 1}")
    return int(token)


def check_mask_row(weight: torch.Tensor, token: int, keys: ParallelKeys) -> None:
    """ModelSetupError naming model.<token> when the mask token's embedding row (of ``weight`` [V, H]) cannot carry a
    signal (kinds.dflash.model.zero_mask_row)."""
    from distill.utils import ModelSetupError
    from kinds.dflash.model import zero_mask_row

    if problem := zero_mask_row(weight, token):
        raise ModelSetupError(f"model.{keys.token}: {problem}")


# -- decoding -----------------------------------------------------------------------------------------------------

VLLM_OPTIONS = {"parallel_drafting": True}  # vLLM's proposer (draft_model, eagle3) drafting all gamma tokens at once


def feed_lengths(max_gamma: int) -> tuple[int, ...]:
    """The query lengths the compiled path compiles: powers of two up to 2 * max_gamma (a feed is the accepted drafts,
    cur and gamma - 1 slots: 1..2 * gamma tokens), padded up to the next one."""
    lengths, n = [], 1
    while n < 2 * max_gamma:
        lengths.append(n)
        n *= 2
    return (*lengths, 2 * max_gamma)


def draw_slots(logits: torch.Tensor, cfg: SamplingConfig,
               generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The round's tokens from its rows' logits [gamma, V]: (drafted [gamma], None) greedy, each row's argmax;
    sampling, (drafted, q [gamma, V]), each d_j drawn from its own row's q_j = softmax(warped logits_j) independently
    of d_<j."""
    from decode.loop.sampling import draw, probs_from_logits

    if cfg.greedy:
        return logits.argmax(dim=-1), None
    q = probs_from_logits(logits, cfg)
    return draw(q, cfg, generator), q


# -- training -----------------------------------------------------------------------------------------------------

def block_positions(anchors: torch.Tensor, length: int, gamma: int) -> torch.Tensor:
    """Position ids of the row (0..T-1) and its blocks' mask slots (slot k of block i at a_i + k): [B, T + n * s],
    s = gamma - 1, from anchors [B, n]."""
    import torch

    offsets = torch.arange(1, gamma, device=anchors.device)
    row = torch.arange(length, device=anchors.device).expand(anchors.shape[0], length)
    return torch.cat([row, (anchors[..., None] + offsets).flatten(1)], dim=1)


def block_allowed(anchors: torch.Tensor, attention_mask: torch.Tensor, gamma: int) -> torch.Tensor:
    """Which keys each query may see, [B, 1, Q, Q] bool, Q = T + n * s, s = gamma - 1: a row query t sees row keys
    j <= t that are not padding (and itself); slot k of block i sees row keys j <= a_i that are not padding and slots
    1..k of block i."""
    import torch

    batch, count = anchors.shape
    length, s = attention_mask.shape[1], gamma - 1
    real = attention_mask.bool()
    columns = torch.arange(length, device=anchors.device)
    causal = columns[None, :] <= columns[:, None]
    row_row = (causal[None] & real[:, None, :]) | torch.eye(length, dtype=torch.bool, device=anchors.device)[None]
    row_slot = torch.zeros(batch, length, count * s, dtype=torch.bool, device=anchors.device)
    slot_row = (columns[None, None, :] <= anchors[..., None]) & real[:, None, :]  # [B, n, T]
    slot_row = slot_row[:, :, None, :].expand(batch, count, s, length).reshape(batch, count * s, length)
    block_of = torch.arange(count * s, device=anchors.device) // s
    slot_of = torch.arange(count * s, device=anchors.device) % s
    slot_slot = (block_of[:, None] == block_of[None, :]) & (slot_of[None, :] <= slot_of[:, None])
    allowed = torch.cat([torch.cat([row_row, row_slot], dim=2),
                         torch.cat([slot_row, slot_slot.expand(batch, -1, -1)], dim=2)], dim=1)
    return allowed[:, None]


def slot_weights(gamma: int, decay: float | None) -> list[float]:
    """w_k = exp(-k / decay) for mask slots k = 1..gamma-1 (all 1 without a decay); slot 0 weighs 1."""
    return [1.0 if decay is None else math.exp(-k / decay) for k in range(1, gamma)]


def slot_counts(labels: torch.Tensor) -> torch.Tensor:
    """N_k of each mask slot, [gamma - 1] long, from slot labels [B, n, gamma - 1]."""
    from distill.utils import IGNORE_INDEX

    return (labels != IGNORE_INDEX).sum(dim=(0, 1))


def weighted_slot_loss(sums: list[torch.Tensor], counts: torch.Tensor, weights: list[float]) -> torch.Tensor:
    """(sum_k w_k S_k / N_k) / sum_k w_k over slots 0..gamma-1 (w_0 = 1); `counts` [gamma] the step's N_k."""
    weights = [1.0, *weights]
    total = sums[0] * 0.0
    for weight, s, n in zip(weights, sums, counts):
        total = total + weight * s / n.clamp(min=1)
    return total / sum(weights)


def anchor_generator(seed: int, step: int, index: int, process: int) -> torch.Generator:
    """The generator of micro-batch ``index``'s anchors at optimizer step ``step`` on process ``process``, seeded by
    all four: a resumed run draws the same anchors."""
    import torch

    return torch.Generator().manual_seed((seed * 1_000_003 + step * 1009 + index * 31 + process) % (2 ** 63))


def step_slot_counts(labels: list[torch.Tensor], gamma: int, accelerator: Any,
                     device: torch.device) -> torch.Tensor:
    """N_1..N_{gamma-1} of an optimizer step: the kept labels of each micro-batch's mask slots (``labels``, each
    [B, n, gamma - 1]) counted and summed over every process, [gamma - 1] float64 on ``device``."""
    import torch

    local = torch.zeros(gamma - 1, dtype=torch.float64)
    for batch in labels:
        local += slot_counts(batch).double()
    local = local.to(device)
    return accelerator.reduce(local, reduction="sum") if accelerator.num_processes > 1 else local


def step_loss(first: LossSums, slots: list[LossSums], weights: list[float], num_items_in_batch: Any,
              step_counts: torch.Tensor | None, processes: int) -> torch.Tensor:
    """weighted_slot_loss of slot 0 (``first``) and mask slots 1..gamma-1, times P for DDP's average: in the training
    loop (``num_items_in_batch``, N_0) with the step's counts over every process (``step_counts``, N_1..) and P =
    ``processes``; called alone (None), with this batch's own counts and P = 1."""
    import torch

    device = first.loss.device
    if num_items_in_batch is None:
        counts = torch.stack([torch.as_tensor(s.num_tokens, dtype=torch.float64, device=device)
                              for s in (first, *slots)])
        processes = 1
    else:
        counts = torch.cat([torch.as_tensor(num_items_in_batch, dtype=torch.float64, device=device).reshape(1),
                            step_counts.to(device)])
    return weighted_slot_loss([first.loss, *(s.loss for s in slots)], counts.to(first.loss.dtype),
                              weights) * processes


# -- deployment ---------------------------------------------------------------------------------------------------

def token_problems(config: dict, keys: ParallelKeys) -> dict[str, str]:
    """{keys.check: why} when config.json names no mask token as vLLM reads it (an id of the embedding), else {}."""
    token, vocab = config.get(keys.token), config.get("vocab_size")
    if isinstance(token, int) and (not isinstance(vocab, int) or 0 <= token < vocab):
        return {}
    return {keys.check: (f"config.json has {keys.token}={token!r}; vLLM's parallel drafting needs the mask token's id "
                         f"there (0..{vocab - 1 if isinstance(vocab, int) else 'vocab_size - 1'}): re-export with "
                         "specdistill-train or add it")}


def gamma_problems(config: dict, keys: ParallelKeys, gamma: int | None) -> dict[str, str]:
    """{"gamma": why} when the served gamma (generation_config.num_assistant_tokens) is past the trained one
    (config.json's <gamma>): slots past it were never trained; else {}."""
    trained = config.get(keys.gamma)
    if not isinstance(trained, int) or gamma is None or gamma <= trained:
        return {}
    return {"gamma": (f"generation_config.json drafts gamma={gamma}, but the {keys.drafter} was trained for at most "
                      f"{trained} tokens per {keys.unit}: set num_assistant_tokens <= {trained}")}


def parallel_commands(report: DeployReport, method: str, step_runs: str, default_gamma: int) -> str:
    """specdistill-eval and vLLM (``method`` with parallel_drafting) at the folder's gamma, else ``default_gamma``;
    ``step_runs``: what one step runs ("one draft forward")."""
    from decode.deploy.serving_commands import eval_line, serve_alone_line, vllm_serve, vllm_speculative_config

    gamma = report.gamma or default_gamma
    spec = vllm_speculative_config(method, report.draft, gamma, VLLM_OPTIONS)
    return f"""# specdistill's own decoder (the same measurement as the trainer's)
{eval_line(report.target, report.draft, gamma)}

# vLLM ({step_runs} per step)
{serve_alone_line(report.draft)}{vllm_serve(report.target, spec)}"""


# -- model card ---------------------------------------------------------------------------------------------------

def parallel_line(config: dict, keys: ParallelKeys, slots_read: str = "") -> str:
    """The "Draft:" line's part on parallel drafting: the mask token (and ``slots_read``, what else the slots read)
    and the gamma it was trained for."""
    return (f"parallel drafting: mask token {config.get(keys.token)}{slots_read}, up to {config.get(keys.gamma)} "
            f"tokens per {keys.unit}")


def usage_section(method: str, about: str, target: str, repo_id: str, gamma: int | None) -> str:
    """'## Usage' of a parallel draft: ``about`` (its paragraph; {target}, {g} and {why} are filled in), vLLM
    (``method`` with parallel_drafting) and specdistill-eval at ``gamma`` (4, an untuned default, when None)."""
    from decode.deploy.serving_commands import PROMPTS_NOTE, eval_line, vllm_speculative_config
    from distill.publish.card_usage import vllm_usage

    g = gamma if gamma is not None else 4
    why = ("the gamma with the best cost-model speedup above" if gamma is not None
           else "an untuned default: measure and pick your own")
    spec = vllm_speculative_config(method, repo_id, g, VLLM_OPTIONS)
    return f"""## Usage

{about.format(target=target, g=g, why=why)}

{vllm_usage(target, spec)}
### specdistill (the decoder that measured it)

```bash
{PROMPTS_NOTE}
{eval_line(target, repo_id, g)}
```
"""
