"""Speculative sampling is lossless: its tokens are distributed exactly as the (warped) target's.

Tested by chi-square goodness of fit against distributions computed exactly from the target, for the first and
later tokens, with temperature, top-k and top-p; a deliberately wrong rule (always accept) must be rejected.
"""
import itertools

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

import decode.loop.speculative as spec
from decode.loop.sampling import SamplingConfig, probs_from_logits, warp_logits
from kinds import kind_of

from tiny import tiny_model

VOCAB = 8
CONFIGS = [SamplingConfig(1.0), SamplingConfig(0.8, top_k=5), SamplingConfig(1.3, top_p=0.85),
           SamplingConfig(0.9, top_k=6, top_p=0.9)]


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness-of-fit p-value; cells expecting < 5 are pooled."""
    n = counts.sum()
    expected = probs.double() * n
    small = expected < 5
    if small.any():
        counts = torch.cat([counts[~small], counts[small].sum().view(1)])
        expected = torch.cat([expected[~small], expected[small].sum().view(1)])
    if (expected == 0).any() and counts[expected == 0].sum() > 0:
        return 0.0  # a token outside the support was produced
    keep = expected > 0
    stat = ((counts[keep].double() - expected[keep]) ** 2 / expected[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))


def accept_always(target_logits, drafts, q, cfg, generator):
    """A wrong rule: keep every draft token, then a bonus from p. Its output follows q, not p."""
    k = drafts.numel()
    bonus = spec.draw(probs_from_logits(target_logits[k:], cfg), cfg, generator)
    return spec.Verdict(torch.tensor(k), torch.cat([drafts, bonus]), torch.ones(k))


# ---- the rule alone, on fixed distributions ----------------------------------------------------------------------
def first_token_counts(rule, cfg: SamplingConfig, trials: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(4, VOCAB, generator=g) * 1.5  # [k + 1, V]
    draft_logits = torch.randn(3, VOCAB, generator=g) * 1.5   # [k, V]
    q = probs_from_logits(draft_logits, cfg)
    counts = torch.zeros(VOCAB, dtype=torch.long)
    for _ in range(trials):
        drafts = torch.multinomial(q, 1, generator=g).squeeze(-1)
        step = spec.read_step(rule(target_logits, drafts, q, cfg, g))
        counts[int(drafts[0]) if step.num_accepted >= 1 else step.next_token] += 1
    return counts, probs_from_logits(target_logits[0], cfg)


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_acceptance_rule_reproduces_the_target_distribution(cfg):
    counts, p = first_token_counts(spec.accept_sampled, cfg, trials=6000)
    assert chi2_pvalue(counts, p) > 1e-4
    assert counts[p == 0].sum() == 0  # nothing outside the warped support


@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=str)
def test_negative_control_always_accept_is_rejected(cfg):
    counts, p = first_token_counts(accept_always, cfg, trials=2000)
    assert chi2_pvalue(counts, p) < 1e-6


def test_warping_matches_transformers_warpers():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g) * 3
    for cfg in [SamplingConfig(0.7, top_k=10), SamplingConfig(1.0, top_p=0.8), SamplingConfig(1.5, 7, 0.6)]:
        ref = TemperatureLogitsWarper(cfg.temperature)(None, logits.clone())
        if cfg.top_k:
            ref = TopKLogitsWarper(cfg.top_k)(None, ref)
        if cfg.top_p:
            ref = TopPLogitsWarper(cfg.top_p)(None, ref)
        ours = warp_logits(logits, cfg)
        assert torch.equal(torch.isinf(ours), torch.isinf(ref))
        torch.testing.assert_close(ours.softmax(-1), ref.softmax(-1))


# ---- end to end, on models ---------------------------------------------------------------------------------------
PROMPT = torch.tensor([[1, 3, 5]])


def exact_marginals(target, cfg: SamplingConfig):
    """Exact P(x1), P(x2), P(x3) and P(x1, x2) of the warped target after PROMPT, by enumeration."""
    def dist(prefix):
        with torch.no_grad():
            return probs_from_logits(target(torch.tensor([prefix])).logits[0, -1], cfg).double()
    base = PROMPT[0].tolist()
    p1 = dist(base)
    joint12 = torch.stack([p1[a] * dist(base + [a]) for a in range(VOCAB)])  # [V, V]
    p3 = torch.zeros(VOCAB, dtype=torch.float64)
    for a, b in itertools.product(range(VOCAB), repeat=2):
        if joint12[a, b] > 0:
            p3 += joint12[a, b] * dist(base + [a, b])
    return p1, joint12.sum(0), p3, joint12.flatten()


def sample_speculative(target, draft, cfg, runs, seed=0):
    g = torch.Generator().manual_seed(seed)
    samples = torch.zeros(runs, 3, dtype=torch.long)
    for i in range(runs):
        out = spec.speculative_generate(target, draft, PROMPT, max_new_tokens=3, gamma=2, generator=g,
                                        temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                                        kind=kind_of(draft))
        samples[i] = out.sequences[0, -3:]
    return samples


def lossless_pvalues(target, draft, cfg, runs: int = 1500) -> list[float]:
    """chi-square p-values of speculative samples against the target's exact marginals: the first, second and third
    token and the joint of the first two (any draft kind: the acceptance rule must make them the target's)."""
    p1, p2, p3, p12 = exact_marginals(target, cfg)
    s = sample_speculative(target, draft, cfg, runs=runs)
    return [chi2_pvalue(torch.bincount(observed, minlength=expected.numel()), expected)
            for observed, expected in [(s[:, 0], p1), (s[:, 1], p2), (s[:, 2], p3), (s[:, 0] * VOCAB + s[:, 1], p12)]]


def control_pvalues(target, draft, cfg, runs: int = 800) -> list[float]:
    """The first two tokens' p-values, for a negative control (the caller breaks the acceptance rule first)."""
    p1, p2, _, _ = exact_marginals(target, cfg)
    s = sample_speculative(target, draft, cfg, runs=runs)
    return [chi2_pvalue(torch.bincount(s[:, j], minlength=VOCAB), p) for j, p in enumerate([p1, p2])]


def models():
    target = tiny_model("llama", seed=0, vocab_size=VOCAB)
    draft = tiny_model("llama", seed=5, vocab_size=VOCAB, layers=1)  # a different model: real rejections
    return target, draft


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[3]], ids=str)
def test_speculative_sampling_is_lossless_for_first_and_later_tokens(cfg):
    target, draft = models()
    p1, p2, p3, p12 = exact_marginals(target, cfg)
    s = sample_speculative(target, draft, cfg, runs=1500)
    for observed, expected in [(s[:, 0], p1), (s[:, 1], p2), (s[:, 2], p3), (s[:, 0] * VOCAB + s[:, 1], p12)]:
        counts = torch.bincount(observed, minlength=expected.numel())
        assert chi2_pvalue(counts, expected) > 1e-4  # 8 checks; fixed seeds make the test deterministic


def test_end_to_end_negative_control(monkeypatch):
    target, draft = models()
    cfg = CONFIGS[0]
    p1, p2, _, _ = exact_marginals(target, cfg)
    monkeypatch.setattr(spec, "accept_sampled", accept_always)
    s = sample_speculative(target, draft, cfg, runs=800)
    pvalues = [chi2_pvalue(torch.bincount(s[:, j], minlength=VOCAB), p) for j, p in enumerate([p1, p2])]
    assert min(pvalues) < 1e-6


# ---- drawing one token: the inverse CDF ---------------------------------------------------------------------------
def test_draw_follows_each_row_and_never_a_zero():
    """draw() on several rows at once, unnormalised, with zeros inside and at both ends: chi-square per row."""
    g = torch.Generator().manual_seed(3)
    rows = torch.tensor([[0.0, 3.0, 0.0, 1.0, 0.5, 0.0, 2.0, 0.0],     # zeros at both ends and inside
                         [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
                         [1e-3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0]])   # a token of 1/5000 of the mass
    draws = torch.stack([spec.draw(rows, CONFIGS[0], g) for _ in range(20000)])  # [N, 3]
    for r in range(rows.shape[0]):
        counts = torch.bincount(draws[:, r], minlength=VOCAB)
        assert chi2_pvalue(counts, rows[r] / rows[r].sum()) > 1e-4
        assert counts[rows[r] == 0].sum() == 0


def test_draw_negative_control_detects_a_shifted_sampler():
    """The same check on a sampler off by one token's worth of mass: the chi-square above can fail."""
    g = torch.Generator().manual_seed(3)
    row = torch.tensor([[0.5, 3.0, 0.0, 1.0, 0.5, 0.0, 2.0, 1.0]])
    shifted = torch.tensor([[0.5, 2.5, 0.5, 1.0, 0.5, 0.0, 2.0, 1.0]])  # 1/17 of the mass moved to token 2
    counts = torch.bincount(torch.cat([spec.draw(shifted, CONFIGS[0], g) for _ in range(20000)]), minlength=VOCAB)
    assert chi2_pvalue(counts, row[0] / row.sum()) < 1e-6


def test_inverse_cdf_at_the_ends_of_the_unit_interval():
    """u = 0 gives the first token of positive mass; u just below 1 the last one, never a trailing zero."""
    from decode.loop.sampling import inverse_cdf
    probs = torch.tensor([[0.0, 0.0, 0.25, 0.5, 0.25, 0.0], [0.3, 0.0, 0.0, 0.0, 0.7, 0.0]])
    top = torch.nextafter(torch.tensor(1.0), torch.tensor(0.0))  # the largest float32 below 1
    assert inverse_cdf(probs, torch.zeros(2)).tolist() == [2, 0]
    assert inverse_cdf(probs, top.expand(2)).tolist() == [4, 4]
    assert inverse_cdf(probs, torch.tensor([0.25, 0.3])).tolist() == [3, 4]  # the boundary belongs to the next token
    assert inverse_cdf(probs, torch.ones(2)).tolist() == [4, 4]  # u * total rounded up to the total: still no zero
    # a 49152-token row whose mass is all in its first and last positive tokens
    wide = torch.zeros(1, 49152)
    wide[0, 7], wide[0, 49150] = 1e-8, 1.0
    assert inverse_cdf(wide, top.view(1)).tolist() == [49150]
    assert inverse_cdf(wide, torch.zeros(1)).tolist() == [7]
    assert inverse_cdf(probs[0], torch.tensor(0.3)).tolist() == 3  # one row without a batch dimension
    assert spec.draw(probs[1], CONFIGS[0], torch.Generator().manual_seed(0)).tolist() in (0, 4)


def test_greedy_draw_consumes_no_randomness():
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    assert spec.draw(torch.tensor([[0.1, 0.7, 0.2]]), SamplingConfig(0.0), g).tolist() == [1]
    assert torch.equal(g.get_state(), state)


def test_bench_sampling_times_both_draws_and_restores_the_decoders():
    """scripts/bench_sampling.py swaps decode.loop.sampling.draw for each timing; the decoder's draw is back after."""
    from decode.loop import sampling
    from scripts import bench_sampling
    decoders_draw = sampling.draw
    seconds = bench_sampling.measure(tiny_model("llama", seed=0, vocab_size=VOCAB), rows=3, new_tokens=4, repeats=1)
    assert set(seconds) == {"torch.multinomial", "inverse CDF (draw)"} and all(s > 0 for s in seconds.values())
    assert sampling.draw is decoders_draw
