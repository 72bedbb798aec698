"""What a standalone draft's model card says: its architecture line and its '## Usage' (transformers' assisted
generation and vLLM's draft_model)."""
from __future__ import annotations

from decode.deploy.serving_commands import vllm_speculative_config
from distill.publish.card_usage import vllm_usage
from kinds.base import CardText


def describe_model(config: dict) -> list[str]:
    """A standalone draft: its model type, layers and hidden size."""
    parts = [str(config.get("model_type", "unknown architecture"))]
    layers = config.get("num_hidden_layers", config.get("n_layer"))
    hidden = config.get("hidden_size", config.get("n_embd"))
    if layers is not None:
        parts.append(f"{layers} layers")
    if hidden is not None:
        parts.append(f"hidden size {hidden}")
    return parts


def usage_section(target: str, repo_id: str, gamma: int | None) -> str:
    """'## Usage': the draft as transformers' assistant_model and as vLLM's draft, at ``gamma`` (default 4)."""
    g = gamma if gamma is not None else 4
    why = ("the gamma with the best cost-model speedup above (mean_accepted_tokens / (gamma * draft_cost_ratio + "
           "verify_cost_ratio))" if gamma is not None
           else "an untuned default: measure and pick your own")
    spec = vllm_speculative_config("draft_model", repo_id, g)
    return f"""## Usage

The draft must share the target's tokenizer; the target's output distribution is unchanged. `gamma = {g}`
is {why}.

### transformers (assisted generation)

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{target}")
target = AutoModelForCausalLM.from_pretrained("{target}", dtype="auto", device_map="auto")
draft = AutoModelForCausalLM.from_pretrained("{repo_id}", dtype="auto", device_map="auto")
# transformers reads the draft length from the draft's generation_config.
draft.generation_config.num_assistant_tokens = {g}
draft.generation_config.num_assistant_tokens_schedule = "constant"
draft.generation_config.assistant_confidence_threshold = 0.0

inputs = tokenizer("def fibonacci(n):", return_tensors="pt").to(target.device)
outputs = target.generate(**inputs, assistant_model=draft, max_new_tokens=128)
print(tokenizer.decode(outputs[0], skip_special_tokens=True))
```

{vllm_usage(target, spec)}"""




CARD = CardText("A draft model for speculative decoding with target {target}, trained with specdistill. ",
                describe_model, usage_section)
