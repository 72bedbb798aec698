"""The model card's '## Usage' section: how to serve the draft, with the target and gamma filled in.

    usage_section(target, repo_id, gamma)        # a standalone draft: transformers assisted generation and vLLM
    head_usage_section(target, repo_id, gamma)   # an EAGLE-3 head: vLLM (method eagle3), SGLang (EAGLE3), specdistill

gamma is the card's best measured gamma (model_card.best_gamma), None when nothing was measured (4 is then shown as
an untuned default).
"""
from __future__ import annotations

from decode.serving_commands import sglang_launch, vllm_serve, vllm_speculative_config


def vllm_usage(target: str, spec: str) -> str:
    """The card's vLLM snippet: offline LLM and `vllm serve` with the speculative config ``spec`` (JSON)."""
    return f"""### vLLM

```python
from vllm import LLM, SamplingParams

llm = LLM(model="{target}", speculative_config={spec})
outputs = llm.generate(["def fibonacci(n):"], SamplingParams(temperature=0.0, max_tokens=128))
print(outputs[0].outputs[0].text)
```

```bash
{vllm_serve(target, spec)}
```
"""


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
specdistill-eval --target {target} --draft {repo_id} --gamma {g}
```
"""
