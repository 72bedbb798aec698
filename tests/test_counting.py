"""Counts behind mean_accepted_tokens stop at eos, and evaluate_acceptance leaves the draft's settings alone."""
import torch

from decode import autoregressive_generate
from decode.measure.settings import EvalSettings
from specdistill.drafts import evaluate_acceptance, speculative_generate

from tiny import tiny_model

PROMPT = torch.tensor([[1, 5, 7, 9, 11, 5, 7]])


def test_tokens_after_eos_are_not_counted():
    target = tiny_model("llama", seed=0)
    free = autoregressive_generate(target, PROMPT, max_new_tokens=30).new_tokens
    eos = free[1]  # the second greedy token: the first step (draft = target, gamma 4) produces 5 tokens, cut at 2
    stop_at = free.index(eos) + 1
    out = speculative_generate(target, target, PROMPT, max_new_tokens=30, gamma=4, eos_token_id=eos)
    assert out.new_tokens == free[:stop_at]
    assert out.stats.target_calls == 1
    assert out.stats.new_tokens == stop_at
    assert out.stats.mean_accepted_tokens == stop_at


def test_new_tokens_counted_equal_tokens_returned_with_eos():
    target = tiny_model("llama", seed=0)
    draft = tiny_model("llama", seed=3, hidden=32, layers=1)
    free = autoregressive_generate(target, PROMPT, max_new_tokens=40).new_tokens
    for eos in set(free[:20]):
        for temperature in (0.0, 1.0):
            out = speculative_generate(target, draft, PROMPT, max_new_tokens=40, gamma=4, eos_token_id=eos,
                                       temperature=temperature, generator=torch.Generator().manual_seed(0))
            assert out.stats.new_tokens == len(out.new_tokens), (eos, temperature)


def test_evaluate_acceptance_restores_the_draft_generation_config():
    target, draft = tiny_model("llama", seed=0), tiny_model("llama", seed=2, layers=1)
    draft.generation_config.num_assistant_tokens = 7
    draft.generation_config.num_assistant_tokens_schedule = "heuristic"
    draft.generation_config.assistant_confidence_threshold = 0.25
    before = draft.generation_config.to_dict()
    settings = EvalSettings(gammas=[2], max_new_tokens=6, compare_hf=True, warmup=False)
    evaluate_acceptance(target, draft, [PROMPT[0]], settings, progress=False)
    assert draft.generation_config.to_dict() == before
