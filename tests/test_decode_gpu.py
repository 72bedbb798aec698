"""The decoder on CUDA: float32 greedy equality, bf16/fp16 runs with exact lengths, one synchronisation a round, a
head's chained round under CUDA graphs. Skipped without CUDA."""
import pytest
import torch

from decode import autoregressive_generate
from decode.measure.settings import EvalSettings
from specdistill.drafts import evaluate_acceptance, speculative_generate

from tiny import perturbed_copy, tiny_model

# a compiled test that silently fell back to eager decoding would measure nothing: the fallback warning fails it
pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("error:torch.compile failed:RuntimeWarning")]
PROMPT = torch.tensor([[1, 5, 7, 9, 11, 5, 7]])


def test_cuda_float32_greedy_equality():
    target = tiny_model("llama", seed=0).cuda()
    draft = perturbed_copy(target.cpu(), 0.15).cuda()
    target = target.cuda()
    ids = PROMPT.cuda()
    base = autoregressive_generate(target, ids, max_new_tokens=40)
    out = speculative_generate(target, draft, ids, max_new_tokens=40, gamma=4)
    assert out.sequences.tolist() == base.sequences.tolist()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_half_precision_runs_and_measures(dtype):
    target = tiny_model("qwen2", seed=0).to("cuda", dtype)
    draft = perturbed_copy(tiny_model("qwen2", seed=0), 0.1).to("cuda", dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    out = speculative_generate(target, draft, PROMPT.cuda(), max_new_tokens=33, gamma=3, temperature=0.8,
                               top_p=0.9, generator=g)
    assert out.sequences.shape == (1, PROMPT.shape[1] + 33)
    (result,) = evaluate_acceptance(target, draft, [PROMPT[0].cuda()], EvalSettings(gammas=[3], max_new_tokens=16),
                                    progress=False)
    assert 0.0 <= result["acceptance_rate"] <= 1.0 and result["speedup"] > 0


# ---- the compiled path: static caches and CUDA graphs (mode="reduce-overhead") -----------------------------------
def test_cuda_compiled_float32_greedy_equality():
    target = tiny_model("llama", seed=0)
    draft = perturbed_copy(target, 0.15).cuda()
    target = target.cuda()
    ids = PROMPT.cuda()
    base = autoregressive_generate(target, ids, max_new_tokens=40)
    plain = autoregressive_generate(target, ids, max_new_tokens=40, compile=True)
    assert plain.sequences.tolist() == base.sequences.tolist()
    for gamma in (3, "auto"):
        out = speculative_generate(target, draft, ids, max_new_tokens=40, gamma=gamma, compile=True)
        assert out.sequences.tolist() == base.sequences.tolist()


def test_cuda_graph_bf16_compiled_runs_measures_and_never_recompiles():
    from torch._dynamo.utils import counters

    target = tiny_model("qwen2", seed=0).to("cuda", torch.bfloat16)
    draft = perturbed_copy(tiny_model("qwen2", seed=0), 0.1).to("cuda", torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(0)
    out = speculative_generate(target, draft, PROMPT.cuda(), max_new_tokens=33, gamma=3, temperature=0.8,
                               top_p=0.9, generator=g, compile=True)
    assert out.sequences.shape == (1, PROMPT.shape[1] + 33)
    settings = EvalSettings(gammas=[3, "auto"], max_new_tokens=16, compile=True)
    prompts = [PROMPT[0].cuda(), PROMPT[0, :3].cuda()]
    evaluate_acceptance(target, draft, prompts, settings, progress=False)
    before = counters["stats"]["unique_graphs"]
    results = evaluate_acceptance(target, draft, prompts, settings, progress=False)
    assert counters["stats"]["unique_graphs"] == before and results[0]["compile_seconds"] == 0.0
    assert all(r["speedup"] > 0 and 0.0 <= r["acceptance_rate"] <= 1.0 for r in results)


# ---- a round synchronises once: the counted read of the accepted tokens (decode.loop.speculative.read_step) -------
def eagle3_head(target: torch.nn.Module) -> torch.nn.Module:
    from kinds.eagle3.model import Eagle3Head, head_config

    torch.manual_seed(1)
    return Eagle3Head(head_config(target.config)).bind_embeddings(target.get_input_embeddings()).eval()


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
@pytest.mark.parametrize("kind", ["standalone", "eagle3"])
def test_the_loop_synchronises_only_for_its_counted_read(kind, temperature, compile):
    target = tiny_model("llama", seed=0, layers=4).cuda()
    draft = (perturbed_copy(target.cpu(), 0.15) if kind == "standalone" else eagle3_head(target.cpu())).cuda()
    target = target.cuda()
    ids = PROMPT.cuda()

    def generate(new_tokens: int):
        return speculative_generate(target, draft, ids, max_new_tokens=new_tokens, gamma=3, temperature=temperature,
                                    generator=torch.Generator(device="cuda").manual_seed(0), compile=compile)

    generate(8)  # allocations and compilation happen once, before the checked run
    torch.cuda.set_sync_debug_mode("error")  # any synchronisation but HostReads.read raises
    try:
        out = generate(40)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert out.stats.host_reads == out.stats.target_calls and len(out.new_tokens) == 40
    if temperature == 0.0:
        assert out.new_tokens == autoregressive_generate(target, ids, max_new_tokens=40).new_tokens


def test_a_chained_head_round_proposes_what_its_steps_propose_under_cuda_graphs(monkeypatch):
    """HeadCache.chain (a greedy round as one CUDA graph) against the head's compiled steps one by one: the same
    proposals at every round (graphs that reused a stale output buffer would differ), greedy output = plain."""
    from kinds.eagle3.drafter import HeadDrafter

    target = tiny_model("llama", seed=0, layers=4)
    head = eagle3_head(target).cuda()
    target = target.cuda()
    ids = PROMPT.cuda()
    original, proposals = HeadDrafter.propose, {}
    for chained in (True, False):
        seen = proposals.setdefault(chained, [])

        def recording(self, history, cur, gamma, cfg, generator, seen=seen):
            drafts, q = original(self, history, cur, gamma, cfg, generator)
            seen.append(drafts.tolist())
            return drafts, q

        monkeypatch.setattr(HeadDrafter, "propose", recording)
        monkeypatch.setattr(HeadDrafter, "chained", chained)
        out = speculative_generate(target, head, ids, max_new_tokens=40, gamma=3, compile=True)
        assert out.new_tokens == autoregressive_generate(target, ids, max_new_tokens=40).new_tokens
    assert len(proposals[True]) > 5 and proposals[True] == proposals[False]
