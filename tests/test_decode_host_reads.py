"""A speculative round reads the host once: the decoder and every kind's drafter keep the round on the device.

Every way a tensor's values reach Python (``tolist``, ``item``, ``int()``, ``float()``, ``bool()``, indexing a
list with a tensor, ``cpu``, ``numpy``) is counted while a generation runs, when the call comes from the decoder
(decode/) or a kind (kinds/); transformers' own forward is not ours to count. Each verify pass must make exactly one
(decode.loop.speculative.read_step), for every draft kind, greedy and sampled, eager and compiled; prompt lookup,
whose n-gram search is host by nature, reads the prompt once more at the start. SpecStats.host_reads counts them.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import decode.loop.static as static
from decode import autoregressive_generate
from kinds.dflash.model import DFlashDraft, dflash_config_for
from kinds.eagle3.model import Eagle3Head, head_config
from kinds.prompt_lookup.drafter import PromptLookupDrafter
from specdistill.drafts import speculative_generate

from tiny import perturbed_copy, tiny_model

ROOT = Path(__file__).resolve().parents[1]
OURS = (str(ROOT / "decode") + "/", str(ROOT / "kinds") + "/")
READS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__", "cpu", "numpy")
PROMPT = torch.tensor([[1, 5, 7, 9, 11, 5, 7, 9, 11, 5]])  # repeats: prompt lookup finds n-grams


def target_model() -> torch.nn.Module:
    return tiny_model("llama", seed=0, layers=4)


def head(target: torch.nn.Module, parallel: bool = False) -> Eagle3Head:
    cfg = head_config(target.config)
    if parallel:
        cfg.ptd_token_id, cfg.ptd_gamma = 3, 4
    torch.manual_seed(1)
    made = Eagle3Head(cfg).bind_embeddings(target.get_input_embeddings())
    if parallel:
        with torch.no_grad():
            made.mask_hidden.normal_()
    return made.eval()


def pard(target: torch.nn.Module) -> torch.nn.Module:
    draft = perturbed_copy(target, 0.05)
    draft.config.pard_token, draft.config.pard_gamma = target.config.vocab_size - 1, 4
    return draft.eval()


def dflash(target: torch.nn.Module) -> DFlashDraft:
    torch.manual_seed(1)
    config = dflash_config_for(target.config, mask_token_id=target.config.vocab_size - 1, block_size=5)
    return DFlashDraft(config).bind_target(target).eval()


DRAFTS = {
    "standalone": lambda target: perturbed_copy(target, 0.05).eval(),
    "eagle3": head,
    "p_eagle": lambda target: head(target, parallel=True),
    "pard": pard,
    "dflash": dflash,
    "prompt_lookup": lambda target: PromptLookupDrafter(),
}


class ReadCounter:
    """Counts host reads whose caller is a file of decode/ or kinds/ while installed (monkeypatch)."""

    def __init__(self, monkeypatch, roots: tuple[str, ...] = OURS) -> None:
        self.count, self.roots = 0, roots
        self.where: list[str] = []
        for name in READS:
            monkeypatch.setattr(torch.Tensor, name, self.counted(getattr(torch.Tensor, name)), raising=True)

    def counted(self, method):
        def read(tensor, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(self.roots):
                self.count += 1
                self.where.append(f"{caller}:{sys._getframe(1).f_lineno}")
            return method(tensor, *args, **kwargs)
        return read


@pytest.fixture(scope="module")
def target():
    return target_model()


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
@pytest.mark.parametrize("kind", list(DRAFTS))
def test_every_kind_reads_the_host_once_per_round(kind, temperature, target, monkeypatch):
    draft = DRAFTS[kind](target)
    speculative_generate(target, draft, PROMPT, max_new_tokens=4, gamma=3)  # builds what is built once
    counter = ReadCounter(monkeypatch)
    out = speculative_generate(target, draft, PROMPT, max_new_tokens=24, gamma=3, temperature=temperature,
                               generator=torch.Generator().manual_seed(0))
    monkeypatch.undo()
    stats = out.stats
    assert stats.target_calls > 1 and len(out.new_tokens) == 24
    # prompt lookup's n-gram search runs on the host: it is handed the prompt's ids, read once at the start
    prompt_reads = 1 if kind == "prompt_lookup" else 0
    assert counter.count == stats.target_calls + prompt_reads, counter.where
    assert stats.host_reads == counter.count
    if temperature == 0.0:
        assert out.new_tokens == autoregressive_generate(target, PROMPT, max_new_tokens=24).new_tokens


@pytest.mark.parametrize("kind", ["standalone", "eagle3", "pard"])
def test_the_compiled_path_reads_the_host_once_per_round(kind, target, monkeypatch):
    from kinds.eagle3.drafter import HeadDrafter

    monkeypatch.setattr(static, "BACKEND", "aot_eager")  # the decode logic, without code generation
    monkeypatch.setattr(HeadDrafter, "chained", True)  # a head's greedy rounds as one call, as on a GPU
    draft = DRAFTS[kind](target)
    speculative_generate(target, draft, PROMPT, max_new_tokens=4, gamma=3, compile=True)  # compiles every step
    with monkeypatch.context() as patch:
        counter = ReadCounter(patch)
        out = speculative_generate(target, draft, PROMPT, max_new_tokens=24, gamma=3, compile=True)
    assert counter.count == out.stats.target_calls == out.stats.host_reads, counter.where
    assert out.new_tokens == autoregressive_generate(target, PROMPT, max_new_tokens=24).new_tokens
    if kind == "standalone":  # its greedy rounds ran as one compiled chain of 3 draft steps (Session.chain)
        chains = [key for key in static.session(draft, "draft").steps if isinstance(key, tuple)]
        assert sorted(key[2:] for key in chains) == [(1, 3), (2, 3)]
    if kind == "eagle3":  # and a head's as one compiled chain of 3 (HeadCache.chain), compiled without failing
        steps = static.register(draft, "head", lambda: None).steps
        assert steps[("chain", 3)] is not None


def test_a_compiled_chain_of_draft_steps_proposes_what_the_steps_propose(target, monkeypatch):
    """Session.chain (one compiled call for a round's gamma draft steps) against the same steps called one by one."""
    from kinds.standalone.drafter import ModelDrafter

    monkeypatch.setattr(static, "BACKEND", "aot_eager")
    draft = DRAFTS["standalone"](target)
    proposals = {}
    for chained in (True, False):
        drafter = ModelDrafter(draft, compile=True, capacity=64, max_gamma=4 if chained else 5)  # 5: no chain at 4
        cur, seen = PROMPT[:, -1:], []
        with torch.inference_mode():
            drafter.start(PROMPT[:, :-1], target.config.vocab_size)
            for accepted in (4, 1, 0, 4):
                drafts, _ = drafter.propose([], cur, 4, spec_greedy(), None)
                seen.append(drafts.tolist())
                drafter.commit(accepted)
                cur = drafts[accepted - 1:accepted].view(1, 1) if accepted else torch.tensor([[7]])
        proposals[chained] = seen
    assert proposals[True] == proposals[False]


def spec_greedy():
    from decode.loop.sampling import SamplingConfig

    return SamplingConfig(0.0)


def test_the_counter_sees_a_read_the_decoder_would_add(target, monkeypatch):
    """The negative control: one extra read per round in the decoder is seen (the counter can fail)."""
    import decode.loop.speculative as spec

    real = spec.accept_greedy

    def reads_twice(logits, drafts):
        verdict = real(logits, drafts)
        int(verdict.num_accepted)  # a second read, as the decoder made before
        return verdict

    monkeypatch.setattr(spec, "accept_greedy", reads_twice)
    draft = DRAFTS["standalone"](target)
    with monkeypatch.context() as patch:
        counter = ReadCounter(patch, OURS + (__file__,))
        out = speculative_generate(target, draft, PROMPT, max_new_tokens=24, gamma=3)
    assert counter.count == 2 * out.stats.target_calls


def test_the_step_overhead_benchmark_splits_a_round_and_writes_its_table(tmp_path):
    """scripts/bench_step_overhead.py on a short run: the self-drafting pair accepts every draft, reads the host once
    per round, and its round split adds up; the page's block is the JSON's table, rewritten from the JSON alone."""
    from scripts import bench_step_overhead as bench

    page = tmp_path / "page.md"
    begin, end = bench.benchmark.doc_markers(bench.SCRIPT)
    page.write_text(f"# A page\n\n{begin}\nold\n{end}\n\nkept\n")
    json_path = tmp_path / "overhead.json"
    report = bench.main(["--paths", "eager", "--repeats", "1", "--num-prompts", "2", "--max-new-tokens", "21",
                         "--gamma", "4", "--json", str(json_path), "--doc", str(page)])
    [row] = report["rows"]
    result, split = row["result"], row["split"]
    assert result["mean_accepted_tokens"] == 21 / 5 and result["greedy_match"] == 1.0  # 4 rounds of 5, then 1
    assert result["host_reads_per_step"] == 1.0
    assert split["rounds"] == 2 * 4 and min(split["draft_steps"], split["verify_steps"], split["own_steps"]) > 0
    assert split["without_own_work"] > split["from_split"]
    costs = split["forward_costs"]  # 1-, 2- and 5-token forwards of the decoder's cache, in 1-token forwards
    assert list(costs) == ["1", "2", "5"] and costs["1"] == 1.0 and min(costs.values()) > 0
    assert split["forward_bound"] == pytest.approx(split["tau"] / (3 + costs["2"] + costs["5"]))
    text = page.read_text()
    assert "old" not in text and text.endswith("kept\n") and "| eager " in text
    page.write_text(f"{begin}\n{end}\n")
    bench.main(["--from-json", str(json_path), "--doc", str(page)])
    assert page.read_text().split(begin)[1] == text.split(begin)[1].split(end)[0] + end + "\n"


def test_the_decode_page_quotes_the_committed_step_overhead_json():
    """docs/benchmarks/decode.md's block is the table of the committed JSON, to the digit."""
    import json

    from scripts import bench_step_overhead as bench

    begin, end = bench.benchmark.doc_markers(bench.SCRIPT)
    page = (ROOT / "docs" / "benchmarks" / "decode.md").read_text()
    block = page.split(begin, 1)[1].split(end, 1)[0]
    report = json.loads((ROOT / "docs" / "benchmarks" / "step_overhead" / "cpu_xeon_amx.json").read_text())
    assert block == "\n" + bench.table(report)
    assert (ROOT / "docs" / "benchmarks" / "step_overhead" / "cpu_xeon_amx.png").is_file()
