"""The results of an evaluation, defined once: the typed record of one result (its fields are exactly the keys of
one result in the eval JSON and in acceptance.jsonl, docs/reference/interfaces.md), the eval JSON's writer and
reader, and what every key of the eval JSON means (docs/reference/eval-json.md is generated from it:
``python -m decode.measure.results``).

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

from decode.inputs.checks import read_text
from decode.inputs.writes import write_atomic


@dataclass
class Result:
    """One gamma (and temperature) measured over a set of prompts (decode.measure.evaluate.summarize). What each field
    holds, and in which unit: RESULT_KEYS."""

    gamma: int | str
    temperature: float
    num_prompts: int
    new_tokens: int
    acceptance_rate: float
    draft_acceptance_rate: float
    mean_accepted_tokens: float
    per_position_acceptance: list[float]
    target_tokens_per_s: float
    speculative_tokens_per_s: float
    speedup: float
    predicted_speedup: float | None
    draft_cost_ratio: float | None
    verify_cost_ratio: float | None
    greedy_match: float | None
    compiled: bool
    stats: dict
    compile_seconds: float | None = None
    mean_gamma: float | None = None
    hf_assisted_tokens_per_s: float | None = None
    by_category: dict[str, Result] | None = None
    concurrency: int | None = None
    host_reads_per_step: float | None = None

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
            raise ValueError(f"result (gamma={data.get('gamma', '?')}) is not a decode.measure.evaluate result: "
                             + "; ".join(problems))
        values = dict(data)
        if values.get("by_category") is not None:
            values["by_category"] = {name: cls.from_dict(r) for name, r in values["by_category"].items()}
        return cls(**values)


ALL_KEYS = tuple(f.name for f in fields(Result))
OPTIONAL_KEYS = ("compile_seconds", "mean_gamma", "hf_assisted_tokens_per_s", "by_category", "concurrency",
                 "host_reads_per_step")
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
    write_atomic(path, json.dumps({**report, "environment": environment()}, indent=2) + "\n")


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


# ---------------------------------------------------------------------------------------------------------------
# What every key means: docs/reference/eval-json.md is generated from these (python -m decode.measure.results), and
# tests/test_eval_json_keys.py checks them against the keys a real evaluation writes
# ---------------------------------------------------------------------------------------------------------------

ENGINES = ("specdistill", "vllm", "both")  # specdistill-eval --engine


@dataclass(frozen=True)
class Key:
    """One key of the eval JSON: its unit (or type), what it holds, and the --engine values whose JSON has it."""

    unit: str
    meaning: str
    engines: tuple[str, ...] = ENGINES


EVAL_JSON_KEYS: dict[str, Key] = {
    "engine": Key("text", "Who measured `results`: `specdistill` (our decoder), `vllm` (vLLM's offline `LLM`) or "
                          "`both` (ours, next to vLLM's: `vllm_results`, `parity`)."),
    "device": Key("text", "The GPU's name, or `cpu (<processor>, <N> threads)`; with `--engine vllm` followed by "
                          "`, vLLM <version>`."),
    "dtype": Key("text", "The dtype the models ran in (`float32`, `bfloat16`, `float16`): `--dtype`, or with "
                         "`--engine vllm` vLLM's, `vllm_dtype`."),
    "torch_version": Key("text", "`torch.__version__` of the evaluating process."),
    "target": Key("text", "`--target` as given: a folder, a hub id or a `.gguf` file."),
    "draft": Key("text", "`--draft` as given: a folder, a hub id, a `.gguf` file or `prompt-lookup`."),
    "draft_kind": Key("text", "The draft's kind, by the name recipes give `model.draft_kind` (one folder of kinds/ "
                              "each; prompt lookup too)."),
    "prompts": Key("text", "`--prompts` as given: a `.jsonl` or `.txt` file, a dataset folder or a hub dataset id."),
    "chat_template": Key("text", "`--chat-template`: `auto`, `on` or `off` (decode.inputs.prompts)."),
    "compiled": Key("bool", "Static KV caches and torch.compiled steps (`--compile`); false for vLLM."),
    "cpu_linear": Key("text", "`packed` when the linear layers ran on oneDNN-packed weights "
                              "(decode.loop.packed_linear: eager decoding on CPU), `plain` when not, or with "
                              "`--cpu-linear auto` (the default) the token counts each model kept on F.linear, e.g. "
                              "`auto: target plain at 1-3 tokens, draft packed`.", ("specdistill", "both")),
    "draft_vocab": Key("count or null", "The rows of a standalone or PARD draft's lm_head our decoder read out: its "
                                        "draft vocabulary's size (`draft_vocab.json`, kinds/draft_vocab.py), or null "
                                        "for every row (`--draft-vocab full`, `--engine both`, or none stored).",
                       ("specdistill", "both")),
    "compile_seconds": Key("seconds or null", "The evaluation's compilation (its warm-up), excluded from every "
                                              "tokens/s; null with `--engine vllm` and `--acceptance-only`."),
    "acceptance_only": Key("bool", "`--acceptance-only`: each result holds acceptance alone (gamma, temperature, "
                                   "num_prompts, acceptance_rate, draft_acceptance_rate, mean_accepted_tokens, "
                                   "per_position_acceptance, stats: the same values as a full run), nothing timed "
                                   "and no plain decoding.", ("specdistill", "both")),
    "results": Key("list of results", "One result per gamma (and per `concurrency` level): ours, or vLLM's with "
                                      "`--engine vllm`. Keys: [Each result](#each-result)."),
    "environment": Key("object", "Where the numbers were made, evaluate.save's record: "
                                 "[`environment`](#environment)."),
    "vllm_version": Key("text", "The vLLM version that ran.", ("vllm", "both")),
    "vllm_dtype": Key("text", "The dtype vLLM ran the target and the draft in (`float32`, `bfloat16`, `float16`); "
                              "`--vllm-dtype`, `auto` resolved by the device.", ("vllm", "both")),
    "vllm_draft_sampling": Key("text", "How vLLM sampled draft tokens at temperature > 0: `greedy` (argmax drafts, "
                                       "accepted with p(d)) or `probabilistic` (d ~ q, accepted with min(1, p/q), "
                                       "as ours); `--vllm-draft-sampling`.", ("vllm", "both")),
    "vllm_cpu_expand_patched": Key("bool", "True when vLLM's CPU `expand` kernel, which breaks sampling at "
                                           "temperature > 0 on vLLM 0.32, was replaced in the run "
                                           "(decode/serving/vllm_worker.py).", ("vllm", "both")),
    "vllm_in_process": Key("bool", "True when vLLM's engines ran in the worker's own process (the CPU `expand` "
                                   "patch, or `SPECDISTILL_VLLM_IN_PROCESS=1`): the same outputs and counters, the "
                                   "wall clock of one process instead of the served layout.", ("vllm", "both")),
    "vllm_results": Key("list of results", "vLLM's results, one per gamma (and `concurrency` level).", ("both",)),
    "parity": Key("list of parity rows", "tau of ours against vLLM's, one row per vLLM result: "
                                         "[Each parity row](#each-parity-row).", ("both",)),
    "parity_tolerance": Key("ratio", "`--parity-tolerance`: the largest abs(tau(vLLM) / tau(ours) - 1) that "
                                     "passes (the command exits 1 beyond it).", ("both",)),
    "target_match_vllm": Key("fraction or null", "Share of prompts whose plain (target-only) output from vLLM is "
                                                 "our target's, token for token; null when temperature > 0.",
                             ("both",)),
}

RESULT_KEYS: dict[str, Key] = {
    "gamma": Key("tokens or `\"auto\"`", "Draft tokens proposed per target verify pass; `\"auto\"`: chosen at "
                                         "every step from the running acceptance and the measured costs "
                                         "(decode.loop.auto_gamma)."),
    "temperature": Key("number", "Sampling temperature; 0 is greedy."),
    "num_prompts": Key("prompts", "Prompts measured."),
    "new_tokens": Key("tokens", "Tokens generated over all prompts (plain decoding generates as many)."),
    "acceptance_rate": Key("probability", "Mean over verified positions of sum_x min(p(x), q(x)) = 1 - TV(p, q), "
                                          "p the target's and q the draft's distribution (Leviathan et al.'s "
                                          "per-token acceptance). vLLM reports no p and q: there it is "
                                          "`draft_acceptance_rate`."),
    "draft_acceptance_rate": Key("fraction", "Accepted draft tokens / drafted tokens."),
    "mean_accepted_tokens": Key("tokens per target pass", "tau: new tokens / target verify passes, the bonus or "
                                                          "resampled token included (1 to gamma + 1)."),
    "per_position_acceptance": Key("list of gamma fractions", "Entry i: P(draft token i accepted given the draft "
                                                              "tokens before it were)."),
    "target_tokens_per_s": Key("tokens/s", "Plain decoding with the target alone, timed side by side with the "
                                           "speculative runs; with `concurrency`, a throughput (generated tokens / "
                                           "wall seconds of one call with every prompt)."),
    "speculative_tokens_per_s": Key("tokens/s", "Speculative decoding, timed as `target_tokens_per_s`."),
    "speedup": Key("ratio", "Measured: plain seconds / speculative seconds (above 1: speculative is faster)."),
    "predicted_speedup": Key("ratio or null", "The cost model: tau / (gamma * c + v); null from vLLM, except prompt "
                                              "lookup at two or more `concurrency` levels: the batch form tau_all / "
                                              "v_N (decode.measure.batch_cost)."),
    "draft_cost_ratio": Key("ratio or null", "c: drafting seconds per drafted token / seconds per plain-decoding "
                                             "token, timed on the decoder's own loops under the row's sampling "
                                             "settings (decode.measure.cost_model); null from vLLM (0 in the batch "
                                             "form)."),
    "verify_cost_ratio": Key("ratio or null", "v: the rest of a speculative step (the pass over gamma + 1 tokens, "
                                              "acceptance, cache rollbacks, the drafter's commit, the host read) / "
                                              "seconds per plain-decoding token; null from vLLM, except v_N of the "
                                              "batch form (an engine step carrying the drafted tokens / a plain one "
                                              "at the same level)."),
    "greedy_match": Key("fraction or null", "Share of prompts whose speculative output is the plain one, token for "
                                            "token; null when temperature > 0."),
    "compiled": Key("bool", "Measured on the static-cache, torch.compiled path."),
    "stats": Key("object", "Raw counts the summaries are derived from: [`stats`](#stats) (ours) or "
                           "[`stats` from vLLM](#stats-from-vllm)."),
    "compile_seconds": Key("seconds", "The evaluation's compilation, excluded from tokens/s; absent from vLLM "
                                      "results and from `by_category` entries."),
    "mean_gamma": Key("tokens", "Only for gamma `\"auto\"`: the mean gamma chosen."),
    "hf_assisted_tokens_per_s": Key("tokens/s", "Only with `--compare-hf`: transformers' assisted generation at "
                                                "the same gamma."),
    "by_category": Key("object", "Only when prompts have categories: a result (these keys) per category, over its "
                                 "prompts; prompts without one are `uncategorized`. Cost ratios are the whole run's "
                                 "(and for vLLM, so are tokens/s and speedup: one call times every prompt)."),
    "concurrency": Key("sequences", "Only with `--concurrency` (vLLM): the row's max_num_seqs, every prompt "
                                    "submitted at once."),
    "host_reads_per_step": Key("reads per target pass", "Device-to-host reads our decoder made / verify passes: 1 "
                                                        "(the accepted count and tokens, read together), a little "
                                                        "more for prompt lookup, which reads each prompt once for "
                                                        "its n-gram search; absent from vLLM results."),
}

STATS_KEYS: dict[str, Key] = {  # decode.loop.stats.SpecStats
    "gamma": Key("tokens", "Draft length the counts are kept for (for gamma `\"auto\"`, the largest it may "
                           "choose)."),
    "target_calls": Key("passes", "Target verify passes (the prefill is not counted)."),
    "new_tokens": Key("tokens", "Tokens those passes produced."),
    "drafted_tokens": Key("tokens", "Draft tokens proposed."),
    "accepted_tokens": Key("tokens", "Draft tokens accepted."),
    "accepted_length_histogram": Key("list of gamma + 1 counts", "Entry n: verify passes that kept n draft "
                                                                 "tokens."),
    "per_position_drafted": Key("list of gamma counts", "Entry i: passes with a draft token at position i."),
    "per_position_verified": Key("list of gamma counts", "Entry i: passes that compared position i with the "
                                                         "target (the accepted ones and the first rejected)."),
    "per_position_accepted": Key("list of gamma counts", "Entry i: passes that accepted the draft token at "
                                                         "position i."),
    "per_position_min_pq_sum": Key("list of gamma sums of probabilities", "Entry i: sum over the passes that "
                                                                          "verified position i of sum_x min(p, q)."),
    "host_reads": Key("reads", "Device-to-host reads the decoder made (decode.loop.speculative.read_step: one per "
                               "verify pass; prompt lookup also reads each prompt once)."),
}

VLLM_STATS_KEYS: dict[str, Key] = {  # decode.serving.counters.SpecCounters, vLLM's vllm:spec_decode_* counters
    "num_drafts": Key("steps", "Verify steps that had at least one draft token."),
    "num_draft_tokens": Key("tokens", "Draft tokens proposed."),
    "num_accepted_tokens": Key("tokens", "Draft tokens accepted (including accepted tokens past max_tokens that "
                                         "were then cut off)."),
    "num_accepted_tokens_per_pos": Key("list of gamma counts", "Entry i: steps that accepted at least i + 1 draft "
                                                               "tokens."),
}

PARITY_KEYS: dict[str, Key] = {  # decode.serving.parity.parity_rows
    "concurrency": Key("sequences", "Only with `--concurrency`: the vLLM row's max_num_seqs."),
    "gamma": Key("tokens", "Draft length."),
    "temperature": Key("number", "Sampling temperature."),
    "tau_specdistill": Key("tokens per target pass", "Our tau counted on vLLM's basis (a step counts only if it "
                                                     "drafted; decode.serving.counters)."),
    "tau_vllm": Key("tokens per target pass", "vLLM's tau: 1 + accepted / drafts."),
    "ratio": Key("ratio", "`tau_vllm` / `tau_specdistill`."),
    "greedy_match_vllm": Key("fraction or null", "vLLM's `greedy_match`."),
    "within_tolerance": Key("bool", "abs(`ratio` - 1) <= `parity_tolerance`."),
}

ENVIRONMENT_KEYS: dict[str, Key] = {  # evaluate.save (evaluate/saving.py)
    "_timestamp": Key("ISO 8601 time", "When the file was written (local time)."),
    "_git_commit_hash": Key("text or null", "The git commit of the folder the command ran in; null outside a "
                                            "repository."),
    "_evaluate_version": Key("text", "The `evaluate` package's version."),
    "_python_version": Key("text", "`sys.version`."),
    "_interpreter_path": Key("path", "`sys.executable`."),
}

# The tables of docs/reference/eval-json.md, in order: (heading, what the keys belong to, keys).
REFERENCE_TABLES = (
    ("Top level", "The JSON object `specdistill-eval --output` writes.", EVAL_JSON_KEYS),
    ("Each result", "An entry of `results` and `vllm_results`, and each value of a result's `by_category` "
                    "(decode.measure.results.Result). acceptance.jsonl rows hold the same keys, "
                    "plus `step` and `checkpoint`.", RESULT_KEYS),
    ("`stats`", "A result's raw counts from our decoder (decode.loop.stats.SpecStats).", STATS_KEYS),
    ("`stats` from vLLM", "A vLLM result's raw counts: vLLM's `vllm:spec_decode_*` counters "
                        "(decode.serving.counters.SpecCounters).", VLLM_STATS_KEYS),
    ("Each parity row", "An entry of `parity` (decode.serving.parity).", PARITY_KEYS),
    ("`environment`", "Where the numbers were made: the record `evaluate.save` writes.", ENVIRONMENT_KEYS),
)


def reference_markdown() -> str:
    """The key tables of docs/reference/eval-json.md: every key of the eval JSON with its unit and meaning."""
    lines = []
    for heading, about, keys in REFERENCE_TABLES:
        with_engines = any(key.engines != ENGINES for key in keys.values())
        lines += [f"## {heading}", "", about, "",
                  "| key | unit | meaning |" + (" written with `--engine` |" if with_engines else ""),
                  "|---|---|---|" + ("---|" if with_engines else "")]
        for name, key in keys.items():
            engines = "any" if key.engines == ENGINES else ", ".join(f"`{e}`" for e in key.engines)
            lines.append(f"| `{name}` | {key.unit} | {key.meaning} |" + (f" {engines} |" if with_engines else ""))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
