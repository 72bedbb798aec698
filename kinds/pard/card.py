"""What a PARD draft's model card says: its architecture line and its '## Usage' (vLLM's draft_model with parallel
drafting, specdistill-eval), a parallel draft's (kinds/parallel_drafting.py) in PARD's words."""
from __future__ import annotations

from kinds.base import CardText
from kinds.parallel_drafting import parallel_line, usage_section
from kinds.pard.options import KEYS
from kinds.standalone.card import describe_model

ABOUT = """\
A PARD draft is a small causal LM sharing the target's tokenizer that drafts all gamma tokens in one forward: the
newest token and gamma - 1 copies of its mask token (`pard_token` in config.json). Its cost per step hardly grows
with gamma. The target's output distribution is unchanged. `gamma = {g}` is {why}."""


def describe_pard(config: dict) -> list[str]:
    """A PARD draft: the standalone draft's line, the mask token and the gamma it was trained for."""
    return [*describe_model(config), parallel_line(config, KEYS)]


def pard_usage_section(target: str, repo_id: str, gamma: int | None) -> str:
    """'## Usage' of a PARD draft: vLLM (draft_model, parallel_drafting) and specdistill-eval at ``gamma``."""
    return usage_section("draft_model", ABOUT, target, repo_id, gamma)


CARD = CardText("A PARD draft (parallel drafting) for speculative decoding with target {target}, trained with "
                "specdistill. It drafts all gamma tokens in one forward pass; vLLM (`method: draft_model` with "
                "`parallel_drafting: true`) serves this folder as it is. ", describe_pard, pard_usage_section,
                ("pard",))
