"""Will an exported draft serve next to its target? The checks serving stacks need, one line per problem.

    report = check_deploy("Qwen/Qwen2.5-7B-Instruct", "outputs/qwen2.5-7b-to-0.5b", kind)
    print("\\n".join(report.lines())); print(kind.serving_commands(report))

Checks (each failure is one line naming the check, what was found and what to do):
- safetensors: the draft folder holds *.safetensors weights (vLLM and SGLang load them; .bin is legacy);
- tokenizer: the draft's tokenizer maps every token to the same id as the target's and has the same special tokens;
- vocab: the draft's lm_head has as many rows as its config's vocab_size, and that equals the target's vocab_size
  (transformers' assisted generation otherwise demands an assistant tokenizer and vLLM refuses the pair);
- max_position_embeddings: the draft's context is at least the target's (a shorter one breaks long prompts);
- rope: the draft uses the target's kind of rope scaling (default, linear, dynamic, yarn, llama3, ...), so positions
  past the original context are handled alike (theta and factors may differ: the draft learnt its own);
- dtype: the draft's stored weights have the target's dtype (stacks load the pair in one dtype);
- generation_config: num_assistant_tokens (gamma) set, with a constant schedule and confidence threshold 0, so
  transformers drafts the measured gamma (its defaults draft up to 20 tokens and stop early on low confidence).
  A draft that names no gamma (no generation_config.json, or no num_assistant_tokens: any hub draft) is a warning
  with the fix, not a failure; the serving commands then use a GAMMA placeholder instead of claiming one.
- manifest (a folder with specdistill-manifest.json, as every export has, of every kind): each served file has the
  size and sha256 it was exported with (a corrupted download or copy fails here, before anything loads it);
- serve (`specdistill-check --serve`, decode/deploy/serve_check.py): vLLM loads the pair and its speculative greedy
  output equals its plain output (decode.serving.vllm_engine).
The target can be a local folder or a hub id (its config and tokenizer are read); the draft is a local folder.
The checks and commands are those of the draft's kind, handed in (``DeployingKind``; each kind's deploy.py): an
EAGLE-3 head or a DFlash folder gets its own checks and serving commands; this module holds the checks they share
and the report. The top floor finds the kind of a --draft folder (specdistill.drafts.check_deploy).
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Protocol

from decode.inputs.checks import (
    FileProblem,
    check_json_files_text,
    read_text,
    rope_type,
    safetensors_header,
    text_config,
)
from decode.inputs.loading import LoadError, first_line, load_failure
from decode.inputs.manifest import manifest_problems
from decode.inputs.vocab import TokenizerMismatchError, check_tokenizers_compatible, lm_head_rows

SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}
DEFAULT_GAMMA = 4  # shown in the commands when the draft's generation_config names none


@dataclass
class DeployReport:
    """What check_deploy found: ``problems`` maps a check to its one-line failure; ``gamma`` is the draft's
    generation_config.num_assistant_tokens (None when unset); ``kind`` is the name of the draft's kind, whose
    ``checks`` were run (kinds/<kind>/deploy.py)."""

    target: str
    draft: str
    gamma: int | None = None
    problems: dict[str, str] = field(default_factory=dict)
    kind: str = ""
    checks: tuple[str, ...] = ()
    warnings: dict[str, str] = field(default_factory=dict)   # a check that passes with advice (no gamma named)
    serve: dict | None = None                                # vLLM's result with --serve (decode.serving)

    @property
    def passed(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        """One line per check: ``ok   <check>``, ``WARN <check>: <advice>`` or ``FAIL <check>: <problem>``."""
        names = self.checks + (("serve",) if self.serve is not None or "serve" in self.problems else ())
        return [f"FAIL {name}: {self.problems[name]}" if name in self.problems else
                f"WARN {name}: {self.warnings[name]}" if name in self.warnings else f"ok   {name}" for name in names]

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed, "checks": list(self.checks)}


# ---------------------------------------------------------------------------------------------------------------
# Reading the two models without loading weights
# ---------------------------------------------------------------------------------------------------------------

def draft_tensors(draft_dir: Path) -> dict:
    """{tensor name: {"dtype", "shape", ...}} of the folder's *.safetensors files
    (decode.inputs.checks.safetensors_header); LoadError naming a file whose header cannot be read."""
    tensors: dict = {}
    try:
        for path in sorted(draft_dir.glob("*.safetensors")):
            tensors.update(safetensors_header(path).tensors)
    except FileProblem as err:
        raise LoadError(str(err)) from None
    return tensors


def load_target_config(target: str, trust_remote_code: bool = False):
    """The target's config; LoadError with one line when it cannot be read (the checks of a draft that lives on the
    target, which need no tokenizer of its own)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(target, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise LoadError(f"could not read the target {target!r}: {load_failure(target, err)}") from None


def load_target_parts(target: str, trust_remote_code: bool = False):
    """(config, tokenizer) of the target; LoadError with one line when either cannot be loaded."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(target, trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(target, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError) as err:
        raise LoadError(f"could not read the target {target!r}: {load_failure(target, err)}") from None
    return config, tokenizer


def config_dtype(config) -> str | None:
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return None if dtype is None else str(dtype).replace("torch.", "")


# ---------------------------------------------------------------------------------------------------------------
# The checks: each returns None (ok) or one line
# ---------------------------------------------------------------------------------------------------------------

def check_safetensors(draft_dir: Path, tensors: dict) -> str | None:
    if tensors:
        return None
    legacy = sorted(p.name for p in draft_dir.glob("*.bin"))
    found = f" (found {', '.join(legacy)})" if legacy else ""
    return (f"no *.safetensors weights in {draft_dir}{found}: vLLM and SGLang load safetensors; re-save with "
            "save_pretrained(..., safe_serialization=True)")


def check_tokenizer(target_tokenizer, draft_dir: Path) -> str | None:
    from transformers import AutoTokenizer

    try:
        draft_tokenizer = AutoTokenizer.from_pretrained(draft_dir)
    except (OSError, ValueError, TypeError) as err:
        return f"no loadable tokenizer in {draft_dir} ({first_line(err)}): save the target's tokenizer with the draft"
    try:
        check_tokenizers_compatible(target_tokenizer, draft_tokenizer)
    except TokenizerMismatchError as err:
        return str(err)
    return None


def check_vocab(target_config, draft_config, tensors: dict) -> str | None:
    target_vocab, draft_vocab = text_config(target_config).vocab_size, text_config(draft_config).vocab_size
    rows = lm_head_rows(tensors, bool(getattr(draft_config, "tie_word_embeddings", False)))
    if rows is not None and rows != draft_vocab:
        return f"the draft's lm_head has {rows} rows but its config says vocab_size={draft_vocab}"
    if draft_vocab != target_vocab:
        return (f"draft vocab_size={draft_vocab} but target vocab_size={target_vocab}: transformers' assisted "
                "generation and vLLM need equal lm_head rows; resize the draft's embeddings to "
                f"{target_vocab} (model.resize_token_embeddings({target_vocab})) and re-save")
    return None


def check_positions(target_config, draft_config) -> str | None:
    target_max = getattr(text_config(target_config), "max_position_embeddings", None)
    draft_max = getattr(text_config(draft_config), "max_position_embeddings", None)
    if target_max is not None and draft_max is not None and draft_max < target_max:
        return (f"draft max_position_embeddings={draft_max} < target's {target_max}: prompts longer than "
                f"{draft_max} tokens break or lose acceptance; set it to {target_max} in the draft's config.json")
    return None


def check_rope(target_config, draft_config) -> str | None:
    target_rope, draft_rope = rope_type(text_config(target_config)), rope_type(text_config(draft_config))
    if target_rope != draft_rope:
        return (f"draft rope scaling {draft_rope!r} but target's {target_rope!r}: positions past the original "
                "context are encoded differently; copy the target's rope settings into the draft's config")
    return None


def check_dtype(target_config, tensors: dict) -> str | None:
    target_dtype = config_dtype(text_config(target_config)) or config_dtype(target_config)
    stored = Counter(SAFETENSORS_DTYPES.get(t["dtype"], t["dtype"]) for t in tensors.values()
                     if t["dtype"] in SAFETENSORS_DTYPES)
    if not stored or target_dtype is None:
        return None
    draft_dtype = stored.most_common(1)[0][0]
    if draft_dtype != target_dtype:
        return (f"draft weights are stored in {draft_dtype} but the target's dtype is {target_dtype}: serving stacks "
                f"run the pair in one dtype; re-save the draft in {target_dtype} (model.to(torch.{target_dtype}))")
    return None


NO_GAMMA_FIX = ("measure gamma (specdistill-eval --gamma 2 4 6) and set num_assistant_tokens, "
                "num_assistant_tokens_schedule='constant', assistant_confidence_threshold=0.0 in its "
                "generation_config (or pass them as the commands below do)")


def check_generation_config(draft_dir: Path) -> tuple[str | None, str | None, int | None]:
    """(problem or None, warning or None, gamma or None) from the draft's generation_config.json. A draft that
    names no gamma (any hub draft) is a warning: transformers would draft up to 20 tokens with a threshold."""
    path = draft_dir / "generation_config.json"
    if not path.is_file():
        return None, f"no generation_config.json in {draft_dir}, so no gamma: {NO_GAMMA_FIX}", None
    config = json.loads(read_text(path))
    gamma = config.get("num_assistant_tokens")
    if gamma is None:
        return None, f"generation_config.json has no num_assistant_tokens (gamma): {NO_GAMMA_FIX}", None
    if not isinstance(gamma, int) or gamma < 1:
        return f"generation_config.json has num_assistant_tokens {gamma!r}; set an integer >= 1", None, None
    schedule = config.get("num_assistant_tokens_schedule", "constant")
    threshold = config.get("assistant_confidence_threshold", 0.4)
    if schedule != "constant" or threshold != 0:
        return (f"generation_config.json drafts gamma={gamma} with schedule {schedule!r} and confidence threshold "
                f"{threshold}: set 'constant' and 0.0 to draft the measured gamma", None, gamma)
    return None, None, gamma


# ---------------------------------------------------------------------------------------------------------------
# All checks, and the commands that serve the pair
# ---------------------------------------------------------------------------------------------------------------

class DeployingKind(Protocol):
    """What deployment asks of a draft's kind (kinds.base.Kind implements it)."""

    def deploy_check(self, target: str, draft: str | Path, trust_remote_code: bool = False) -> DeployReport:
        """The kind's checks of a served folder next to ``target``."""

    def serving_commands(self, report: DeployReport) -> str:
        """Copy-paste commands that serve the checked pair (decode.deploy.serving_commands writes each line)."""


def check_deploy(target: str, draft: str | Path, kind: DeployingKind, trust_remote_code: bool = False
                 ) -> DeployReport:
    """Run every check of the module docstring, those of the draft's ``kind``. Raises LoadError (one line) when the
    draft folder or its config, or the target's config or tokenizer, cannot be read, FileProblem when a JSON file of
    either folder is not text; every other finding is a problem in the report."""
    draft_dir = Path(draft)
    if not (draft_dir / "config.json").is_file():
        raise LoadError(f"draft {str(draft)!r} is not a model folder with a config.json (give the exported folder)")
    check_json_files_text(draft_dir, "draft")
    check_json_files_text(target, "target")
    report = kind.deploy_check(target, draft, trust_remote_code)
    return with_manifest_check(report, draft_dir)


def with_manifest_check(report: DeployReport, draft_dir: Path) -> DeployReport:
    """The report with the `manifest` check when the folder has specdistill's manifest (an export does): a problem
    naming the first served file whose bytes differ from what was exported (a corrupted download or copy)."""
    problems = manifest_problems(draft_dir)
    if problems is None:
        return report
    found = {"manifest": f"{problems[0]}{f' (and {len(problems) - 1} more)' if len(problems) > 1 else ''}; "
                         "download or copy the folder again"} if problems else {}
    return replace(report, checks=(*report.checks, "manifest"), problems={**report.problems, **found})
