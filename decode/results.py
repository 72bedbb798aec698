"""The results of an evaluation, defined once: the typed record of one result (its fields are exactly the keys of
one result in the eval JSON and in acceptance.jsonl, docs/INTERFACES.md) and the eval JSON's writer and reader.

    result = Result.from_dict(payload["results"][0])     # ValueError naming the missing / unknown keys
    write_eval_json(Path("eval.json"), report)           # report + the environment record of evaluate.save
    payload = read_eval_json(Path("eval.json"))          # {"device", ..., "results": [...]}

The wire format stays plain JSON (dicts): ``Result.to_dict`` writes the optional keys only when they hold a value.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from decode.checks import read_text

EVAL_JSON_KEYS = ("engine", "device", "dtype", "torch_version", "target", "draft", "draft_kind", "prompts", "chat_template",
                  "compiled", "cpu_linear", "compile_seconds", "results")  # + "environment" (evaluate.save's record)


@dataclass
class Result:
    """One gamma (and temperature) measured over a set of prompts (decode.evaluate.summarize)."""

    gamma: int | str                        # draft tokens per step, or "auto"
    temperature: float
    num_prompts: int
    new_tokens: int
    acceptance_rate: float                  # mean over verified positions of sum_x min(p(x), q(x))
    draft_acceptance_rate: float            # accepted draft tokens / drafted tokens
    mean_accepted_tokens: float             # tau: new tokens per target verify pass
    per_position_acceptance: list[float]    # P(draft token i accepted | tokens before it accepted)
    target_tokens_per_s: float
    speculative_tokens_per_s: float
    speedup: float                          # wall clock: plain seconds / speculative seconds
    predicted_speedup: float | None         # tau / (gamma * c + v); None from vLLM (no cost model there)
    draft_cost_ratio: float | None          # c = draft step / target step (None from vLLM)
    verify_cost_ratio: float | None         # v = target pass over gamma + 1 tokens / target step (None from vLLM)
    greedy_match: float | None              # share of prompts decoded identically; None when temperature > 0
    compiled: bool
    stats: dict                             # raw counts (SpecStats.to_dict; vLLM: serving.counters.SpecCounters)
    compile_seconds: float | None = None    # the evaluation's compilation (not in a by_category entry)
    mean_gamma: float | None = None         # only for gamma "auto"
    hf_assisted_tokens_per_s: float | None = None  # only with compare_hf
    by_category: dict[str, Result] | None = None   # only with categories: a Result per category
    concurrency: int | None = None          # only with --concurrency (vLLM): max_num_seqs, every prompt at once

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: every required key, the optional ones only when set."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in OPTIONAL_KEYS}
        for name in OPTIONAL_KEYS:
            value = getattr(self, name)
            if value is not None:
                out[name] = ({category: r.to_dict() for category, r in value.items()} if name == "by_category"
                             else value)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Result:
        """The record of a result dict. Raises ValueError naming missing required keys and unknown keys."""
        if not isinstance(data, dict):
            raise ValueError(f"a result must be a JSON object, got {type(data).__name__}")
        missing = [k for k in REQUIRED_KEYS if k not in data]
        unknown = [k for k in data if k not in ALL_KEYS]
        if missing or unknown:
            problems = ([f"missing {', '.join(missing)}"] if missing else []) + \
                       ([f"unknown {', '.join(unknown)}"] if unknown else [])
            raise ValueError(f"result (gamma={data.get('gamma', '?')}) is not a decode.evaluate result: "
                             + "; ".join(problems))
        values = dict(data)
        if values.get("by_category") is not None:
            values["by_category"] = {name: cls.from_dict(r) for name, r in values["by_category"].items()}
        return cls(**values)


ALL_KEYS = tuple(f.name for f in fields(Result))
OPTIONAL_KEYS = ("compile_seconds", "mean_gamma", "hf_assisted_tokens_per_s", "by_category", "concurrency")
REQUIRED_KEYS = tuple(k for k in ALL_KEYS if k not in OPTIONAL_KEYS)


# ---------------------------------------------------------------------------------------------------------------
# The eval JSON (specdistill-eval --output)
# ---------------------------------------------------------------------------------------------------------------

def environment() -> dict[str, Any]:
    """evaluate.save's record of where the numbers were made: time, git commit, Python, evaluate's version.

    evaluate.save only writes files (a path without a suffix becomes a folder, its keys land beside the data),
    so the record is made in a temporary folder that disappears with it."""
    import evaluate

    with tempfile.TemporaryDirectory(prefix="specdistill-env-") as folder:
        return json.loads(read_text(evaluate.save(str(Path(folder) / "environment.json"))))


def write_eval_json(path: Path, report: dict[str, Any]) -> None:
    """The eval JSON at ``path``: ``report`` (EVAL_JSON_KEYS) plus ``environment`` (see ``environment``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**report, "environment": environment()}, indent=2) + "\n")


def read_eval_json(path: Path) -> dict[str, Any]:
    """An eval JSON: ``{"device", "dtype", "torch_version", "target", "draft", ..., "results": [...]}``.

    Raises FileNotFoundError if missing, ValueError if it is not JSON or has no ``results`` list.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"eval JSON {path} does not exist")
    try:
        payload = json.loads(read_text(path, "eval JSON"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"eval JSON {path} is not valid JSON: {exc}") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("results"), list):
        raise ValueError(f"eval JSON {path} has no 'results' list (expected the output of specdistill-eval --output)")
    return payload
