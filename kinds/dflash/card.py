"""What a DFlash draft's model card says: its architecture line and its '## Usage' (vLLM dflash, specdistill-eval)."""
from __future__ import annotations

from decode.deploy.serving_commands import PROMPTS_NOTE, eval_line, vllm_speculative_config
from distill.publish.card_usage import vllm_usage
from kinds.base import CardText
from kinds.dflash.model import ARCHITECTURE


def describe_dflash(config: dict) -> list[str]:
    """A DFlash draft: its layers, the target layers it reads, its block size and mask token."""
    options = config.get("dflash_config") or {}
    return [f"DFlash draft ({ARCHITECTURE}): {config.get('num_hidden_layers')} decoder layers on the target's hidden "
            f"states at layers {options.get('target_layer_ids')} (layer outputs, 0-based)",
            f"block size {config.get('block_size')}", f"mask token {options.get('mask_token_id')}",
            f"hidden size {config.get('hidden_size')}"]


def dflash_usage_section(target: str, repo_id: str, gamma: int | None) -> str:
    """'## Usage' of a DFlash draft: vLLM (method dflash) and specdistill-eval at ``gamma``."""
    g = gamma if gamma is not None else 4
    why = ("the gamma with the best cost-model speedup above" if gamma is not None
           else "an untuned default: measure and pick your own")
    spec = vllm_speculative_config("dflash", repo_id, g)
    return f"""## Usage

A DFlash draft reads the target's own hidden states and uses its embedding and lm_head (not stored here): it runs
only next to `{target}`. It fills a whole block in one forward, so gamma can be up to the block size minus one at
the same cost. The target's output distribution is unchanged. `gamma = {g}` is {why}.

{vllm_usage(target, spec)}
### specdistill (the decoder that measured it)

```bash
{PROMPTS_NOTE}
{eval_line(target, repo_id, g)}
```
"""


CARD = CardText("A DFlash block draft for speculative decoding with target {target}, trained with specdistill. It "
                "drafts a whole block of tokens in one forward pass from the target's own hidden states; vLLM "
                "(`method: dflash`) serves this folder as it is. ", describe_dflash, dflash_usage_section, ("dflash",))
