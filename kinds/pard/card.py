"""What a PARD draft's model card says: its architecture line and its '## Usage' (vLLM's draft_model with parallel
drafting, specdistill-eval)."""
from __future__ import annotations

from decode.deploy.serving_commands import vllm_speculative_config
from distill.publish.card_usage import vllm_usage
from kinds.base import CardText
from kinds.pard.deploy import VLLM_OPTIONS
from kinds.standalone.card import describe_model


def describe_pard(config: dict) -> list[str]:
    """A PARD draft: the standalone draft's line, the mask token and the gamma it was trained for."""
    return [*describe_model(config), f"parallel drafting: mask token {config.get('pard_token')}, up to "
            f"{config.get('pard_gamma')} tokens per forward"]


def pard_usage_section(target: str, repo_id: str, gamma: int | None) -> str:
    """'## Usage' of a PARD draft: vLLM (draft_model, parallel_drafting) and specdistill-eval at ``gamma``."""
    g = gamma if gamma is not None else 4
    why = ("the gamma with the best cost-model speedup above" if gamma is not None
           else "an untuned default: measure and pick your own")
    spec = vllm_speculative_config("draft_model", repo_id, g, VLLM_OPTIONS)
    return f"""## Usage

A PARD draft is a small causal LM sharing the target's tokenizer that drafts all gamma tokens in one forward: the
newest token and gamma - 1 copies of its mask token (`pard_token` in config.json). Its cost per step hardly grows
with gamma. The target's output distribution is unchanged. `gamma = {g}` is {why}.

{vllm_usage(target, spec)}
### specdistill (the decoder that measured it)

```bash
specdistill-eval --target {target} --draft {repo_id} --gamma {g}
```
"""


CARD = CardText("A PARD draft (parallel drafting) for speculative decoding with target {target}, trained with "
                "specdistill. It drafts all gamma tokens in one forward pass; vLLM (`method: draft_model` with "
                "`parallel_drafting: true`) serves this folder as it is. ", describe_pard, pard_usage_section,
                ("pard",))
