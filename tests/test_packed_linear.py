"""decode.loop.packed_linear: oneDNN-packed linear layers compute nn.Linear's product, and leave decoding exact."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from decode.inputs.vocab import lm_head_rows
from decode.loop.packed_linear import (
    PackedLinear,
    Packing,
    faster_plain,
    pack_linears,
    packed_layers,
    packed_linears,
    set_plain_rows,
    tune_plain_rows,
)
from decode.loop.speculative import autoregressive_generate
from kinds.prompt_lookup.drafter import PromptLookupDrafter
from specdistill.drafts import speculative_generate

from tiny import perturbed_copy, tiny_model

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN is not built into torch")
BF16 = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="no oneDNN bfloat16 on this CPU"))
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # relative to the output's scale


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 48), (1, 7, 48), (2, 1, 48)])
def test_packed_equals_f_linear(dtype, bias, shape):
    torch.manual_seed(0)
    linear = nn.Linear(48, 80, bias=bias).to(dtype)
    x = torch.randn(shape, dtype=dtype)
    expected = F.linear(x, linear.weight, linear.bias)
    packed = PackedLinear(linear)
    with torch.inference_mode():
        got = packed(x)
        strided = packed(x.transpose(-1, -2).contiguous().transpose(-1, -2))  # a non-contiguous input
    assert got.shape == expected.shape == (*shape[:-1], 80) and got.dtype == dtype
    scale = expected.abs().max().item()
    assert (got - expected).abs().max().item() <= TOLERANCE[dtype] * scale
    assert torch.equal(strided, got)
    assert packed.packed is not None  # the oneDNN path ran, not the fallback


def test_pack_linears_keeps_parameters_and_is_idempotent():
    model = tiny_model("llama", seed=0)
    linears = sum(type(m) is nn.Linear for m in model.modules())
    head = model.lm_head.weight
    keys = list(model.state_dict())
    assert pack_linears(model) == linears > 0
    assert model.lm_head.weight is head and list(model.state_dict()) == keys  # same parameters, same names
    assert lm_head_rows(model) == head.shape[0] and model.lm_head.in_features == head.shape[1]
    assert all(type(m) is not nn.Linear for m in model.modules())
    layers = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert pack_linears(model) == 0  # already packed: nothing swapped, the same modules
    assert [m for m in model.modules() if isinstance(m, PackedLinear)] == layers


def test_no_op_off_cpu_or_without_onednn(monkeypatch):
    assert pack_linears(nn.Sequential(nn.Linear(4, 4, device="meta"))) == 0  # not a CPU tensor (as on CUDA)
    assert pack_linears(nn.Sequential(nn.Linear(4, 4).half())) == 0  # a dtype oneDNN does not pack here
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert pack_linears(nn.Sequential(nn.Linear(4, 4))) == 0


@pytest.mark.parametrize("draft_kind", ["model", "prompt_lookup"])
def test_greedy_speculative_equals_plain_after_packing(draft_kind):
    target = tiny_model("llama", seed=0, vocab_size=96)
    draft = perturbed_copy(target, 0.1) if draft_kind == "model" else PromptLookupDrafter()
    prompt = torch.tensor([[5, 17, 33, 5, 17, 40, 9, 5, 17]])
    unpacked = autoregressive_generate(target, prompt, max_new_tokens=24).new_tokens
    assert pack_linears(target) > 0
    if draft_kind == "model":
        assert pack_linears(draft) > 0
    plain = autoregressive_generate(target, prompt, max_new_tokens=24).new_tokens
    for gamma in (1, 3, 4):
        spec = speculative_generate(target, draft, prompt, max_new_tokens=24, gamma=gamma)
        assert spec.new_tokens == plain, gamma
        assert spec.stats.target_calls < 24 or draft_kind == "prompt_lookup"
    assert plain == unpacked  # the tiny model's argmaxes are well separated: packing changes no greedy token


def test_plain_rows_multiply_those_row_counts_by_f_linear():
    """A layer's plain_rows are the token counts it hands to F.linear (bit for bit), every other count packed."""
    torch.manual_seed(0)
    linear = nn.Linear(48, 80)
    packed = PackedLinear(linear)
    one, three, five = torch.randn(1, 1, 48), torch.randn(3, 48), torch.randn(1, 5, 48)
    with torch.inference_mode():
        packed_out = [packed(x) for x in (one, three, five)]
        packed.plain_rows = frozenset({1, 3})
        assert torch.equal(packed(one), F.linear(one, linear.weight, linear.bias))
        assert torch.equal(packed(three), F.linear(three, linear.weight, linear.bias))
        assert torch.equal(packed(five), packed_out[2])  # 5 rows: still the packed product
    for got, x in zip(packed_out, (one, three, five)):
        assert torch.allclose(got, F.linear(x, linear.weight, linear.bias), atol=1e-5)


def test_faster_plain_compares_medians_per_row_count():
    seconds = {(1, "plain"): [1.0, 1.1, 9.0], (1, "packed"): [1.5, 1.4, 1.6],   # one outlier does not decide
               (5, "plain"): [2.0, 2.1, 2.2], (5, "packed"): [1.0, 0.2, 1.1]}
    assert faster_plain(seconds) == {1}
    assert faster_plain({(2, "plain"): [1.0], (2, "packed"): [1.0]}) == set()  # a tie stays packed


def test_tuning_sets_every_layer_and_greedy_decoding_stays_exact():
    """tune_plain_rows picks among the row counts it was given and applies the choice to every packed layer; with
    1-token steps on F.linear and verify passes packed (a mix auto may choose), greedy speculative output is still
    the target's."""
    target = tiny_model("llama", seed=0, vocab_size=96)
    draft = perturbed_copy(target, 0.1)
    prompt = torch.tensor([[5, 17, 33, 5, 17, 40, 9, 5, 17]])
    unpacked = autoregressive_generate(target, prompt, max_new_tokens=24).new_tokens
    pack_linears(target), pack_linears(draft)
    chosen = tune_plain_rows(target, [1, 4], rounds=2)
    assert chosen <= {1, 4} and all(layer.plain_rows == chosen for layer in packed_layers(target))
    assert tune_plain_rows(nn.Sequential(nn.Linear(4, 4)), [1, 2]) == set()  # nothing packed: nothing to tune
    for model in (target, draft):
        set_plain_rows(model, [1])
    assert autoregressive_generate(target, prompt, max_new_tokens=24).new_tokens == unpacked
    for gamma in (1, 3):
        assert speculative_generate(target, draft, prompt, max_new_tokens=24, gamma=gamma).new_tokens == unpacked


def test_training_copies_and_in_place_changes_fall_back_or_repack():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    pack_linears(model)
    x = torch.randn(3, 16)
    # autograd on: a plain F.linear, so gradients reach the original parameters
    model(x).sum().backward()
    assert model[0].weight.grad is not None and model[2].bias.grad is not None
    # a modified weight is repacked at the next call
    with torch.no_grad():
        model[0].weight.mul_(-2.0)
    reference = F.linear(torch.relu(F.linear(x, model[0].weight, model[0].bias)), model[2].weight, model[2].bias)
    with torch.inference_mode():
        assert torch.allclose(model(x), reference, atol=1e-5)
        # a copy (deepcopy cannot copy oneDNN tensors) repacks its own weights on first use
        twin = copy.deepcopy(model)
        assert twin[0].packed is None and torch.allclose(twin(x), reference, atol=1e-5)


def test_compiled_packed_module_traces_f_linear():
    torch.manual_seed(0)
    linear = nn.Linear(16, 8)
    packed = PackedLinear(linear)
    x = torch.randn(2, 16)
    compiled = torch.compile(packed, backend="eager", fullgraph=True)  # no oneDNN op in the traced graph
    with torch.inference_mode():
        assert torch.allclose(compiled(x), linear(x), atol=1e-6)


# ---- packed for a while: packed_linears ---------------------------------------------------------------------------
def test_packed_linears_packs_inside_the_block_and_restores_the_same_modules_after():
    """Inside: every linear layer packed, the same logits within float rounding; after (also on an error): the very
    nn.Linear modules of before, with the very same parameters, and nothing packed left."""
    model, draft = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    before = {name: m for name, m in model.named_modules() if type(m) is nn.Linear}
    params = {name: p for name, p in model.named_parameters()}
    draft_linears = sum(type(m) is nn.Linear for m in draft.modules())
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        expected = model(ids).logits
        with packed_linears(model, None, draft, "not a model") as packing:
            assert packing.layers == len(before) + draft_linears
            assert packing.plain_rows == (frozenset(), None, frozenset(), None)  # packed at every token count
            assert all(isinstance(m, PackedLinear) for name, m in model.named_modules() if name in before)
            got = model(ids).logits
            assert model.lm_head.packed is not None  # the oneDNN path ran
    assert (got - expected).abs().max().item() <= 1e-5 * expected.abs().max().item()
    after = {name: m for name, m in model.named_modules() if type(m) is nn.Linear}
    assert after.keys() == before.keys() and all(after[name] is before[name] for name in before)
    assert all(p is params[name] for name, p in model.named_parameters())
    assert not packed_layers(model) and not packed_layers(draft)
    with pytest.raises(RuntimeError, match="boom"):
        with packed_linears(model):
            raise RuntimeError("boom")
    assert not packed_layers(model) and all(m is before[name] for name, m in model.named_modules() if name in before)


def test_packed_linears_leaves_layers_packed_before_it_and_tunes_when_asked():
    model = tiny_model("llama", seed=0)
    pack_linears(model)
    with packed_linears(model) as packing:
        assert packing == Packing(0, (None,))
    assert packed_layers(model)  # packed by the caller: still packed after the block
    fresh = tiny_model("llama", seed=0)
    with packed_linears(fresh, tune_rows=[1, 2]) as tuned:
        (chosen,) = tuned.plain_rows
        assert chosen <= {1, 2} and all(layer.plain_rows == chosen for layer in packed_layers(fresh))
    # a later block applies a choice without timing anything
    with packed_linears(fresh, model, tune_rows=[1, 2], plain_rows=[frozenset({3}), None]) as given:
        assert given.plain_rows == (frozenset({3}), None)
        assert all(layer.plain_rows == {3} for layer in packed_layers(fresh))


def test_what_is_not_whole_or_has_hooks_stays_unpacked():
    """A DeepSpeed ZeRO-3 partition (ds_id) or a DTensor shard holds no whole weight; a layer with a forward hook
    (accelerate's offloading) must keep running it."""
    partitioned, hooked, plain = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
    partitioned.weight.ds_id = 3
    calls = []
    hooked.register_forward_hook(lambda module, args, out: calls.append(1))
    model = nn.Sequential(partitioned, hooked, plain)
    with packed_linears(model) as packing:
        assert packing.layers == 1 and type(model[0]) is nn.Linear and type(model[1]) is nn.Linear
        assert isinstance(model[2], PackedLinear)
        with torch.no_grad():
            model(torch.randn(2, 8))
    assert calls == [1]

    class Shard(torch.Tensor):  # stands in for a DTensor: a tensor subclass whose values are not all here
        pass

    sharded = nn.Linear(8, 8)
    sharded.weight = nn.Parameter(sharded.weight.detach().as_subclass(Shard))
    assert pack_linears(nn.Sequential(sharded)) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_under_autocast_a_packed_layer_computes_as_autocast_does(dtype):
    """CPU autocast casts inside F.linear; a packed float32 product would skip that cast and give other numbers."""
    torch.manual_seed(0)
    linear = nn.Linear(48, 80)
    x = torch.randn(3, 48)
    packed = PackedLinear(linear)
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        expected, got = linear(x), packed(x)
    assert got.dtype == expected.dtype == dtype and torch.equal(got, expected)
