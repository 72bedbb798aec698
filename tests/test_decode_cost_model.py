"""The cost model is measured on the decoder's own loops: on a deterministic fake clock, where every forward pass
and the drafter's per-step commit cost known amounts, measure_cost_ratios must recover c and v (per-step overheads
included) and predicted_speedup must equal the speedup evaluate_acceptance measures on the same clock."""
import pytest
import torch

from decode.loop import timing
from decode.loop.speculative import GenerateOutput
from decode.measure.evaluate import time_side_by_side
from decode.measure.settings import EvalSettings
from kinds.standalone.drafter import ModelDrafter
from specdistill.drafts import evaluate_acceptance, measure_cost_ratios

from tiny import perturbed_copy, tiny_model

GAMMA = 2
TARGET_STEP = 1.0   # a 1-token target pass
PER_TOKEN = 0.3     # each further token of a target pass: verify over gamma + 1 tokens = 1.0 + 0.3 * gamma
DRAFT_STEP = 0.25   # a 1-token draft pass
COMMIT = 0.4        # the drafter's commit: a per-step overhead outside every forward pass
PROMPT_LEN = 6      # longer passes are prefills: free here, as the cost model leaves prefill out


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


def target_cost(tokens: int) -> float:
    return 0.0 if tokens >= PROMPT_LEN - 1 else TARGET_STEP + PER_TOKEN * (tokens - 1)


@pytest.fixture
def clock(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing, "now", clock.now)
    real_commit = ModelDrafter.commit

    def commit(self, num_accepted):
        clock.t += COMMIT
        return real_commit(self, num_accepted)

    monkeypatch.setattr(ModelDrafter, "commit", commit)
    return clock


def charge(model: torch.nn.Module, clock: FakeClock, cost) -> torch.utils.hooks.RemovableHandle:
    """Advance ``clock`` by ``cost(number of input tokens)`` at every forward pass of ``model``."""
    def hook(module, args, kwargs):
        clock.t += cost(kwargs["input_ids"].shape[1])
    return model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.fixture(params=["same", "perturbed"])
def pair(request, clock):
    target = tiny_model("llama", seed=0)
    draft = tiny_model("llama", seed=0) if request.param == "same" else perturbed_copy(target, 0.15)
    handles = [charge(target, clock, target_cost),
               charge(draft, clock, lambda n: 0.0 if n >= PROMPT_LEN - 1 else DRAFT_STEP * n)]
    yield target, draft
    for handle in handles:
        handle.remove()


def test_cost_ratios_count_the_per_step_overheads(pair):
    target, draft = pair
    prompt = torch.tensor([[1, 5, 7, 9, 11, 5]])
    costs = measure_cost_ratios(target, draft, prompt, GAMMA, repeats=3, new_tokens=24)
    # v = (verify over gamma + 1 tokens + commit) / t_target; a bare verify pass would give 1.6, not 2.0
    assert costs.verify_cost_ratio == pytest.approx(TARGET_STEP + PER_TOKEN * GAMMA + COMMIT)
    # c: gamma draft passes per step, plus the pending token's pass after a step that accepted every draft
    assert DRAFT_STEP <= costs.draft_cost_ratio <= DRAFT_STEP * (GAMMA + 1) / GAMMA


def test_cost_ratios_count_the_sampling_work_of_the_settings_measured(pair, clock, monkeypatch):
    """At T > 0 every drawn token costs time (a plain token, a drafted token, a verify step's acceptance): the ratios
    are measured under the sampling settings they predict, not greedy ones."""
    import decode.loop.speculative as spec
    from decode.loop.sampling import SamplingConfig
    target, draft = pair
    prompt = torch.tensor([[1, 5, 7, 9, 11, 5]])
    real_accept = spec.accept_sampled
    ACCEPT = 0.5  # the acceptance of one sampled verify step

    def accept_sampled(*args, **kwargs):
        clock.t += ACCEPT
        return real_accept(*args, **kwargs)

    monkeypatch.setattr(spec, "accept_sampled", accept_sampled)
    greedy = measure_cost_ratios(target, draft, prompt, GAMMA, repeats=3, new_tokens=24)
    sampled = measure_cost_ratios(target, draft, prompt, GAMMA, repeats=3, new_tokens=24,
                                  sampling=SamplingConfig(1.0, top_k=4))
    assert greedy.verify_cost_ratio == pytest.approx(TARGET_STEP + PER_TOKEN * GAMMA + COMMIT)
    assert sampled.verify_cost_ratio == pytest.approx(TARGET_STEP + PER_TOKEN * GAMMA + COMMIT + ACCEPT)


def test_predicted_speedup_equals_measured_speedup(pair):
    target, draft = pair
    prompts = [torch.tensor([1, 5, 7, 9, 11, 5]), torch.tensor([2, 8, 3, 8, 4, 9])]
    [result] = evaluate_acceptance(target, draft, prompts, EvalSettings(gammas=[GAMMA], max_new_tokens=40),
                                   progress=False)
    # the last step of a generation drafts fewer tokens than gamma: within a few percent, not exactly
    assert result["speedup"] / result["predicted_speedup"] == pytest.approx(1.0, abs=0.04)


def test_plain_is_timed_side_by_side_with_speculative(clock):
    calls = []

    def speculative():
        calls.append("speculative")
        clock.t += 2.0
        return GenerateOutput(sequences=torch.zeros(1, 3), new_tokens=[4, 5, 6])

    def plain(n_new):
        calls.append(("plain", n_new))
        clock.t += 3.0
        return GenerateOutput(sequences=torch.zeros(1, 3), new_tokens=[4, 5, 6])

    spec, base, t_spec, t_plain = time_side_by_side(speculative, plain, torch.device("cpu"), repeats=3)
    assert calls == ["speculative", ("plain", 3)] * 3
    assert (t_spec, t_plain) == (2.0, 3.0) and base.new_tokens == spec.new_tokens
