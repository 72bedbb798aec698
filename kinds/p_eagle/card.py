"""What a P-EAGLE head's model card says: its architecture line and its '## Usage' (vLLM's eagle3 with parallel
drafting, specdistill-eval), a parallel draft's (kinds/parallel_drafting.py) in P-EAGLE's words."""
from __future__ import annotations

from kinds.base import CardText
from kinds.eagle3.card import describe_head
from kinds.p_eagle.options import KEYS
from kinds.parallel_drafting import parallel_line, usage_section

ABOUT = """\
A P-EAGLE head is an EAGLE-3 head that drafts all gamma tokens in one pass: the newest token with the target's
hidden states, then gamma - 1 mask slots (`ptd_token_id` in config.json, with the learned `mask_hidden`). It runs
only next to `{target}` (the target's input embedding is shared, not stored here). The target's output distribution
is unchanged. `gamma = {g}` is {why}. Without `parallel_drafting` vLLM serves it as a plain EAGLE-3 head."""


def describe_p_eagle(config: dict) -> list[str]:
    """A P-EAGLE head: the EAGLE-3 head's line, the mask token and the gamma it was trained for."""
    return [*describe_head(config), parallel_line(config, KEYS, " with a learned hidden state")]


def p_eagle_usage_section(target: str, repo_id: str, gamma: int | None) -> str:
    """'## Usage' of a P-EAGLE head: vLLM (eagle3, parallel_drafting) and specdistill-eval at ``gamma``."""
    return usage_section("eagle3", ABOUT, target, repo_id, gamma)


CARD = CardText("A P-EAGLE draft head (EAGLE-3 with parallel drafting) for speculative decoding with target {target}, "
                "trained with specdistill. It drafts all gamma tokens in one pass of the head on the target's "
                "hidden states; vLLM (`method: eagle3` with `parallel_drafting: true`) serves this folder as it is. ",
                describe_p_eagle, p_eagle_usage_section, ("eagle3", "p-eagle"))
