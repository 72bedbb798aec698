"""The commands that serve a draft next to its target, written in one place: vLLM's speculative config and its
`vllm serve` line, SGLang's launch command. The deployment check (decode.deploy.deploy_check, kinds.eagle3.deploy)
prints them and the model card (distill.publish.card_usage) shows them; gamma may be a shell expression such as
"$GAMMA" when the folder names none. A path is written as one shell word (quoted where it holds a space or a
quote), so that every line runs as printed.

    spec = vllm_speculative_config("eagle3", "out/head", 4)   # '{"method": "eagle3", "model": "out/head", ...}'
    vllm_serve("meta-llama/Llama-3.1-8B-Instruct", spec)
    sglang_launch(target, "out/head", "EAGLE3", 4)
"""
from __future__ import annotations

import json
import shlex

from decode.deploy.speculators import folder_speculators_type


def vllm_speculative_config(method: str, draft: str, gamma: int | str, options: dict | None = None) -> str:
    """vLLM's --speculative-config JSON, with a kind's ``options`` after the gamma (e.g. parallel_drafting); a
    non-integer gamma (a shell expression) is written bare."""
    extra = "".join(f", {json.dumps(key)}: {json.dumps(value)}" for key, value in (options or {}).items())
    if isinstance(gamma, int):
        return json.dumps({"method": method, "model": draft, "num_speculative_tokens": gamma, **(options or {})})
    return f'{{"method": "{method}", "model": {json.dumps(draft)}, "num_speculative_tokens": {gamma}{extra}}}'


def in_double_quotes(text: str) -> str:
    """``text`` as it must be written inside a double-quoted shell string to reach the command unchanged."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")


def vllm_serve(target: str, spec: str, expand: bool = False) -> str:
    """`vllm serve` with a speculative config: single-quoted, or double-quoted with its quotes escaped when the shell
    must ``expand`` a variable inside it ($GAMMA)."""
    if expand:  # the spec's own $GAMMA expands; a $ in a path would not
        quoted = '"' + in_double_quotes(spec).replace("\\$GAMMA", "$GAMMA") + '"'
    else:
        quoted = shlex.quote(spec)
    return f"vllm serve {shlex.quote(target)} --speculative-config {quoted}"


def serve_alone_line(draft: str) -> str:
    """`vllm serve DRAFT` and a comment line, for a draft folder in the speculators format (its config.json names the
    target and gamma: decode.deploy.speculators); "" for any other draft."""
    if folder_speculators_type(draft) is None:
        return ""
    return (f"vllm serve {shlex.quote(draft)}   # the draft's config.json names its target and gamma (speculators "
            "format)\n"
            "# or, naming both:\n")


def sglang_launch(target: str, draft: str, algorithm: str, gamma: int | str) -> str:
    """SGLang's server with ``draft`` drafting ``gamma`` tokens per step in a chain (top-k 1): ``algorithm`` is
    STANDALONE for a draft model, EAGLE3 for a head."""
    draft_tokens = gamma + 1 if isinstance(gamma, int) else f"$(({gamma.lstrip('$')} + 1))"
    return (f"python -m sglang.launch_server --model-path {shlex.quote(target)} --speculative-algorithm {algorithm} "
            f"\\\n    --speculative-draft-model-path {shlex.quote(draft)} --speculative-num-steps {gamma} "
            f"--speculative-eagle-topk 1 \\\n"
            f"    --speculative-num-draft-tokens {draft_tokens}")


PROMPTS_NOTE = '# PROMPTS: your prompts, a .jsonl ({"prompt": ...} per line) or a .txt (one per line)'


def eval_line(target: str, draft: str, gamma: int | str) -> str:
    """specdistill's own measurement of ``draft`` next to ``target`` (PROMPTS: the user's prompts file)."""
    return (f"specdistill-eval --target {shlex.quote(target)} --draft {shlex.quote(draft)} --prompts PROMPTS "
            f"--gamma {gamma}")
