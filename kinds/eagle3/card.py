"""What an EAGLE-3 head's model card says: its architecture line and its '## Usage' (vLLM eagle3, SGLang EAGLE3,
specdistill-eval)."""
from __future__ import annotations

from decode.deploy.serving_commands import PROMPTS_NOTE, eval_line, sglang_launch, vllm_speculative_config
from distill.publish.card_usage import vllm_usage
from kinds.base import CardText
from kinds.eagle3.model import ARCHITECTURE


def describe_head(config: dict) -> list[str]:
    """An EAGLE-3 head: its decoder layers, the target layers it reads, its hidden size and draft vocabulary."""
    layers = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    depth = config.get("num_hidden_layers") or 1
    decoder = ("one decoder layer" if depth == 1
               else f"{depth} decoder layers (vLLM serves it; SGLang one-layer heads only)")
    return [f"EAGLE-3 head ({ARCHITECTURE}): {decoder} on the target's hidden states at layers {layers}",
            f"hidden size {config.get('hidden_size')}",
            f"draft vocabulary {config.get('draft_vocab_size')} of {config.get('vocab_size')} tokens"]


def head_usage_section(target: str, repo_id: str, gamma: int | None) -> str:
    """'## Usage' of an EAGLE-3 head: vLLM (method eagle3) and SGLang (EAGLE3, chain drafting) at ``gamma``."""
    g = gamma if gamma is not None else 4
    why = ("the gamma with the best cost-model speedup above" if gamma is not None
           else "an untuned default: measure and pick your own")
    spec = vllm_speculative_config("eagle3", repo_id, g)
    return f"""## Usage

An EAGLE-3 head reads the target's own hidden states: it runs only next to `{target}` (same tokenizer; the
target's input embedding is shared, not stored here). The target's output distribution is unchanged.
`gamma = {g}` is {why}.

{vllm_usage(target, spec)}
### SGLang

```bash
{sglang_launch(target, repo_id, "EAGLE3", g)}
```

### specdistill (the decoder that measured it)

```bash
{PROMPTS_NOTE}
{eval_line(target, repo_id, g)}
```
"""


CARD = CardText("An EAGLE-3 draft head for speculative decoding with target {target}, trained with specdistill "
                "(training-time test). It is a small decoder that reads the target's own hidden states; vLLM "
                "(`method: eagle3`) and SGLang (`EAGLE3`, one-layer heads) serve this folder as it is. ",
                describe_head, head_usage_section, ("eagle3",))
