"""Decoding with an EAGLE-3 head (kinds/eagle3/drafter.py): lossless, and the head's cache is what a fresh pass gives.

Targets are tiny Llama and Qwen2 models; heads are random or trained here for a few dozen teacher-forced steps
(cross-entropy on the target's argmax), which gives partial acceptance, so rollbacks of both caches happen.
"""
import pytest
import test_decode_sampling as sampling
import torch
import torch.nn.functional as F

import decode.loop.speculative as spec
from decode import autoregressive_generate
from decode.loop.sampling import SamplingConfig
from kinds.eagle3.drafter import HeadDrafter
from kinds.eagle3.model import Eagle3Head, head_config, target_aux_hidden
from specdistill.drafts import speculative_generate

from tiny import tiny_model

PROMPT = torch.tensor([[1, 5, 7, 9, 11, 5, 7]])
ARCHS = ("llama", "qwen2")


def new_head(target: torch.nn.Module, seed: int = 1, **config) -> Eagle3Head:
    torch.manual_seed(seed)
    return Eagle3Head(head_config(target.config, **config)).bind_embeddings(target.get_input_embeddings())


def train_head(target: torch.nn.Module, head: Eagle3Head, steps: int = 60, seed: int = 0) -> Eagle3Head:
    """Teacher-forced CE on random token sequences: head position t reads (x_{t+1}, h_t) and learns the target's
    argmax after x_{t+1} (tokens outside the draft vocabulary are not learnt)."""
    g = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
    vocab, t2d = target.config.vocab_size, head.t2d
    draft_id = torch.cumsum(t2d.long(), 0) - 1  # target id -> draft id (where t2d)
    for _ in range(steps):
        x = torch.randint(3, vocab, (8, 24), generator=g)
        with torch.no_grad():
            out = target(x, output_hidden_states=True)
            aux = target_aux_hidden(out.hidden_states, head.aux_layers)  # [B, T, 3H]
            labels = out.logits[:, 1:].argmax(-1)  # [B, T - 1]: the argmax after x_{t+1}
        positions = torch.arange(x.shape[1] - 1).expand(x.shape[0], -1)
        logits, _ = head(x[:, 1:], head.fuse(aux[:, :-1]), positions)  # [B, T - 1, V_draft]
        keep = t2d[labels]
        loss = F.cross_entropy(logits[keep], draft_id[labels[keep]])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval()


@pytest.fixture(scope="module", params=[("llama", 1), ("qwen2", 1), ("llama", 2)],
                ids=["llama", "qwen2", "llama-2-layers"])
def trained(request):
    """A head trained on a tiny target: one decoder layer on Llama and Qwen2, two on Llama (model.head_layers)."""
    arch, layers = request.param
    target = tiny_model(arch, seed=0, layers=4)
    return target, train_head(target, new_head(target, num_layers=layers))


def test_a_deeper_heads_later_layers_are_llama_decoder_layers():
    """Layer i >= 1 of a head is transformers' LlamaDecoderLayer on layer i - 1's output (vLLM's llama_eagle3: the
    residual added before its input norm), and the final norm reads the last: the head's output, from the head's own
    first layer and transformers' decoder layers."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    target = tiny_model("llama", seed=0, layers=4)
    deep = new_head(target, seed=2, num_layers=3)
    shallow = Eagle3Head(head_config(target.config, num_layers=1)).bind_embeddings(target.get_input_embeddings())
    shallow.load_state_dict({k: v for k, v in deep.state_dict().items() if not k.startswith("layers.")})
    ids = torch.tensor([[1, 5, 7, 9, 11, 13]])
    with torch.no_grad():
        aux = target_aux_hidden(target(ids, output_hidden_states=True).hidden_states, deep.aux_layers)
        hidden, positions = deep.fuse(aux[:, :-1]), torch.arange(5).view(1, -1)
        _, stream = shallow(ids[:, 1:], hidden, positions)  # layer 0's output
        rope = deep.rotary(stream, positions)
        causal = torch.full((5, 5), float("-inf")).triu(1).view(1, 1, 5, 5)  # additive: 0 where s <= t
        config = head_config(target.config, num_layers=3)
        config._attn_implementation = "eager"
        for index in (1, 2):
            layer = LlamaDecoderLayer(config, layer_idx=index)
            layer.load_state_dict(deep.layer(index).state_dict())
            stream = layer(stream, attention_mask=causal, position_ids=positions, position_embeddings=rope)
            stream = stream[0] if isinstance(stream, tuple) else stream
        expected = deep.logits(deep.norm(stream))
        got, prenorm = deep(ids[:, 1:], hidden, positions)
    torch.testing.assert_close(prenorm, stream, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert sorted({name.split(".")[1] for name in deep.state_for_export() if name.startswith("layers.")}) == ["1", "2"]


# ---- greedy: the target's own output ------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_random_head_greedy_equals_plain_decoding(arch):
    target = tiny_model(arch, seed=0, layers=4)
    head = new_head(target)
    plain = autoregressive_generate(target, PROMPT, max_new_tokens=30)
    for gamma in (1, 3, "auto"):
        out = speculative_generate(target, head, PROMPT, max_new_tokens=30, gamma=gamma)
        assert out.sequences.tolist() == plain.sequences.tolist()


def test_trained_head_greedy_equals_plain_decoding_with_rollbacks(trained):
    target, head = trained
    for prompt in (PROMPT, PROMPT[:, :1], torch.tensor([[1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 2, 9]])):
        plain = autoregressive_generate(target, prompt, max_new_tokens=40)
        for gamma in (2, 4):
            out = speculative_generate(target, head, prompt, max_new_tokens=40, gamma=gamma)
            assert out.sequences.tolist() == plain.sequences.tolist()
    stats = speculative_generate(target, head, PROMPT, max_new_tokens=40, gamma=4).stats
    assert 0 < stats.accepted_tokens < stats.drafted_tokens  # partial acceptance: rollbacks happened


# ---- the head's cache after rollbacks equals a fresh pass ---------------------------------------------------------
def reference_proposal(target, head, history: list[int], gamma: int) -> list[int]:
    """Greedy drafts after `history` computed without any cache: Eagle3Head.forward over the whole sequence, the
    target-feature positions 0..M-1 then the drafted ones (own prenorm fed back), re-run from scratch per token."""
    ids = torch.tensor([history])
    with torch.no_grad():
        aux = target_aux_hidden(target(ids[:, :-1], output_hidden_states=True).hidden_states, head.aux_layers)
        tokens, hidden = ids[:, 1:], head.fuse(aux)  # positions p = (x_{p+1}, h_p), p = 0..M-1
        drafts = []
        for _ in range(gamma):
            positions = torch.arange(tokens.shape[1]).view(1, -1)
            logits, prenorm = head(tokens, hidden, positions)
            token = head.to_target_vocab(logits[:, -1]).argmax(-1)  # [1]
            drafts.append(int(token))
            tokens = torch.cat([tokens, token.view(1, 1)], dim=1)
            hidden = torch.cat([hidden, prenorm[:, -1:]], dim=1)
    return drafts


def record_proposals(monkeypatch) -> list:
    """(history, drafted tokens) of every HeadDrafter.propose call made while the test runs."""
    seen = []
    original = HeadDrafter.propose
    # the committed ids on the host, which the decoder hands only to a drafter that asks (decode.loop.drafters)
    monkeypatch.setattr(HeadDrafter, "host_history", True, raising=False)

    def recording(self, history, cur, gamma, cfg, generator):
        drafts, q = original(self, history, cur, gamma, cfg, generator)
        seen.append((list(history), drafts.tolist()))
        return drafts, q

    monkeypatch.setattr(HeadDrafter, "propose", recording)
    return seen


def test_head_cache_after_rollback_equals_a_fresh_recompute(trained, monkeypatch):
    target, head = trained
    seen = record_proposals(monkeypatch)
    out = speculative_generate(target, head, PROMPT, max_new_tokens=30, gamma=3)
    assert out.stats.accepted_tokens < out.stats.drafted_tokens  # some steps rolled the head's cache back
    assert len(seen) == out.stats.target_calls
    for history, drafts in seen:
        assert drafts == reference_proposal(target, head, history, len(drafts))


# ---- sampling: lossless (chi-square), and the negative control fails -----------------------------------------------
def sampling_pair(draft_vocab_size: int | None = None):
    target = tiny_model("llama", seed=0, vocab_size=sampling.VOCAB, layers=4)
    head = new_head(target, seed=3, draft_vocab_size=draft_vocab_size)
    if draft_vocab_size:
        head.set_vocab(torch.tensor([0, 2, 3, 5, 6][:draft_vocab_size]))
    with torch.no_grad():
        head.lm_head.weight.mul_(4.0)  # sharper q: real rejections and a visible negative control
    return target, head


@pytest.mark.parametrize("draft_vocab_size", [pytest.param(None, marks=pytest.mark.integration), 5],
                         ids=["full-vocab", "draft-vocab-5"])
def test_head_sampling_is_lossless(draft_vocab_size):
    target, head = sampling_pair(draft_vocab_size)
    cfg = sampling.CONFIGS[0]
    p1, p2, p3, p12 = sampling.exact_marginals(target, cfg)
    s = sampling.sample_speculative(target, head, cfg, runs=1500)
    for observed, expected in [(s[:, 0], p1), (s[:, 1], p2), (s[:, 2], p3), (s[:, 0] * sampling.VOCAB + s[:, 1], p12)]:
        counts = torch.bincount(observed, minlength=expected.numel())
        assert sampling.chi2_pvalue(counts, expected) > 1e-4


def test_head_sampling_negative_control(monkeypatch):
    target, head = sampling_pair(5)
    cfg = sampling.CONFIGS[0]
    p1, p2, _, _ = sampling.exact_marginals(target, cfg)
    monkeypatch.setattr(spec, "accept_sampled", sampling.accept_always)
    s = sampling.sample_speculative(target, head, cfg, runs=800)
    pvalues = [sampling.chi2_pvalue(torch.bincount(s[:, j], minlength=sampling.VOCAB), p)
               for j, p in enumerate([p1, p2])]
    assert min(pvalues) < 1e-6


def test_q_is_zero_outside_the_draft_vocabulary():
    target, head = sampling_pair(5)
    drafter = HeadDrafter(head)
    spec.prefill(spec.cached_lm(target, False, "target", 64, (3,), drafter.aux_layers), drafter, PROMPT.clamp_max(7))
    drafts, q = drafter.propose(PROMPT.clamp_max(7)[0].tolist(), PROMPT[:, -1:].clamp_max(7), 3,
                                SamplingConfig(1.0), torch.Generator().manual_seed(0))
    outside = ~head.t2d
    assert q.shape == (3, sampling.VOCAB) and torch.all(q[:, outside] == 0)
    torch.testing.assert_close(q.sum(-1), torch.ones(3))
    assert head.t2d[drafts].all()


# ---- a smaller draft vocabulary (non-trivial d2t) stays lossless for greedy decoding --------------------------------
def test_draft_vocabulary_head_greedy_equals_plain(trained):
    target, _ = trained
    vocab = target.config.vocab_size
    head = new_head(target, draft_vocab_size=vocab // 2)
    head.set_vocab(torch.arange(0, vocab, 2))  # every other token: d2t[i] = i
    head = train_head(target, head, steps=40)
    plain = autoregressive_generate(target, PROMPT, max_new_tokens=40)
    out = speculative_generate(target, head, PROMPT, max_new_tokens=40, gamma=3)
    assert out.sequences.tolist() == plain.sequences.tolist()
    assert out.stats.accepted_tokens > 0


# ---- export -> reload -> the same logits and the same decoding ------------------------------------------------------
def test_export_reload_gives_the_same_logits(trained, tmp_path):
    target, head = trained
    head.save_pretrained(tmp_path / "head")
    loaded = Eagle3Head.from_pretrained(tmp_path / "head", target.get_input_embeddings())
    ids = torch.tensor([[1, 5, 7, 9, 11, 13]])
    with torch.no_grad():
        aux = target_aux_hidden(target(ids, output_hidden_states=True).hidden_states, head.aux_layers)
        positions = torch.arange(5).view(1, -1)
        expected, _ = head(ids[:, 1:], head.fuse(aux[:, :-1]), positions)
        got, _ = loaded(ids[:, 1:], loaded.fuse(aux[:, :-1]), positions)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    a = speculative_generate(target, head, PROMPT, max_new_tokens=20, gamma=3)
    b = speculative_generate(target, loaded, PROMPT, max_new_tokens=20, gamma=3)
    assert a.sequences.tolist() == b.sequences.tolist() and a.stats.to_dict() == b.stats.to_dict()


def test_export_layout_vllm_loads(tmp_path):
    """vLLM 0.32 refuses d2t in a whole-vocabulary head (it has no parameter for it) and keeps one hidden state per
    distinct aux layer id, in layer order: the export and the default ids follow that."""
    from safetensors.torch import load_file

    from kinds.eagle3.model import default_aux_layers

    assert default_aux_layers(6) == [2, 3, 4] and default_aux_layers(32) == [2, 16, 29]
    assert all(len(set(default_aux_layers(n))) == min(n, 3) for n in range(1, 40))
    target = tiny_model("llama", seed=0, layers=6)
    with pytest.raises(ValueError, match="distinct and ascending"):
        head_config(target.config, aux_layers=[4, 2, 3])
    new_head(target).save_pretrained(tmp_path / "full")
    assert not {"d2t", "t2d"} & set(load_file(tmp_path / "full" / "model.safetensors"))
    small = new_head(target, draft_vocab_size=10)
    small.set_vocab(torch.arange(10) * 3)
    small.save_pretrained(tmp_path / "small")
    assert "d2t" in load_file(tmp_path / "small" / "model.safetensors")
    loaded = Eagle3Head.from_pretrained(tmp_path / "small")
    assert torch.equal(loaded.target_ids, torch.arange(10) * 3) and torch.equal(loaded.t2d, small.t2d)


# ---- the compiled path (static head cache, compiled steps; aot_eager as in tests/test_decode_compile.py) -----------
@pytest.fixture()
def aot_eager(monkeypatch):
    import decode.loop.static as static

    torch._dynamo.reset()
    monkeypatch.setattr(static, "BACKEND", "aot_eager")
    yield
    torch._dynamo.reset()


def test_compiled_trained_head_is_lossless_and_matches_the_reference(trained, aot_eager, monkeypatch):
    """Greedy rounds at gamma 3 run as one compiled chain (HeadCache.chain); every proposal, chained or padded,
    equals the step-by-step reference's."""
    from kinds.eagle3.drafter import HeadCache

    monkeypatch.setattr(HeadDrafter, "chained", True)  # as on a GPU
    target, head = trained
    plain = autoregressive_generate(target, PROMPT, max_new_tokens=30)
    seen = record_proposals(monkeypatch)
    chained, chain = [], HeadCache.chain

    def counted(self, tokens, hidden, steps):
        drafts = chain(self, tokens, hidden, steps)
        chained.append(drafts is not None)
        return drafts

    monkeypatch.setattr(HeadCache, "chain", counted)
    for prompt in (PROMPT, PROMPT[:, :1]):
        out = speculative_generate(target, head, prompt, max_new_tokens=30, gamma=3, compile=True)
        assert out.sequences.tolist() == autoregressive_generate(target, prompt, max_new_tokens=30).sequences.tolist()
    out = speculative_generate(target, head, PROMPT, max_new_tokens=30, gamma=3, compile=True)
    assert out.sequences.tolist() == plain.sequences.tolist()
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens
    assert len(seen) > 10
    # every gamma-3 round was one call but each generation's first (a pass over the whole prompt: stepped)
    assert sum(chained) > 10 and chained.count(False) <= 3
    for history, drafts in seen:  # padded first passes and stale slots never change a proposal
        if drafts:  # (a one-token prompt's first step has no target feature to draft from)
            assert drafts == reference_proposal(target, head, history, len(drafts))


@pytest.mark.integration
@pytest.mark.parametrize("arch", ARCHS)
def test_compiled_random_head_greedy_equals_plain_decoding(arch, aot_eager):
    target = tiny_model(arch, seed=0, layers=4)
    head = new_head(target)
    plain = autoregressive_generate(target, PROMPT, max_new_tokens=24)
    out = speculative_generate(target, head, PROMPT, max_new_tokens=24, gamma=2, compile=True)
    assert out.sequences.tolist() == plain.sequences.tolist()


def test_head_compile_failure_falls_back_to_eager_with_a_warning(monkeypatch):
    import decode.loop.static as static

    def broken_backend(graph, example_inputs):
        raise RuntimeError("this backend cannot compile anything")

    monkeypatch.setattr(static, "BACKEND", broken_backend)
    target = tiny_model("qwen2", seed=4, layers=4)
    head = new_head(target)
    plain = autoregressive_generate(target, PROMPT, max_new_tokens=12)
    with pytest.warns(RuntimeWarning, match="torch.compile failed for the EAGLE-3 head"):
        out = speculative_generate(target, head, PROMPT, max_new_tokens=12, gamma=2, compile=True)
    assert out.sequences.tolist() == plain.sequences.tolist()


def test_a_compiled_head_chains_its_greedy_rounds_on_a_gpu_only(aot_eager):
    """HeadDrafter.chained None (the default): chained rounds where the head is on CUDA; True / False force it."""
    from kinds.eagle3.drafter import bound_head

    target = tiny_model("llama", seed=0, layers=4)
    head = bound_head(new_head(target), target)
    for chained, compile, expected in [(None, True, False), (True, True, True), (True, False, False)]:
        drafter = HeadDrafter(head, compile=compile, max_gamma=3)
        drafter.chained = chained
        drafter.start(PROMPT, target.config.vocab_size)
        assert drafter.chain_rounds is expected, (chained, compile)


@pytest.mark.integration
def test_compiled_head_sampling_is_lossless(aot_eager, monkeypatch):
    """Sampled rounds never take the greedy chain, chained or not."""
    monkeypatch.setattr(HeadDrafter, "chained", True)
    target, head = sampling_pair(5)
    cfg = sampling.CONFIGS[3]
    p1, p2, p3, _ = sampling.exact_marginals(target, cfg)
    g = torch.Generator().manual_seed(0)
    s = torch.stack([speculative_generate(target, head, sampling.PROMPT, max_new_tokens=3, gamma=2, generator=g,
                                          temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                                          compile=True).sequences[0, -3:] for _ in range(1200)])
    for observed, expected in [(s[:, 0], p1), (s[:, 1], p2), (s[:, 2], p3)]:
        assert sampling.chi2_pvalue(torch.bincount(observed, minlength=sampling.VOCAB), expected) > 1e-4
