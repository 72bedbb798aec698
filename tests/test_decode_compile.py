"""The compiled, static-cache decode path (decode.loop.static) and gamma="auto" (decode.loop.auto_gamma).

The two chi-square sampling tests and the inductor test are marked integration (they still run in `make test`).

The decode logic (static caches, rollback by position, padded steps, the compiled-step registry, no recompiles) is
tested with torch.compile's "aot_eager" backend: dynamo traces and guards exactly as with inductor, without the
C++ code generation that costs ~25 s per shape on this CPU. One integration test runs inductor itself.
"""
import json
import warnings

import pytest
import test_decode_sampling as sampling
import torch
from test_eval_cli import pair, run_cli  # noqa: F401 - the tiny saved pair (a module fixture) and the CLI runner
from torch._dynamo.utils import counters

import decode.loop.speculative as spec
import decode.loop.static as static
import decode.measure.evaluate as evaluate
from decode import autoregressive_generate
from decode.loop.auto_gamma import AUTO_GAMMAS, GammaChooser, best_gamma, expected_tokens
from decode.loop.static import StaticLM
from decode.measure.settings import EvalSettings
from kinds import kind_of
from kinds.prompt_lookup.drafter import PromptLookupDrafter
from specdistill.drafts import evaluate_acceptance, speculative_generate

from tiny import ARCHITECTURES, perturbed_copy, tiny_model

PROMPT = torch.tensor([[1, 5, 7, 9, 11, 5, 7]])


@pytest.fixture(scope="module", autouse=True)
def aot_eager():
    """Every test here compiles with aot_eager (unless it asks for inductor) and starts from a clean dynamo."""
    torch._dynamo.reset()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(static, "BACKEND", "aot_eager")
        yield
    torch._dynamo.reset()


def graphs() -> int:
    return counters["stats"]["unique_graphs"]


def hf_greedy(target, ids, n):
    return target.generate(ids, do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
                           pad_token_id=0)


@pytest.fixture(scope="module")
def llama_pair():
    target = tiny_model("llama", seed=0)
    return target, perturbed_copy(target, 0.15)


# ---- greedy equality: compiled == eager == transformers generate --------------------------------------------------
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_compiled_greedy_equals_eager_and_generate(arch):
    target = tiny_model(arch, seed=0)
    draft = tiny_model(arch, seed=7, layers=1)
    eager = autoregressive_generate(target, PROMPT, max_new_tokens=24)
    assert torch.equal(eager.sequences, hf_greedy(target, PROMPT, 24))
    plain = autoregressive_generate(target, PROMPT, max_new_tokens=24, compile=True)
    assert plain.sequences.tolist() == eager.sequences.tolist()
    out = speculative_generate(target, draft, PROMPT, max_new_tokens=24, gamma=3, compile=True)
    assert out.sequences.tolist() == eager.sequences.tolist(), arch
    if arch != "gpt2":  # the tiny random GPT-2 repeats one token, which any draft predicts: nothing to reject
        assert out.stats.accepted_tokens < out.stats.drafted_tokens  # rejections, so rollbacks of both caches


def test_gamma_auto_is_lossless_on_both_paths(llama_pair):
    target, draft = llama_pair
    eager = autoregressive_generate(target, PROMPT, max_new_tokens=30)
    for compile in (False, True):
        out = speculative_generate(target, draft, PROMPT, max_new_tokens=30, gamma="auto", compile=compile)
        assert out.sequences.tolist() == eager.sequences.tolist()
        assert out.chosen_gammas and set(out.chosen_gammas) <= set(AUTO_GAMMAS)
        assert len(out.chosen_gammas) == out.stats.target_calls


def test_prompt_lookup_and_one_token_prompt_on_the_compiled_path(llama_pair):
    target, draft = llama_pair
    for prompt in (PROMPT, PROMPT[:, :1]):
        eager = autoregressive_generate(target, prompt, max_new_tokens=20)
        for drafter in (PromptLookupDrafter(), draft):
            out = speculative_generate(target, drafter, prompt, max_new_tokens=20, gamma=3, compile=True)
            assert out.sequences.tolist() == eager.sequences.tolist()


# ---- the static cache: rollback by position, padded steps, stale entries --------------------------------------------
def test_rollback_over_many_steps_matches_a_fresh_forward(llama_pair):
    """Random writes of 1..4 tokens (padded to the compiled 5-token step) and rollbacks: the logits always equal
    a from-scratch forward of the committed sequence, although stale entries remain beyond the position."""
    target, _ = llama_pair
    lm = StaticLM(target, "rollback-test", capacity=128, lengths=(1, 5))
    g = torch.Generator().manual_seed(0)
    committed = [1, 5, 7, 9, 11, 5, 7, 3, 8]
    lm.forward(torch.tensor([committed]))  # an eager prefill (longer than any compiled step)
    for _ in range(40):
        new = torch.randint(3, 90, (int(torch.randint(1, 5, (1,), generator=g)),), generator=g).tolist()
        logits = lm.forward(torch.tensor([new]))
        with torch.no_grad():
            reference = target(torch.tensor([committed + new])).logits[0, -len(new):]
        torch.testing.assert_close(logits, reference, rtol=1e-4, atol=1e-4)
        keep = int(torch.randint(0, len(new) + 1, (1,), generator=g))
        lm.rollback(len(new) - keep)
        committed += new[:keep]
        assert lm.length == len(committed)
    assert int(lm.session.cache.layers[0].cumulative_length) == len(committed)


@pytest.mark.parametrize("max_new", [1, 2, 3, 6])
def test_short_last_step_and_exact_lengths(llama_pair, max_new):
    target, draft = llama_pair
    eager = autoregressive_generate(target, PROMPT, max_new_tokens=max_new)
    out = speculative_generate(target, draft, PROMPT, max_new_tokens=max_new, gamma=4, compile=True)
    assert out.sequences.tolist() == eager.sequences.tolist()
    assert out.sequences.shape[1] == PROMPT.shape[1] + max_new


def test_eos_stops_where_plain_decoding_stops(llama_pair):
    target, draft = llama_pair
    free = autoregressive_generate(target, PROMPT, max_new_tokens=30).new_tokens
    eos = free[11]
    stop_at = free.index(eos) + 1
    plain = autoregressive_generate(target, PROMPT, max_new_tokens=30, eos_token_id=eos, compile=True)
    assert plain.new_tokens == free[:stop_at]
    for gamma in (4, "auto"):
        out = speculative_generate(target, draft, PROMPT, max_new_tokens=30, gamma=gamma, eos_token_id=[eos, 999],
                                   compile=True)
        assert out.new_tokens == free[:stop_at]


# ---- fallbacks: never silently wrong -------------------------------------------------------------------------------
def test_sliding_window_model_falls_back_to_eager_with_a_warning():
    target = tiny_model("mistral", seed=0)
    target.config.sliding_window = 4
    target.config.layer_types = ["sliding_attention"] * target.config.num_hidden_layers
    eager = autoregressive_generate(target, PROMPT, max_new_tokens=12)
    with pytest.warns(RuntimeWarning, match="sliding-window"):
        out = speculative_generate(target, target, PROMPT, max_new_tokens=12, gamma=2, compile=True)
    assert out.sequences.tolist() == eager.sequences.tolist()


def test_compiler_failure_falls_back_to_eager_with_a_warning(monkeypatch):
    def broken_backend(graph, example_inputs):
        raise RuntimeError("this backend cannot compile anything")

    monkeypatch.setattr(static, "BACKEND", broken_backend)
    target = tiny_model("qwen2", seed=4, hidden=16, layers=1)
    eager = autoregressive_generate(target, PROMPT, max_new_tokens=10)
    with pytest.warns(RuntimeWarning, match="torch.compile failed"):
        out = autoregressive_generate(target, PROMPT, max_new_tokens=10, compile=True)
    assert out.sequences.tolist() == eager.sequences.tolist()


def test_compile_options_fit_a_torch_without_isolate_recompiles():
    """torch < 2.13 has no isolate_recompiles (seen on a GPU machine with torch 2.11: every compile raised TypeError
    and the decoder silently ran eagerly): the option is dropped and dynamo's per-code limit raised instead."""
    import torch._dynamo.config as dynamo_config

    def old_compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None, options=None,
                    disable=False):
        pass

    limit = dynamo_config.recompile_limit  # a config module: monkeypatch would delete the name on undo
    options = {"backend": "inductor", "mode": "reduce-overhead", "dynamic": False, "isolate_recompiles": True}
    try:
        dynamo_config.recompile_limit = 8
        kept = static.supported_compile_options(options, old_compile)
        assert kept == {"backend": "inductor", "mode": "reduce-overhead", "dynamic": False}
        assert dynamo_config.recompile_limit == static.RECOMPILE_LIMIT
    finally:
        dynamo_config.recompile_limit = limit
    assert static.supported_compile_options(options) == options  # this torch takes all of them
    old_compile(**kept)  # every kept option is one the old signature takes


# ---- sampling on the compiled path is lossless (chi-square), and the negative control fails ----------------------
def sample_compiled(target, draft, cfg, runs, seed=0):
    g = torch.Generator().manual_seed(seed)
    samples = torch.zeros(runs, 3, dtype=torch.long)
    for i in range(runs):
        out = spec.speculative_generate(target, draft, sampling.PROMPT, max_new_tokens=3, gamma=2, generator=g,
                                        kind=kind_of(draft),
                                        temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                                        compile=True)
        samples[i] = out.sequences[0, -3:]
    return samples


@pytest.fixture(scope="module")
def sampling_pair():
    return sampling.models()


@pytest.mark.integration
def test_compiled_speculative_sampling_is_lossless(sampling_pair):
    target, draft = sampling_pair
    cfg = sampling.CONFIGS[3]  # temperature, top-k and top-p together
    p1, p2, p3, p12 = sampling.exact_marginals(target, cfg)
    s = sample_compiled(target, draft, cfg, runs=1000)
    vocab = sampling.VOCAB
    for observed, expected in [(s[:, 0], p1), (s[:, 1], p2), (s[:, 2], p3), (s[:, 0] * vocab + s[:, 1], p12)]:
        assert sampling.chi2_pvalue(torch.bincount(observed, minlength=expected.numel()), expected) > 1e-4


@pytest.mark.integration
def test_compiled_negative_control_is_rejected(sampling_pair, monkeypatch):
    target, draft = sampling_pair
    cfg = sampling.CONFIGS[0]
    p1, p2, _, _ = sampling.exact_marginals(target, cfg)
    monkeypatch.setattr(spec, "accept_sampled", sampling.accept_always)
    s = sample_compiled(target, draft, cfg, runs=800)
    pvalues = [sampling.chi2_pvalue(torch.bincount(s[:, j], minlength=sampling.VOCAB), p) for j, p in
               enumerate([p1, p2])]
    assert min(pvalues) < 1e-6


# ---- a whole evaluation compiles once ------------------------------------------------------------------------------
def test_no_recompiles_after_warm_up_across_evaluations(monkeypatch):
    target = tiny_model("llama", seed=1, hidden=16, layers=1)
    draft = perturbed_copy(target, 0.3)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 90, (n,), generator=g) for n in (4, 13, 7, 21)]
    after_warm_up = []
    real_warm_up = evaluate.warm_up

    def counting_warm_up(*args):
        real_warm_up(*args)
        after_warm_up.append(graphs())

    monkeypatch.setattr(evaluate, "warm_up", counting_warm_up)
    settings = EvalSettings(gammas=[2, "auto"], max_new_tokens=16, compile=True)
    first = evaluate_acceptance(target, draft, prompts, settings, progress=False)
    assert graphs() == after_warm_up[0]  # nothing compiled while timing, whatever the prompt length
    assert first[0]["compile_seconds"] > 0 and first[0]["compile_seconds"] == first[1]["compile_seconds"]
    assert first[1]["gamma"] == "auto" and 1 <= first[1]["mean_gamma"] <= max(AUTO_GAMMAS)
    assert all(r["greedy_match"] == 1.0 and r["compiled"] for r in first)
    before = graphs()
    second = evaluate_acceptance(target, draft, prompts, settings, progress=False)  # the next checkpoint
    assert graphs() == before and second[0]["compile_seconds"] == 0.0
    json.dumps(second)  # the result rows stay JSON


def test_registry_does_not_keep_models_alive():
    """A per-checkpoint copy (LoRA merged, ZeRO-3 gathered) is freed with its cache and compiled steps."""
    import gc
    import weakref

    target = tiny_model("llama", seed=5, hidden=16, layers=1)
    draft = perturbed_copy(target, 0.2)
    speculative_generate(target, draft, PROMPT, max_new_tokens=6, gamma=2, compile=True)
    alive = weakref.ref(draft)
    del draft
    gc.collect()
    assert alive() is None and target in static._SESSIONS


def test_cli_compile_and_gamma_auto(pair, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "eval.json"
    code, _, _ = run_cli(["--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompts",
                          str(pair / "prompts.jsonl"), "--gamma", "2", "auto", "--max-new-tokens", "10", "--compile",
                          "--output", str(out), "--quiet"], capsys)
    assert code == 0
    report = json.loads(out.read_text())
    assert report["compiled"] is True and report["compile_seconds"] >= 0
    assert [r["gamma"] for r in report["results"]] == [2, "auto"]
    assert all(r["greedy_match"] == 1.0 and r["compile_seconds"] == report["compile_seconds"]
               for r in report["results"])
    assert 1 <= report["results"][1]["mean_gamma"] <= max(AUTO_GAMMAS)
    code, _, err = run_cli(["--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompts",
                            str(pair / "prompts.jsonl"), "--gamma", "0", "--quiet"], capsys)
    assert code == 1 and "--gamma" in err and "Traceback" not in err


# ---- gamma auto picks sensible draft lengths -----------------------------------------------------------------------
def test_expected_tokens_formula():
    assert expected_tokens(3, 0.5) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(4, 1.0) == 5.0 and expected_tokens(2, 0.0) == 1.0


def test_best_gamma_follows_acceptance_and_costs():
    flat = {g: 1.0 for g in AUTO_GAMMAS}
    assert best_gamma(0.95, 0.02, flat) == max(AUTO_GAMMAS)  # cheap draft, near-perfect acceptance: draft long
    assert best_gamma(0.2, 0.5, flat) == 1                   # poor acceptance, costly draft: draft one
    assert best_gamma(0.8, 0.1, flat) in (3, 4, 6)
    steep = {g: 1.0 + 0.4 * g for g in AUTO_GAMMAS}          # verify cost growing with gamma pulls it down
    assert best_gamma(0.8, 0.1, steep) < best_gamma(0.8, 0.1, flat)


def test_chooser_learns_from_observed_steps():
    good, bad = GammaChooser(), GammaChooser()
    for _ in range(30):
        good.observe(good.choose(), 3, [1.0, 1.0, 1.0], draft_s=0.003, verify_s=0.01)
        bad.observe(bad.choose(), 3, [0.0], draft_s=0.03, verify_s=0.01)
    assert good.alpha > 0.9 and good.chosen[-1] == max(AUTO_GAMMAS)
    assert bad.alpha < 0.1 and bad.chosen[-1] == 1


def test_bad_gamma_is_one_clear_error():
    target = tiny_model("llama", seed=0, hidden=16, layers=1)
    for gamma in (0, "fast", 2.5):
        with pytest.raises(ValueError, match="gamma"):
            speculative_generate(target, target, PROMPT, max_new_tokens=4, gamma=gamma)
    with pytest.raises(ValueError, match="gamma"):
        EvalSettings(gammas=["fast"])


def test_recipe_accepts_auto_and_compile():
    from specdistill.recipes import EvalConfig, RecipeError

    cfg = EvalConfig(gammas=[2, "auto"], compile=True)
    assert cfg.gammas == [2, "auto"] and cfg.compile
    with pytest.raises(RecipeError, match="gammas"):
        EvalConfig(gammas=["fast"])


# ---- inductor itself (the real CPU backend) ------------------------------------------------------------------------
@pytest.mark.integration
def test_inductor_compiled_path_matches_eager(monkeypatch):
    monkeypatch.setattr(static, "BACKEND", "inductor")
    target = tiny_model("llama", seed=2, hidden=16, layers=1)
    draft = perturbed_copy(target, 0.2)
    eager = autoregressive_generate(target, PROMPT, max_new_tokens=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback to eager
        plain = autoregressive_generate(target, PROMPT, max_new_tokens=16, compile=True)
        out = speculative_generate(target, draft, PROMPT, max_new_tokens=16, gamma=2, compile=True)
    assert plain.sequences.tolist() == eager.sequences.tolist() == out.sequences.tolist()
    assert not static.session(target, "target").eager and static.compile_seconds(target, draft) > 0
