"""The speculators format (vllm-project/speculators): a draft's config.json that also names its algorithm, how many
tokens it proposes and the target it was trained for (the "verifier"), so that `vllm serve DRAFT` serves the target
with its draft and no --speculative-config. Red Hat's published heads (`RedHatAI/*-speculator.*`) are in it.

specdistill writes these keys beside its own in the one config.json of an export (kinds that vLLM reads in this format:
eagle3, peagle), so the folder serves every way: `vllm serve DRAFT`, `vllm serve TARGET --speculative-config
'{"model": DRAFT, ...}'`, SGLang, transformers' config classes and speculators' own (`SpeculatorModelConfig`):

    {"speculators_model_type": "eagle3", "speculators_version": "0.9.0",
     "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 4, ...}],
                            "verifier": {"name_or_path": TARGET, "architectures": ["LlamaForCausalLM"]}},
     ...the algorithm's own keys (a kind's `speculators_fields`: transformer_layer_config, draft_vocab_size, ...)}

vLLM takes `speculative_tokens` of the first proposal method as num_speculative_tokens and the verifier's
name_or_path as the model it serves (vllm.transformers_utils.configs.speculators).
"""
from __future__ import annotations

import json
from pathlib import Path

from decode.inputs.checks import FileProblem, read_text

SPECULATORS_VERSION = "0.9.0"  # the speculators release whose schema these keys follow
CONFIG_FILE = "config.json"


def speculators_block(algorithm: str, gamma: int, verifier: str, architectures: list[str]) -> dict:
    """The `speculators_config` of a draft proposing ``gamma`` tokens greedily (a chain, as vLLM drafts) for the
    target ``verifier`` (a hub id or a folder vLLM can load)."""
    proposal = {"proposal_type": "greedy", "speculative_tokens": int(gamma), "accept_tolerance": 0.0,
                "verifier_accept_k": 1}
    return {"algorithm": algorithm, "default_proposal_method": "greedy", "proposal_methods": [proposal],
            "verifier": {"name_or_path": str(verifier), "architectures": list(architectures)}}


def speculators_type(config: dict) -> str | None:
    """The speculators algorithm a config.json dict names (`speculators_model_type`), None for other configs."""
    kind = config.get("speculators_model_type")
    return str(kind) if kind and isinstance(config.get("speculators_config"), dict) else None


def folder_speculators_type(folder: str | Path) -> str | None:
    """speculators_type of a local folder's config.json; None when there is none or it is not JSON."""
    try:
        return speculators_type(json.loads(read_text(Path(folder) / CONFIG_FILE)))
    except (OSError, ValueError, AttributeError, FileProblem):
        return None


def proposed_tokens(config: dict) -> int | None:
    """How many tokens the first proposal method drafts (vLLM's num_speculative_tokens), None when unset."""
    methods = (config.get("speculators_config") or {}).get("proposal_methods") or []
    tokens = methods[0].get("speculative_tokens") if methods and isinstance(methods[0], dict) else None
    return int(tokens) if tokens is not None else None


def verifier_of(config: dict) -> str | None:
    """The target a speculators config names (verifier.name_or_path), None when it names none."""
    verifier = (config.get("speculators_config") or {}).get("verifier") or {}
    return verifier.get("name_or_path")


def target_architectures(target: str) -> list[str]:
    """The architectures of a local target folder's config.json ([] for a hub id or an unreadable config: vLLM only
    needs the verifier's name_or_path)."""
    try:
        return list(json.loads(read_text(Path(target) / CONFIG_FILE)).get("architectures") or [])
    except (OSError, ValueError, AttributeError, FileProblem):
        return []


def add_speculators_keys(folder: str | Path, fields: dict, gamma: int, verifier: str) -> None:
    """Write the speculators keys into ``folder``'s config.json beside its own: ``fields`` (the kind's, with its
    `speculators_model_type`), the version and the speculators_config for ``verifier`` drafting ``gamma``."""
    path = Path(folder) / CONFIG_FILE
    config = json.loads(read_text(path))
    algorithm = fields["speculators_model_type"]
    config.update(fields, speculators_version=SPECULATORS_VERSION,
                  speculators_config=speculators_block(algorithm, gamma, verifier, target_architectures(verifier)))
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
