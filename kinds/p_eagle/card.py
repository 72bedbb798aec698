"""What a P-EAGLE head's model card says: its architecture line and its '## Usage' (vLLM's eagle3 with parallel
drafting, specdistill-eval)."""
from __future__ import annotations

from decode.deploy.serving_commands import vllm_speculative_config
from distill.publish.card_usage import vllm_usage
from kinds.base import CardText
from kinds.eagle3.card import describe_head
from kinds.p_eagle.deploy import VLLM_OPTIONS


def describe_p_eagle(config: dict) -> list[str]:
    """A P-EAGLE head: the EAGLE-3 head's line, the mask token and the gamma it was trained for."""
    return [*describe_head(config), f"parallel drafting: mask token {config.get('ptd_token_id')} with a learned "
            f"hidden state, up to {config.get('ptd_gamma')} tokens per pass"]


def p_eagle_usage_section(target: str, repo_id: str, gamma: int | None) -> str:
    """'## Usage' of a P-EAGLE head: vLLM (eagle3, parallel_drafting) and specdistill-eval at ``gamma``."""
    g = gamma if gamma is not None else 4
    why = ("the gamma with the best cost-model speedup above" if gamma is not None
           else "an untuned default: measure and pick your own")
    spec = vllm_speculative_config("eagle3", repo_id, g, VLLM_OPTIONS)
    return f"""## Usage

A P-EAGLE head is an EAGLE-3 head that drafts all gamma tokens in one pass: the newest token with the target's
hidden states, then gamma - 1 mask slots (`ptd_token_id` in config.json, with the learned `mask_hidden`). It runs
only next to `{target}` (the target's input embedding is shared, not stored here). The target's output distribution
is unchanged. `gamma = {g}` is {why}. Without `parallel_drafting` vLLM serves it as a plain EAGLE-3 head.

{vllm_usage(target, spec)}
### specdistill (the decoder that measured it)

```bash
specdistill-eval --target {target} --draft {repo_id} --gamma {g}
```
"""


CARD = CardText("A P-EAGLE draft head (EAGLE-3 with parallel drafting) for speculative decoding with target {target}, "
                "trained with specdistill. It drafts all gamma tokens in one pass of one decoder layer on the target's "
                "hidden states; vLLM (`method: eagle3` with `parallel_drafting: true`) serves this folder as it is. ",
                describe_p_eagle, p_eagle_usage_section, ("eagle3", "p-eagle"))
