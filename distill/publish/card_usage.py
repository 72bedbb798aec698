"""What the model cards' '## Usage' sections share: the vLLM snippet. Each kind writes its own section
(kinds/<kind>/card.py: usage(target, repo_id, gamma)).

gamma is the card's best measured gamma (model_card.best_gamma), None when nothing was measured (4 is then shown as
an untuned default).
"""
from __future__ import annotations

from decode.deploy.serving_commands import vllm_serve


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
