"""The deployment checks of a standalone draft folder next to its target, and the commands that serve it
(transformers' assisted generation, vLLM's draft_model, SGLang's STANDALONE). The shared checks (safetensors,
tokenizer, vocab, context, rope, dtype, generation config) are decode/deploy/deploy_check.py's."""
from __future__ import annotations

from pathlib import Path

from decode.deploy.deploy_check import (
    DEFAULT_GAMMA,
    DeployReport,
    check_dtype,
    check_generation_config,
    check_positions,
    check_rope,
    check_safetensors,
    check_tokenizer,
    check_vocab,
    draft_tensors,
    load_target_parts,
)
from decode.deploy.serving_commands import in_double_quotes, sglang_launch, vllm_serve, vllm_speculative_config
from decode.inputs.loading import LoadError, first_line

CHECKS = ("safetensors", "tokenizer", "vocab", "max_position_embeddings", "rope", "dtype", "generation_config")


def check_model_deploy(target: str, draft: str | Path, trust_remote_code: bool = False) -> DeployReport:
    """CHECKS of a standalone draft model folder next to ``target``. Raises LoadError when either config or the
    target's tokenizer cannot be read."""
    from transformers import AutoConfig

    draft_dir = Path(draft)
    try:
        draft_config = AutoConfig.from_pretrained(draft_dir, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise LoadError(f"could not read the draft's config.json: {first_line(err)}") from None
    target_config, target_tokenizer = load_target_parts(target, trust_remote_code)
    tensors = draft_tensors(draft_dir)
    generation_problem, generation_warning, gamma = check_generation_config(draft_dir)
    found = {
        "safetensors": check_safetensors(draft_dir, tensors),
        "tokenizer": check_tokenizer(target_tokenizer, draft_dir),
        "vocab": check_vocab(target_config, draft_config, tensors),
        "max_position_embeddings": check_positions(target_config, draft_config),
        "rope": check_rope(target_config, draft_config),
        "dtype": check_dtype(target_config, tensors),
        "generation_config": generation_problem,
    }
    return DeployReport(target=str(target), draft=str(draft), gamma=gamma, kind="standalone", checks=CHECKS,
                        problems={name: line for name, line in found.items() if line},
                        warnings={"generation_config": generation_warning} if generation_warning else {})


def model_commands(report: DeployReport, method: str) -> str:
    """A standalone draft's commands: transformers, vLLM (speculative ``method``), SGLang."""
    target, draft = report.target, report.draft
    if report.gamma is not None:
        gamma, source = report.gamma, f"# gamma = {report.gamma}, from the draft's generation_config"
    else:  # a shell variable, set first
        gamma, source = "$GAMMA", (f"GAMMA={DEFAULT_GAMMA}  # the draft names no gamma: a placeholder; measure "
                                   "yours with specdistill-eval --gamma 2 4 6")
    spec = vllm_speculative_config(method, draft, gamma)
    return f"""{source}

# transformers (assisted generation, drafting exactly gamma tokens per step)
python -c "
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained({in_double_quotes(repr(target))})
target = AutoModelForCausalLM.from_pretrained({in_double_quotes(repr(target))}, dtype='auto', device_map='auto')
draft = AutoModelForCausalLM.from_pretrained({in_double_quotes(repr(draft))}, dtype='auto', device_map='auto')
draft.generation_config.update(num_assistant_tokens={gamma}, num_assistant_tokens_schedule='constant',
                               assistant_confidence_threshold=0.0)
inputs = tok.apply_chat_template([{{'role': 'user', 'content': 'Hello'}}], add_generation_prompt=True,
                                 return_tensors='pt', return_dict=True).to(target.device)
print(tok.decode(target.generate(**inputs, assistant_model=draft, max_new_tokens=64)[0]))"

# vLLM
{vllm_serve(target, spec, expand=report.gamma is None)}

# SGLang (a small draft model: the STANDALONE algorithm)
{sglang_launch(target, draft, "STANDALONE", gamma)}"""
