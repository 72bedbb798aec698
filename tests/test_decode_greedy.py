"""Greedy speculative decoding must reproduce the target's own greedy tokens exactly."""
import pytest
import torch

from decode import autoregressive_generate
from kinds.prompt_lookup.drafter import PromptLookupDrafter
from specdistill.drafts import speculative_generate

from tiny import ARCHITECTURES, perturbed_copy, save_and_load, tiny_model

PROMPT = torch.tensor([[1, 5, 7, 9, 11, 5, 7]])


def hf_greedy(target, ids, n):
    return target.generate(ids, do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
                           pad_token_id=0)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("draft_kind", ["same", "perturbed", "independent"])
def test_greedy_equals_both_references(arch, draft_kind, tmp_path):
    target = save_and_load(tiny_model(arch, seed=0), tmp_path / "target")
    draft = {"same": lambda: target,
             "perturbed": lambda: perturbed_copy(target, 0.15),
             "independent": lambda: tiny_model(arch, seed=7, hidden=32, layers=1)}[draft_kind]()
    base = autoregressive_generate(target, PROMPT, max_new_tokens=30)
    assert torch.equal(base.sequences, hf_greedy(target, PROMPT, 30))
    for gamma in (1, 3, 5):
        out = speculative_generate(target, draft, PROMPT, max_new_tokens=30, gamma=gamma)
        assert out.sequences.tolist() == base.sequences.tolist(), (arch, draft_kind, gamma)
        if draft_kind == "same":
            assert out.stats.draft_acceptance_rate == 1.0 and out.stats.acceptance_rate == 1.0


def test_partial_acceptance_really_is_partial():
    target = tiny_model("llama", seed=0)
    out = speculative_generate(target, perturbed_copy(target, 0.15), PROMPT, max_new_tokens=60, gamma=4)
    assert 0.05 < out.stats.draft_acceptance_rate < 0.95
    hist = out.stats.accepted_length_histogram
    assert sum(hist) == out.stats.target_calls and sum(hist[1:]) > 0 and hist[0] > 0


@pytest.mark.parametrize("gamma", [1, 2, 4])
def test_prompt_lookup_greedy_equality(gamma):
    target = tiny_model("qwen2", seed=3)
    base = autoregressive_generate(target, PROMPT, max_new_tokens=40)
    out = speculative_generate(target, PromptLookupDrafter(), PROMPT, max_new_tokens=40, gamma=gamma)
    assert out.sequences.tolist() == base.sequences.tolist()


@pytest.mark.parametrize("target_vocab,draft_vocab", [(104, 96), (96, 104)])
def test_padded_vocabularies_work_on_the_shared_ids(target_vocab, draft_vocab):
    target = tiny_model("llama", seed=0, vocab_size=target_vocab)
    draft = tiny_model("llama", seed=0, vocab_size=draft_vocab)
    base = autoregressive_generate(target, PROMPT, max_new_tokens=30)
    for temperature in (0.0, 1.0):
        out = speculative_generate(target, draft, PROMPT, max_new_tokens=30, gamma=3, temperature=temperature,
                                   generator=torch.Generator().manual_seed(0))
        assert out.sequences.shape == (1, PROMPT.shape[1] + 30)
        assert int(out.sequences.max()) < target_vocab
        if temperature == 0.0:
            assert out.sequences.tolist() == base.sequences.tolist()


@pytest.mark.parametrize("max_new", [1, 2, 3, 5, 8, 13])
def test_max_new_tokens_is_exact(max_new):
    target = tiny_model("llama", seed=0)
    for draft in (target, perturbed_copy(target, 0.15), PromptLookupDrafter()):
        for temperature in (0.0, 1.0):
            out = speculative_generate(target, draft, PROMPT, max_new_tokens=max_new, gamma=4,
                                       temperature=temperature, generator=torch.Generator().manual_seed(1))
            assert out.sequences.shape[1] == PROMPT.shape[1] + max_new


def test_eos_stops_at_the_same_place_as_plain_decoding():
    target = tiny_model("llama", seed=0)
    free = autoregressive_generate(target, PROMPT, max_new_tokens=30).new_tokens
    eos = free[11]  # the target's 12th greedy token; stop there (or earlier if it appears before)
    stop_at = free.index(eos) + 1
    base = autoregressive_generate(target, PROMPT, max_new_tokens=30, eos_token_id=eos)
    assert len(base.new_tokens) == stop_at
    for draft in (target, perturbed_copy(target, 0.15), PromptLookupDrafter()):
        out = speculative_generate(target, draft, PROMPT, max_new_tokens=30, gamma=4, eos_token_id=[eos, 999])
        assert out.new_tokens == free[:stop_at]
        assert out.sequences.tolist() == base.sequences.tolist()


def test_zero_new_tokens_and_one_token_prompt():
    target = tiny_model("llama", seed=0)
    assert speculative_generate(target, target, PROMPT, max_new_tokens=0).sequences.tolist() == PROMPT.tolist()
    one = PROMPT[:, :1]
    assert (speculative_generate(target, perturbed_copy(target, 0.15), one, max_new_tokens=10, gamma=3).sequences
            .tolist() == autoregressive_generate(target, one, max_new_tokens=10).sequences.tolist())
