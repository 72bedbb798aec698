"""Training-time test of EAGLE-3 heads: the batched, masked unrolled loss (kinds/eagle3/loss.py) against a plain
step-by-step reference that runs the head as the decoder does (one position at a time, an explicit list of keys
and values, its own features fed back), in float64, value and gradient; and the draft vocabulary."""
from __future__ import annotations

import datasets
import pytest
import torch
import torch.nn.functional as F

from distill.data.hidden_cache import target_features
from distill.losses.divergences import DIVERGENCES
from distill.utils import IGNORE_INDEX
from kinds.draft_vocab import label_token_counts, most_frequent
from kinds.eagle3.loss import (
    TopKTeacher,
    UnrolledHead,
    noisy,
    step_token_counts,
    teacher_of,
    ttt_mask,
    ttt_step_sums,
    weighted_loss,
)
from kinds.eagle3.model import Eagle3Head, head_config, target_aux_hidden
from specdistill.recipes import DistillConfig

from tiny import tiny_model

VOCAB = 96


@pytest.fixture(autouse=True)
def norms_in_float64(monkeypatch):
    """transformers' LlamaRMSNorm (the head's norms) computes in float32 whatever its input; here it keeps float64,
    so that the batched and the step-by-step sums differ by float64 rounding only."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # x / sqrt(mean(x^2) + eps) * w
        return self.weight * hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    monkeypatch.setattr(LlamaRMSNorm, "forward", forward)


def tiny_pair(arch: str = "llama", draft_vocab: int = VOCAB, seed: int = 0, head_layers: int = 1
              ) -> tuple[torch.nn.Module, Eagle3Head]:
    """A float64 target (3 layers) and a randomly initialised head of `head_layers` decoder layers on it; draft
    vocabulary = the first `draft_vocab` even ids, then odd ones (a non-trivial d2t)."""
    target = tiny_model(arch, vocab_size=VOCAB, hidden=32, layers=3, seed=seed).double()
    torch.manual_seed(seed + 1)
    head = Eagle3Head(head_config(target.config, aux_layers=[0, 1, 2], draft_vocab_size=draft_vocab,
                                  num_layers=head_layers)).double()
    with torch.no_grad():  # random norms and a sharper lm_head: distributions far from uniform
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
        head.lm_head.weight.mul_(4.0)
    ids = torch.cat([torch.arange(0, VOCAB, 2), torch.arange(1, VOCAB, 2)])[:draft_vocab]
    head.set_vocab(torch.sort(ids).values)
    head.bind_embeddings(target.get_input_embeddings())
    return target, head


def batch(seed: int = 0, rows: int = 2, length: int = 9) -> dict[str, torch.Tensor]:
    """Right-padded rows: the second one 2 tokens shorter; a label -100 in the first."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (rows, length), generator=g)
    attention_mask = torch.ones(rows, length, dtype=torch.long)
    attention_mask[1, -2:] = 0
    input_ids[1, -2:] = 0
    labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
    labels[0, 4] = IGNORE_INDEX
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def reference_loss(target, head: Eagle3Head, inputs: dict, distill: DistillConfig) -> torch.Tensor:
    """The loss as the decoder would meet it: for every start index t, the head's KV list holds the step-0 keys of
    positions 0..t, then one drafted position per step (token x_{t+1+j}, the previous step's prenorm output)."""
    ids, labels, mask = inputs["input_ids"], inputs["labels"], inputs["attention_mask"]
    out = target(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    fused = head.fuse(target_aux_hidden(out.hidden_states, head.aux_layers))  # [B, T, H]
    teacher_logits = out.logits[..., head.target_ids]  # [B, T, V_draft]: p restricted to the draft vocabulary
    final = out.hidden_states[-1]  # [B, T, H]: the target's final normed hidden states (feature regression)
    draft_id = {int(t): i for i, t in enumerate(head.target_ids)}
    w = distill.ce_weight  # loss = (1 - w) kd + w ce; loss "ce" is ce alone
    divergence = DIVERGENCES.get(distill.loss)
    steps, (rows, length) = distill.ttt_steps, ids.shape
    sums, counts = [0.0] * steps, [0] * steps

    def position(b: int, token_at: int, hidden: torch.Tensor, rope: int, cache: list[tuple[list, list]]):
        """The head at one position: each layer's key and value join its lists, its query sees them all."""
        def attention(layer: int, q, k, v):
            keys, values = cache[layer]
            keys.append(k)
            values.append(v)
            keys_all, values_all = torch.cat(keys, dim=2), torch.cat(values, dim=2)
            sees_all = torch.ones(1, 1, 1, keys_all.shape[2], dtype=torch.bool)
            return head.attend(q, keys_all, values_all, sees_all, layer)
        return head.run(ids[b, token_at].view(1, 1), hidden.view(1, 1, -1), torch.tensor([[rope]]), attention)

    for b in range(rows):
        for t in range(length - 2):
            cache = [([], []) for _ in range(head.num_layers)]  # per layer: keys, values
            for s in range(t):  # the target-feature positions before t
                position(b, s + 1, fused[b, s], s, cache)
            hidden = fused[b, t]
            for j in range(steps):
                if t + 2 + j >= length:
                    break
                normed, hidden = position(b, t + 1 + j, hidden, t + j, cache)
                label = int(labels[b, t + 2 + j])
                if label == IGNORE_INDEX or not mask[b, t + 2 + j] or label not in draft_id:
                    continue
                logits = head.logits(normed)[0, 0]  # [V_draft]
                student = F.log_softmax(logits / distill.temperature, -1)[None]
                row = teacher_logits[b, t + 1 + j]
                if distill.soft_target_top_k is not None:  # p cut to its top k: -inf elsewhere, renormalised below
                    row = row.masked_fill(row < row.topk(distill.soft_target_top_k).values[-1], float("-inf"))
                teacher = F.log_softmax(row / distill.temperature, -1)[None]
                ce = F.cross_entropy(logits[None], torch.tensor([draft_id[label]]))
                kd = divergence.value(student, teacher, distill.beta)[0] if divergence else 0.0
                sums[j] = sums[j] + (ce if distill.loss == "ce" else (1 - w) * kd + w * ce)
                if distill.feature_weight > 0:  # mean over the hidden size of huber(e), e = g - f, beta 1
                    e = normed[0, 0] - final[b, t + 1 + j]
                    sums[j] = sums[j] + distill.feature_weight * torch.where(
                        e.abs() < 1, e.pow(2) / 2, e.abs() - 0.5).mean()
                counts[j] += 1
    return sum(distill.ttt_decay ** j * sums[j] / max(counts[j], 1) for j in range(steps))


def batched_loss(target, head: Eagle3Head, inputs: dict, distill: DistillConfig) -> torch.Tensor:
    """What HeadTrainer computes for one micro-batch that is the whole optimizer step."""
    aux, final = target_features(target, inputs["input_ids"], inputs["attention_mask"], head.aux_layers)
    outputs = UnrolledHead(head, distill.ttt_steps)(inputs["input_ids"], aux)
    teacher = teacher_of(target.get_output_embeddings(), head, distill.soft_target_top_k)
    sums = ttt_step_sums(head, outputs, final, teacher, inputs["labels"], inputs["attention_mask"], distill,
                         loss=distill.loss_at(0, 1))
    counts = step_token_counts(inputs["labels"], inputs["attention_mask"], head, distill.ttt_steps)
    assert [s.num_tokens for s in sums] == counts.tolist()
    return weighted_loss(sums, counts, distill.ttt_decay)


def gradients(head: Eagle3Head, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    names, params = zip(*[(n, p) for n, p in head.named_parameters() if p.requires_grad])
    return dict(zip(names, torch.autograd.grad(loss, params)))


def batched_matches_reference(target, head: Eagle3Head, inputs: dict, distill: DistillConfig
                              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The batched loss equals the step-by-step reference, value and gradient (float64 rounding): (loss, gradients)."""
    expected = reference_loss(target, head, inputs, distill)
    got = batched_loss(target, head, inputs, distill)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    expected_grads, got_grads = gradients(head, expected), gradients(head, got)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-9, atol=1e-12, msg=lambda m: f"{name}: {m}")
    return got, got_grads


@pytest.mark.parametrize("arch, loss, steps, decay, temperature, ce_weight, draft_vocab", [
    ("llama", "forward_kl", 3, 0.8, 1.0, 0.0, VOCAB),
    ("llama", "tv", 4, 1.0, 1.0, 0.0, 40),
    ("qwen2", "reverse_kl", 2, 0.5, 2.0, 0.3, 40),
    ("llama", "jsd", 3, 0.9, 1.0, 0.0, 60),
    ("llama", "ce", 3, 0.7, 1.0, 0.0, 40),
    ("qwen2", "forward_kl", 1, 1.0, 1.0, 0.0, VOCAB),
])
def test_unrolled_loss_matches_the_step_by_step_decoder_reference(arch, loss, steps, decay, temperature, ce_weight,
                                                                  draft_vocab):
    target, head = tiny_pair(arch, draft_vocab)
    distill = DistillConfig(loss=loss, temperature=temperature, ce_weight=ce_weight, ttt_steps=steps,
                            ttt_decay=decay, chunk_size=7)
    inputs = batch()
    got, got_grads = batched_matches_reference(target, head, inputs, distill)
    assert any(g.abs().max() > 0 for g in got_grads.values())


@pytest.mark.parametrize("arch, head_layers", [("llama", 2), ("qwen2", 3)])
def test_a_deeper_heads_unrolled_loss_matches_the_step_by_step_decoder_reference(arch, head_layers):
    """model.head_layers > 1: every layer's keys unrolled as the first's, each layer its own KV list in the
    reference; every layer's weights get a gradient."""
    target, head = tiny_pair(arch, 40, head_layers=head_layers)
    distill = DistillConfig(loss="forward_kl", ttt_steps=3, ttt_decay=0.8, chunk_size=7)
    _, got_grads = batched_matches_reference(target, head, batch(), distill)
    for index in range(1, head_layers):
        assert got_grads[f"layers.{index}.self_attn.q_proj.weight"].abs().max() > 0
        assert got_grads[f"layers.{index}.mlp.down_proj.weight"].abs().max() > 0


@pytest.mark.parametrize("loss, steps, weight", [("forward_kl", 3, 0.5), ("ce", 2, 2.0), ("tv", 1, 1.0)])
def test_feature_regression_adds_the_smooth_l1_to_the_target_features_at_every_step(loss, steps, weight):
    """distill.feature_weight: each kept position of step j adds w * smooth-L1(g^j_t, f_{t+1+j}) to the loss, value
    and gradient as the step-by-step reference; the loss grows by exactly that and logs it as the term `feature`."""
    target, head = tiny_pair(draft_vocab=40)
    inputs = batch(seed=7)
    distill = DistillConfig(loss=loss, ttt_steps=steps, ttt_decay=0.8, feature_weight=weight, chunk_size=5)
    got, _ = batched_matches_reference(target, head, inputs, distill)
    plain = batched_loss(target, head, inputs, DistillConfig(loss=loss, ttt_steps=steps, ttt_decay=0.8))
    assert float((got - plain).detach()) > 1e-3  # the features differ: the term is there and positive

    aux, final = target_features(target, inputs["input_ids"], inputs["attention_mask"], head.aux_layers)
    outputs = UnrolledHead(head, steps)(inputs["input_ids"], aux)
    sums = ttt_step_sums(head, outputs, final, teacher_of(target.get_output_embeddings(), head, None),
                         inputs["labels"], inputs["attention_mask"], distill)
    assert all(float(s.terms["feature"]) > 0 for s in sums if s.num_tokens)


def test_feature_regression_is_zero_on_the_target_features_themselves():
    """F vanishes where the head's output is the target's final hidden state, and only kept positions count."""
    from kinds.eagle3.loss import feature_sum

    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)
    kept = torch.tensor([[True, False, True, True, False], [False] * 5])
    assert float(feature_sum(teacher.clone(), teacher, kept)) == 0.0
    shifted_out = teacher.clone()
    shifted_out[0, 0] += 3.0  # |e| = 3 on every dim: huber 2.5
    shifted_out[0, 1] += 3.0  # not kept
    shifted_out[1] += 0.5  # not kept
    assert float(feature_sum(shifted_out, teacher, kept)) == pytest.approx(2.5)
    with pytest.raises(ValueError, match="distill.feature_weight: the head's hidden size 8 is not the target's 4"):
        feature_sum(teacher, teacher[..., :4], kept)


def test_every_divergence_of_the_table_trains_a_head():
    """Each name of DIVERGENCES goes through unchanged (new divergences work for heads automatically)."""
    target, head = tiny_pair(draft_vocab=40)
    inputs = batch(seed=3)
    for name in DIVERGENCES:
        distill = DistillConfig(loss=name, ttt_steps=2, ttt_decay=0.9)
        torch.testing.assert_close(batched_loss(target, head, inputs, distill),
                                   reference_loss(target, head, inputs, distill), rtol=1e-10, atol=1e-12)


def test_ttt_mask_sees_causal_target_positions_and_its_own_drafts():
    mask = ttt_mask(4, 2)[0, 0].int()  # [T, 3T]
    assert mask.tolist() == [
        [1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0],
        [1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0],
        [1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0],
        [1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1],
    ]


def test_step_token_counts_drop_labels_outside_the_draft_vocabulary():
    _, head = tiny_pair(draft_vocab=VOCAB // 2)  # the even ids
    labels = torch.tensor([[IGNORE_INDEX, 4, 6, 7, 8, 10]])
    counts = step_token_counts(labels, torch.ones_like(labels), head, 3)
    # step j scores labels[2 + j:]: {6, 7, 8, 10} -> 3 even, {7, 8, 10} -> 2, {8, 10} -> 2
    assert counts.tolist() == [3, 2, 2]


def test_draft_vocabulary_is_the_most_frequent_label_tokens_ties_by_id():
    rows = datasets.Dataset.from_dict({"labels": [[IGNORE_INDEX, 5, 5, 9, 2], [7, 7, 9, 9, IGNORE_INDEX, 3, 2]]})
    counts = label_token_counts(rows, 12, batch_size=1)
    assert counts.tolist() == [0, 0, 2, 1, 0, 2, 0, 2, 0, 3, 0, 0]
    # 9 (3 times), then 2, 5, 7 (twice each): the tie keeps the smaller ids; ascending order
    assert most_frequent(counts, 3).tolist() == [2, 5, 9]
    assert most_frequent(counts, 12).tolist() == list(range(12))


def test_a_loss_combination_is_the_weighted_sum_of_its_terms_for_heads():
    """distill.loss as a weighted combination ({name: weight}) goes through ttt_step_sums like a single name."""
    target, head = tiny_pair(draft_vocab=40)
    inputs = batch(seed=5)
    steps = dict(ttt_steps=3, ttt_decay=0.8)
    mixed = batched_loss(target, head, inputs, DistillConfig(loss={"forward_kl": 0.25, "tv": 0.75}, **steps))
    parts = [batched_loss(target, head, inputs, DistillConfig(loss=name, **steps)) for name in ("forward_kl", "tv")]
    torch.testing.assert_close(mixed, 0.25 * parts[0] + 0.75 * parts[1], rtol=1e-10, atol=1e-12)


def test_feature_noise_is_a_fraction_of_each_positions_rms_and_only_in_training():
    """distill.feature_noise: noise whose RMS is `scale` of each position's features (layers of any scale), drawn
    in training only: in eval the unrolled head computes exactly what it computes without noise."""
    features = torch.randn(2, 5, 4096, dtype=torch.float64) * torch.tensor([1.0, 10.0, 100.0, 0.1, 3.0]).view(1, 5, 1)
    torch.manual_seed(0)
    noise = noisy(features, 0.2) - features
    ratio = noise.pow(2).mean(-1).sqrt() / features.pow(2).mean(-1).sqrt()  # [2, 5]
    torch.testing.assert_close(ratio, torch.full_like(ratio, 0.2), atol=0.01, rtol=0)
    target, head = tiny_pair()
    inputs = batch()
    aux = target_features(target, inputs["input_ids"], inputs["attention_mask"], head.aux_layers)[0]
    plain = UnrolledHead(head, 2)(inputs["input_ids"], aux)
    noised = UnrolledHead(head, 2, feature_noise=0.5)
    assert all(torch.equal(a, b) for a, b in zip(noised.eval()(inputs["input_ids"], aux), plain))
    assert not torch.allclose(noised.train()(inputs["input_ids"], aux)[0], plain[0])


def test_a_top_k_teacher_is_the_targets_distribution_cut_to_its_top_k_and_renormalised():
    """TopKTeacher's softmax: p(x) / sum of the top k's p on the k likeliest tokens (and a token tied with the k-th),
    exactly 0 elsewhere; every logit finite; k >= V is the teacher itself."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 12, bias=False).double()
    hidden = torch.randn(5, 8, dtype=torch.float64)
    p = linear(hidden).softmax(-1)  # [5, 12]
    logits = TopKTeacher(linear, 3)(hidden)
    assert torch.isfinite(logits).all()
    top = p.topk(3, dim=-1).indices
    expected = torch.zeros_like(p).scatter(-1, top, p.gather(-1, top))
    torch.testing.assert_close(logits.softmax(-1), expected / expected.sum(-1, keepdim=True), rtol=1e-12, atol=0)
    assert torch.equal(TopKTeacher(linear, 12)(hidden), linear(hidden))
    linear.weight.data[1] = linear.weight.data[0]  # tokens 0 and 1 tie everywhere
    kept = TopKTeacher(linear, 1)(hidden).softmax(-1) > 0
    assert all(kept[i, 0] == kept[i, 1] for i in range(5))
    with pytest.raises(ValueError, match="soft_target_top_k"):
        TopKTeacher(linear, 0)


@pytest.mark.parametrize("loss, top_k, draft_vocab, temperature", [
    ("forward_kl", 5, 40, 1.0), ("tv", 3, VOCAB, 1.0), ("jsd", 8, 60, 2.0)])
def test_top_k_soft_targets_match_the_step_by_step_reference(loss, top_k, draft_vocab, temperature):
    """distill.soft_target_top_k through the batched unroll and the fused loss equals the reference whose teacher is
    -inf outside its top k (value and gradient), and differs from the whole distribution's loss."""
    target, head = tiny_pair(draft_vocab=draft_vocab)
    inputs = batch(seed=3)
    keys = dict(loss=loss, ttt_steps=3, ttt_decay=0.8, temperature=temperature, chunk_size=7)
    distill = DistillConfig(soft_target_top_k=top_k, **keys)
    got, _ = batched_matches_reference(target, head, inputs, distill)
    assert not torch.allclose(got, batched_loss(target, head, inputs, DistillConfig(**keys)))
