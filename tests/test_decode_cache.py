"""KV caches are kept across steps and rolled back after a rejection; nothing is re-prefilled."""
import inspect
import warnings

import torch
from peft import LoraConfig, get_peft_model

from decode.loop.batched import batched_generate
from decode.loop.cache import CachedLM, cache_keyword
from decode.loop.sampling import SamplingConfig
from decode.loop.static import StaticLM
from kinds.prompt_lookup.drafter import PromptLookupDrafter
from kinds.standalone.drafter import ModelDrafter

from tiny import tiny_model

GREEDY = SamplingConfig()


def full_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def test_rollback_then_extend_equals_a_fresh_forward():
    model = tiny_model("llama", seed=0)
    lm = CachedLM(model)
    lm.forward(torch.tensor([[1, 5, 7]]))
    lm.forward(torch.tensor([[20, 21, 22, 23]]))
    lm.rollback(3)  # keep 20
    assert lm.length == 4 and lm.cache.get_seq_length() == 4
    logits = lm.forward(torch.tensor([[30, 31]]))
    torch.testing.assert_close(logits, full_logits(model, [1, 5, 7, 20, 30, 31])[-2:], rtol=1e-4, atol=1e-4)


def greedy_continuation(model, ids, n):
    ids = list(ids)
    out = []
    for _ in range(n):
        out.append(int(full_logits(model, ids)[-1].argmax()))
        ids.append(out[-1])
    return out


def test_model_drafter_stays_consistent_for_every_acceptance_pattern():
    """Scripted accept counts (including a fully accepted block, which leaves d_k unfed) keep the draft's cache
    equal to the committed sequence: its next proposal equals a from-scratch greedy continuation."""
    model = tiny_model("llama", seed=0)
    drafter = ModelDrafter(model)
    committed = [1, 5, 7, 9]
    drafter.start(torch.tensor([committed[:-1]]), target_vocab_size=model.config.vocab_size)
    for accepted in [3, 0, 1, 3, 3, 2, 0, 0]:
        cur = torch.tensor([[committed[-1]]])
        proposal, q = drafter.propose(committed, cur, 3, GREEDY, None)
        assert q is None
        assert proposal.tolist() == greedy_continuation(model, committed, 3)
        drafter.commit(accepted)
        committed += proposal[:accepted].tolist() + [(committed[-1] * 7 + accepted) % 90 + 3]  # "the target's token"
    assert drafter.lm.length + len(drafter.pending) == len(committed) - 1


def test_model_drafter_with_zero_gamma_keeps_cur_pending():
    model = tiny_model("llama", seed=0)
    drafter = ModelDrafter(model)
    drafter.start(torch.tensor([[1, 5]]), model.config.vocab_size)
    drafter.propose([1, 5, 7], torch.tensor([[7]]), 0, GREEDY, None)
    drafter.commit(0)
    proposal, _ = drafter.propose([1, 5, 7, 9], torch.tensor([[9]]), 2, GREEDY, None)
    assert proposal.tolist() == greedy_continuation(model, [1, 5, 7, 9], 2)


def test_prompt_lookup_finds_the_most_recent_longest_match():
    d = PromptLookupDrafter(max_ngram_size=3)
    #           0  1  2  3  4  5  6  7  8  9
    history = [4, 5, 6, 7, 8, 4, 5, 6, 9, 4, 5, 6]
    assert d.lookup(history, 2) == [9, 4]  # "4 5 6" most recently followed by 9
    assert d.lookup([1, 2, 3], 4) == []
    assert d.lookup([3, 1, 2, 3], 3) == [1, 2, 3]  # a 1-gram match when nothing longer matches


class PastKeyValuesLM(torch.nn.Module):
    """A causal LM on the pre-5.24 transformers convention: forward takes its cache as ``past_key_values`` only
    (no ``cache`` keyword, no **kwargs), as a remote-code model or transformers < 5.24 does."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.config = model, model.config

    def forward(self, input_ids, past_key_values=None, use_cache=True, logits_to_keep=0, output_hidden_states=False,
                attention_mask=None, position_ids=None):
        name = cache_keyword(self.inner)
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=use_cache, logits_to_keep=logits_to_keep,
                          output_hidden_states=output_hidden_states, **{name: past_key_values})


def test_cache_keyword_follows_the_models_own_signature():
    model = tiny_model("llama", seed=0)
    newer = "cache" in inspect.signature(type(model).forward).parameters  # transformers >= 5.24
    assert cache_keyword(model) == ("cache" if newer else "past_key_values")
    assert cache_keyword(PastKeyValuesLM(model)) == "past_key_values"
    lora = get_peft_model(tiny_model("llama", seed=0), LoraConfig(r=2, target_modules=["q_proj"]))
    assert cache_keyword(lora) == cache_keyword(model)  # looked through the peft wrapper


def test_decoders_pass_the_cache_by_the_name_the_model_takes():
    """Either convention gives the same logits as a full forward, with no deprecation warning (a FutureWarning on
    transformers 5.24-5.39, an error from 5.40 if the old name were passed to a new model)."""
    model = tiny_model("llama", seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        for lm_model in (model, PastKeyValuesLM(model)):
            for lm in (CachedLM(lm_model), StaticLM(lm_model, "target", capacity=16, lengths=())):  # eager + static
                lm.forward(torch.tensor([[1, 5, 7]]))
                lm.forward(torch.tensor([[20, 21]]))
                torch.testing.assert_close(lm.forward(torch.tensor([[30]])),
                                           full_logits(model, [1, 5, 7, 20, 21, 30])[-1:], rtol=1e-4, atol=1e-4)
            rows = batched_generate(lm_model, [[1, 5, 7], [9]], max_new_tokens=4, sampling=GREEDY, seeds=[0, 1],
                                    pad_token_id=0, eos_token_id=None, vocab_size=model.config.vocab_size)
            assert rows == [greedy_continuation(model, [1, 5, 7], 4), greedy_continuation(model, [9], 4)]
