"""Distillation losses against plain float64 references written from the formulas."""
from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F

from distill.losses.distill_loss import LossSums, chunked_distill_loss, distill_loss
from distill.losses.divergences import (
    ALPHA_FLOOR,
    DIVERGENCES,
    LOSSES,
    SparseTeacher,
    acceptance_probability,
    bucketize,
    forward_kl,
    jsd,
    lk_hybrid,
    negative_log_acceptance,
    per_token_divergence,
    reverse_kl,
    total_variation,
)

KD_LOSSES = ("forward_kl", "reverse_kl", "jsd", "tv", "nla", "lk_hybrid")


# ---------------------------------------------------------------------------------------------------------------
# References: python floats, one token and one vocabulary entry at a time
# ---------------------------------------------------------------------------------------------------------------

def ref_kl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """KL(a || b) = sum_x a log(a / b), with 0 log 0 = 0; a, b probabilities [N, V]."""
    rows = [sum(x * math.log(x / y) for x, y in zip(ra, rb) if x > 0) for ra, rb in zip(a.tolist(), b.tolist())]
    return torch.tensor(rows, dtype=torch.float64)


def ref_jsd(p: torch.Tensor, q: torch.Tensor, beta: float) -> torch.Tensor:
    if beta == 0.0:
        return ref_kl(p, q)
    if beta == 1.0:
        return ref_kl(q, p)
    m = beta * p + (1 - beta) * q
    return beta * ref_kl(p, m) + (1 - beta) * ref_kl(q, m)


def ref_tv(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    rows = [0.5 * sum(abs(x - y) for x, y in zip(rp, rq)) for rp, rq in zip(p.tolist(), q.tolist())]
    return torch.tensor(rows, dtype=torch.float64)


def ref_acceptance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """alpha = sum_x min(p, q) per row."""
    rows = [sum(min(x, y) for x, y in zip(rp, rq)) for rp, rq in zip(p.tolist(), q.tolist())]
    return torch.tensor(rows, dtype=torch.float64)


def ref_nla(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return torch.tensor([-math.log(a) for a in ref_acceptance(p, q).tolist()], dtype=torch.float64)


def ref_lk_hybrid(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    lam = torch.tensor([math.exp(-3.0 * a) for a in ref_acceptance(p, q).tolist()], dtype=torch.float64)
    return lam * ref_kl(p, q) + (1 - lam) * ref_tv(p, q)


# the references, by loss name: student probabilities q, teacher probabilities p [N, V] -> [N]
REFERENCES = {
    "forward_kl": lambda q, p, beta: ref_kl(p, q),
    "reverse_kl": lambda q, p, beta: ref_kl(q, p),
    "jsd": lambda q, p, beta: ref_jsd(p, q, beta),
    "tv": lambda q, p, beta: ref_tv(p, q),
    "nla": lambda q, p, beta: ref_nla(p, q),
    "lk_hybrid": lambda q, p, beta: ref_lk_hybrid(p, q),
}


def ref_divergence(name: str, q: torch.Tensor, p: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """Per-token divergence of student probabilities q from teacher probabilities p."""
    return REFERENCES[name](q, p, beta)


def ref_probs(logits: torch.Tensor, temperature: float = 1.0, vocab: int | None = None) -> torch.Tensor:
    """softmax(logits[:, :vocab] / T) in float64, by exp and divide."""
    z = logits.detach().double()[:, :vocab] / temperature
    e = (z - z.max(dim=-1, keepdim=True).values).exp()
    return e / e.sum(dim=-1, keepdim=True)


def call_divergence(name: str, student_logp, teacher_logp, beta: float = 0.5):
    return DIVERGENCES[name].value(student_logp, teacher_logp, beta)


def random_logits(*shape: int, seed: int, scale: float = 3.0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


# ---------------------------------------------------------------------------------------------------------------
# Divergences on log-probabilities
# ---------------------------------------------------------------------------------------------------------------

DIVERGENCE_CASES = [("forward_kl", 0.5), ("reverse_kl", 0.5), ("jsd", 0.1), ("jsd", 0.5), ("jsd", 0.9), ("tv", 0.5),
                    ("nla", 0.5), ("lk_hybrid", 0.5)]


@pytest.mark.parametrize("name,beta", DIVERGENCE_CASES)
@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_divergence_matches_reference(name, beta, dtype, rtol):
    s, t = random_logits(6, 11, seed=0, dtype=dtype), random_logits(6, 11, seed=1, dtype=dtype)
    got = call_divergence(name, F.log_softmax(s, -1), F.log_softmax(t, -1), beta)
    want = ref_divergence(name, ref_probs(s), ref_probs(t), beta)
    assert got.shape == (6,) and got.dtype == dtype
    assert (want > 1e-2).all()  # a non-trivial comparison
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=rtol * 1e-2)


@pytest.mark.parametrize("name,beta", DIVERGENCE_CASES)
def test_identical_distributions_give_zero(name, beta):
    logp = F.log_softmax(random_logits(5, 13, seed=2), -1)
    torch.testing.assert_close(call_divergence(name, logp, logp.clone(), beta), torch.zeros(5), rtol=0, atol=1e-6)


def test_the_divergence_table_names_every_kd_loss_and_a_reference():
    assert tuple(DIVERGENCES) == KD_LOSSES == tuple(REFERENCES) and LOSSES == (*KD_LOSSES, "ce")


@pytest.mark.parametrize("name,beta", DIVERGENCE_CASES + [("jsd", 0.0), ("jsd", 1.0)])
def test_closed_form_gradients_match_autograd_of_the_value(name, beta):
    """value_and_grad (the fused path's) against autograd through value, in float64: dD/ds for s the logits."""
    s = random_logits(5, 12, seed=8, dtype=torch.float64).requires_grad_(True)
    teacher_logp = F.log_softmax(random_logits(5, 12, seed=9, dtype=torch.float64), -1)
    value = DIVERGENCES[name].value(F.log_softmax(s, -1), teacher_logp, beta)
    (want_grad,) = torch.autograd.grad(value.sum(), s)
    got, grad, tv = DIVERGENCES[name].value_and_grad(F.log_softmax(s, -1).detach(), teacher_logp, beta)
    torch.testing.assert_close(got, value.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(tv, total_variation(F.log_softmax(s, -1), teacher_logp).detach(), rtol=1e-10,
                               atol=1e-12)


def test_jsd_endpoints_are_exactly_the_kls():
    s, t = F.log_softmax(random_logits(4, 9, seed=3), -1), F.log_softmax(random_logits(4, 9, seed=4), -1)
    assert torch.equal(jsd(s, t, 0.0), forward_kl(s, t))
    assert torch.equal(jsd(s, t, 1.0), reverse_kl(s, t))
    assert not torch.allclose(forward_kl(s, t), reverse_kl(s, t))  # the endpoints really differ


def test_jsd_half_is_the_standard_symmetric_jsd():
    s, t = random_logits(4, 9, seed=5, dtype=torch.float64), random_logits(4, 9, seed=6, dtype=torch.float64)
    q, p = ref_probs(s), ref_probs(t)
    m = 0.5 * (p + q)
    got = jsd(F.log_softmax(s, -1), F.log_softmax(t, -1), 0.5)
    torch.testing.assert_close(got, 0.5 * ref_kl(p, m) + 0.5 * ref_kl(q, m), rtol=1e-10, atol=0)
    torch.testing.assert_close(got, jsd(F.log_softmax(t, -1), F.log_softmax(s, -1), 0.5), rtol=1e-12, atol=0)
    assert (got > 0).all() and (got <= math.log(2)).all()


def test_tv_is_one_minus_acceptance_probability():
    s, t = random_logits(8, 7, seed=7, scale=4.0), random_logits(8, 7, seed=8, scale=4.0)
    tv = total_variation(F.log_softmax(s, -1), F.log_softmax(t, -1))
    acceptance = torch.minimum(ref_probs(s), ref_probs(t)).sum(-1)  # sum_x min(p, q)
    assert ((tv >= 0) & (tv <= 1)).all()
    torch.testing.assert_close(tv.double(), 1 - acceptance, rtol=1e-5, atol=1e-6)
    # disjoint supports: nothing is ever accepted
    disjoint = torch.tensor([[0.0, -math.inf], [-math.inf, 0.0]])
    torch.testing.assert_close(total_variation(disjoint, disjoint.flip(-1)), torch.ones(2))


def test_zero_probabilities_give_finite_values_and_gradients():
    # teacher: exact zeros at ids 2 and 4; student: probabilities that underflow to 0 in float32 at the same ids
    teacher_logp = F.log_softmax(torch.tensor([[1.0, 2.0, -math.inf, 0.5, -math.inf]]), -1)
    student_logits = torch.tensor([[0.3, -0.7, -300.0, 1.0, -300.0]], requires_grad=True)
    student_logp = F.log_softmax(student_logits, -1)
    assert student_logp.exp()[0, 2] == 0 and student_logp.exp()[0, 4] == 0
    p, q = teacher_logp.exp().double(), student_logp.exp().detach().double()
    for name, beta in DIVERGENCE_CASES:
        value = call_divergence(name, F.log_softmax(student_logits, -1), teacher_logp, beta)
        (grad,) = torch.autograd.grad(value.sum(), student_logits)
        assert torch.isfinite(value).all() and torch.isfinite(grad).all(), name
        torch.testing.assert_close(value.double(), ref_divergence(name, q, p, beta), rtol=1e-5, atol=1e-6)
    # closed form: d/dz KL(p || softmax(z)) = q - p
    (grad,) = torch.autograd.grad(forward_kl(F.log_softmax(student_logits, -1), teacher_logp).sum(), student_logits)
    torch.testing.assert_close(grad.double(), q - p, rtol=1e-5, atol=1e-6)


def test_jsd_and_tv_finite_with_disjoint_zeros():
    student_logp = torch.tensor([[0.0, -math.inf, -math.inf]], requires_grad=True)
    teacher_logp = torch.tensor([[-math.inf, math.log(0.5), math.log(0.5)]])
    value = jsd(student_logp, teacher_logp, 0.3)
    (grad,) = torch.autograd.grad(value.sum(), student_logp)
    q, p = torch.tensor([[1.0, 0, 0]], dtype=torch.float64), torch.tensor([[0, 0.5, 0.5]], dtype=torch.float64)
    torch.testing.assert_close(value.double(), ref_jsd(p, q, 0.3), rtol=1e-6, atol=0)
    assert torch.isfinite(grad).all()
    assert total_variation(student_logp, teacher_logp).item() == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------------------------
# distill_loss on logits
# ---------------------------------------------------------------------------------------------------------------

def make_batch(n: int = 12, student_vocab: int = 11, teacher_vocab: int = 11, seed: int = 0):
    """Student logits (leaf with grad), teacher logits, labels with two -100s, mask with two False."""
    student = random_logits(n, student_vocab, seed=seed).requires_grad_(True)
    teacher = random_logits(n, teacher_vocab, seed=seed + 100)
    labels = torch.randint(0, min(student_vocab, teacher_vocab), (n,), generator=torch.Generator().manual_seed(seed))
    labels[[1, 6]] = -100
    mask = torch.ones(n, dtype=torch.bool)
    mask[[3, n - 1]] = False
    return student, teacher, labels, mask


def kept(labels, mask):
    return mask & (labels != -100)


@pytest.mark.parametrize("loss", KD_LOSSES)
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_distill_loss_matches_reference(loss, temperature):
    student, teacher, labels, mask = make_batch()
    sums = distill_loss(student, teacher, labels, mask, loss=loss, beta=0.3, temperature=temperature)
    keep = kept(labels, mask)
    q, p = ref_probs(student[keep], temperature), ref_probs(teacher[keep], temperature)
    assert sums.num_tokens == 8
    torch.testing.assert_close(sums.loss.double(), ref_divergence(loss, q, p, 0.3).sum(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sums.kd, sums.loss.detach())
    # tv is logged at temperature 1 whatever the training temperature
    ref_tv_t1 = ref_tv(ref_probs(teacher[keep]), ref_probs(student[keep])).sum()
    torch.testing.assert_close(sums.tv.double(), ref_tv_t1, rtol=1e-5, atol=1e-6)
    assert sums.loss.requires_grad and not sums.kd.requires_grad and not sums.tv.requires_grad


def test_ce_matches_torch_cross_entropy_sum():
    student, _, labels, mask = make_batch()
    sums = distill_loss(student, None, labels, mask, loss="ce")
    ignored = labels.masked_fill(~mask, -100)
    want = F.cross_entropy(student, ignored, reduction="sum")
    torch.testing.assert_close(sums.loss, want)
    torch.testing.assert_close(sums.ce, want.detach())
    assert sums.kd.item() == 0 and sums.tv.item() == 0 and sums.num_tokens == 8
    (got_grad,) = torch.autograd.grad(sums.loss, student)
    (want_grad,) = torch.autograd.grad(want, student)
    torch.testing.assert_close(got_grad, want_grad)


@pytest.mark.parametrize("loss", KD_LOSSES)
def test_ce_weight_mixes_kd_and_ce(loss):
    student, teacher, labels, mask = make_batch(seed=1)
    pure = distill_loss(student, teacher, labels, mask, loss=loss, temperature=1.5)
    ce = F.cross_entropy(student, labels.masked_fill(~mask, -100), reduction="sum")
    mixed = distill_loss(student, teacher, labels, mask, loss=loss, temperature=1.5, ce_weight=0.3)
    torch.testing.assert_close(mixed.loss, 0.7 * pure.loss + 0.3 * ce)
    torch.testing.assert_close(mixed.ce, ce.detach())
    (got,) = torch.autograd.grad(mixed.loss, student)
    (want,) = torch.autograd.grad(0.7 * pure.loss + 0.3 * ce, student)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("loss", LOSSES)
def test_masked_positions_change_nothing(loss):
    student, teacher, labels, mask = make_batch(seed=2)
    ignored = ~kept(labels, mask)
    clean = distill_loss(student, teacher, labels, mask, loss=loss, ce_weight=0.2)
    # garbage (NaN) at every ignored position, in both models
    dirty_student = student.detach().masked_fill(ignored[:, None], math.nan).requires_grad_(True)
    dirty = distill_loss(dirty_student, teacher.masked_fill(ignored[:, None], math.nan), labels, mask,
                         loss=loss, ce_weight=0.2)
    for field in ("loss", "kd", "ce", "tv"):
        torch.testing.assert_close(getattr(dirty, field), getattr(clean, field).detach(), msg=field)
    (clean_grad,) = torch.autograd.grad(clean.loss, student)
    (dirty_grad,) = torch.autograd.grad(dirty.loss, dirty_student)
    assert (dirty_grad[ignored] == 0).all()
    torch.testing.assert_close(dirty_grad, clean_grad)
    # labels == -100 and mask == False are the same thing
    as_labels = distill_loss(student, teacher, labels.masked_fill(~mask, -100), torch.ones_like(mask),
                             loss=loss, ce_weight=0.2)
    torch.testing.assert_close(as_labels.loss, clean.loss)
    assert as_labels.num_tokens == clean.num_tokens == 8


def test_nothing_kept_gives_zero_loss_connected_to_the_graph():
    student, teacher, labels, _ = make_batch()
    sums = distill_loss(student, teacher, labels, torch.zeros(12, dtype=torch.bool), loss="jsd", ce_weight=0.5)
    assert sums.num_tokens == 0 and sums.loss.item() == 0 and sums.loss.requires_grad
    (grad,) = torch.autograd.grad(sums.loss, student)
    assert (grad == 0).all()
    student_hidden, student_head, teacher_hidden, teacher_head, labels, mask = make_hidden_batch()
    sums = chunked_distill_loss(student_hidden, student_head, teacher_hidden, labels, torch.zeros_like(mask),
                                teacher_head=teacher_head, loss="forward_kl")
    assert sums.num_tokens == 0 and sums.loss.item() == 0
    grads = torch.autograd.grad(sums.loss, [student_hidden, student_head.weight])
    assert all((g == 0).all() for g in grads)


@pytest.mark.parametrize("loss", KD_LOSSES)
def test_padded_teacher_vocab_compares_on_shared_columns(loss):
    student, teacher, labels, mask = make_batch(student_vocab=10, teacher_vocab=12, seed=3)
    teacher[:, 10:] = -1e4  # padded lm_head rows of the target
    sums = distill_loss(student, teacher, labels, mask, loss=loss, temperature=2.0)
    keep = kept(labels, mask)
    q, p = ref_probs(student[keep], 2.0), ref_probs(teacher[keep], 2.0, vocab=10)
    torch.testing.assert_close(sums.loss.double(), ref_divergence(loss, q, p).sum(), rtol=1e-5, atol=1e-6)
    # same as handing over the teacher already cut to the student's vocabulary
    torch.testing.assert_close(sums.loss, distill_loss(student, teacher[:, :10], labels, mask, loss=loss,
                                                       temperature=2.0).loss)


@pytest.mark.parametrize("loss", KD_LOSSES)
def test_padded_student_vocab_is_renormalised_on_shared_columns(loss):
    student, teacher, labels, mask = make_batch(student_vocab=12, teacher_vocab=10, seed=4)
    sums = distill_loss(student, teacher, labels, mask, loss=loss, ce_weight=0.5)
    keep = kept(labels, mask)
    kd = ref_divergence(loss, ref_probs(student[keep], vocab=10), ref_probs(teacher[keep])).sum()
    ce = F.cross_entropy(student[keep].double(), labels[keep], reduction="sum")  # ce keeps the full vocabulary
    torch.testing.assert_close(sums.loss.double(), 0.5 * kd + 0.5 * ce, rtol=1e-5, atol=1e-6)


def test_gradient_accumulation_sums_then_divides_by_the_total_token_count():
    student, teacher, labels, mask = make_batch(n=12, seed=5)
    mask[[0, 2]] = False  # halves with unequal token counts: 6 rows -> 2 kept ... 6 rows -> 4 kept
    options = dict(loss="jsd", beta=0.7, temperature=1.3, ce_weight=0.25)
    full = distill_loss(student, teacher, labels, mask, **options)
    halves = [distill_loss(student[rows], teacher[rows], labels[rows], mask[rows], **options)
              for rows in (slice(0, 6), slice(6, 12))]
    assert halves[0].num_tokens != halves[1].num_tokens
    accumulated = halves[0] + halves[1]
    assert isinstance(accumulated, LossSums) and accumulated.num_tokens == full.num_tokens == 6
    torch.testing.assert_close(accumulated.loss / accumulated.num_tokens, full.loss / full.num_tokens)
    # the mean of the two half-batch means would be a different (wrong) number
    assert not torch.isclose(accumulated.loss / accumulated.num_tokens,
                             0.5 * sum(h.loss / h.num_tokens for h in halves))
    (want,) = torch.autograd.grad(full.loss / full.num_tokens, student)
    grads = [torch.autograd.grad(h.loss / accumulated.num_tokens, student)[0] for h in halves]
    torch.testing.assert_close(grads[0] + grads[1], want)


# ---------------------------------------------------------------------------------------------------------------
# Sparse (top-k) teacher
# ---------------------------------------------------------------------------------------------------------------

def test_bucketize_sums_to_one_and_matches_student_probabilities():
    student, teacher, _, _ = make_batch(n=8, seed=6)
    sparse = SparseTeacher.from_logits(teacher, k=3)
    student_logp, teacher_logp = bucketize(student, sparse)
    assert student_logp.shape == teacher_logp.shape == (8, 4)
    torch.testing.assert_close(student_logp.exp().sum(-1), torch.ones(8))
    torch.testing.assert_close(teacher_logp.exp().sum(-1), torch.ones(8))
    q = ref_probs(student)
    top_q = q.gather(-1, sparse.topk_ids)
    torch.testing.assert_close(student_logp.exp()[:, :3].double(), top_q, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(student_logp.exp()[:, 3].double(), 1 - top_q.sum(-1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(teacher_logp.exp()[:, :3], sparse.topk_logprobs.exp(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("loss", LOSSES)
def test_sparse_teacher_with_full_k_equals_dense(loss):
    student, teacher, labels, mask = make_batch(seed=7)
    sparse = SparseTeacher.from_logits(teacher, k=teacher.shape[-1])
    dense_sums = distill_loss(student, teacher, labels, mask, loss=loss, ce_weight=0.1)
    sparse_sums = distill_loss(student, sparse, labels, mask, loss=loss, ce_weight=0.1)
    for field in ("loss", "kd", "ce", "tv"):
        torch.testing.assert_close(getattr(sparse_sums, field), getattr(dense_sums, field), rtol=1e-5, atol=1e-6,
                                   msg=field)
    (dense_grad,) = torch.autograd.grad(dense_sums.loss, student)
    (sparse_grad,) = torch.autograd.grad(sparse_sums.loss, student)
    assert torch.isfinite(sparse_grad).all()
    torch.testing.assert_close(sparse_grad, dense_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loss", KD_LOSSES)
def test_sparse_small_k_is_close_for_a_peaked_teacher(loss):
    # teacher: one token 12 nats above the rest of 64, k = 8 leaves a tail mass ~5e-4; student: teacher + noise
    n, vocab, k = 16, 64, 8
    teacher = random_logits(n, vocab, seed=8, scale=1.0)
    teacher[torch.arange(n), torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(8))] += 12.0
    student = (teacher + random_logits(n, vocab, seed=9, scale=1.0)).requires_grad_(True)
    labels, mask = torch.zeros(n, dtype=torch.long), torch.ones(n, dtype=torch.bool)
    dense = distill_loss(student, teacher, labels, mask, loss=loss).kd / n
    sparse = distill_loss(student, SparseTeacher.from_logits(teacher, k), labels, mask, loss=loss).kd / n
    assert dense > 2e-4  # the student really differs from the teacher
    # merging tokens into one bucket never increases an f-divergence (data processing inequality) ...
    assert sparse <= dense + 1e-7
    # ... and the per-token gap stays below 5e-4 (nats for KL/JSD, probability for TV; observed <= 2.8e-4)
    assert dense - sparse < 5e-4, (dense.item(), sparse.item())


def test_sparse_forward_kl_gap_is_tail_mass_times_the_kl_inside_the_tail():
    # chain rule: KL(p || q) = KL over buckets + P(tail) KL(p(. | tail) || q(. | tail))
    student, teacher, _, _ = make_batch(seed=11)
    student, teacher = student.detach().double(), teacher.double()
    sparse = SparseTeacher.from_logits(teacher, k=3)
    labels, keep = torch.zeros(12, dtype=torch.long), torch.ones(12, dtype=torch.bool)
    dense = distill_loss(student, teacher, labels, keep, loss="forward_kl").kd
    bucketed = distill_loss(student, sparse, labels, keep, loss="forward_kl").kd
    p, q = ref_probs(teacher), ref_probs(student)
    tail = torch.ones_like(p, dtype=torch.bool).scatter_(-1, sparse.topk_ids, False)
    p_tail, q_tail = p * tail, q * tail
    p_mass = p_tail.sum(-1)
    within = ref_kl(p_tail / p_mass[:, None], q_tail / q_tail.sum(-1, keepdim=True))
    torch.testing.assert_close(dense - bucketed, (p_mass * within).sum(), rtol=1e-9, atol=1e-12)
    assert (p_mass * within).sum() > 1e-2


def test_sparse_teacher_needs_temperature_one():
    student, teacher, labels, mask = make_batch()
    with pytest.raises(ValueError, match="temperature=2.0.*SparseTeacher"):
        distill_loss(student, SparseTeacher.from_logits(teacher, 4), labels, mask, loss="forward_kl",
                     temperature=2.0)


def test_sparse_teacher_ids_must_fit_the_student_vocabulary():
    student, teacher, labels, mask = make_batch(student_vocab=10, teacher_vocab=12, seed=10)
    sparse = SparseTeacher.from_logits(teacher, 4)
    sparse.topk_ids[0, 0] = 11
    with pytest.raises(ValueError, match=r"topk_ids must lie in \[0, 10\)"):
        distill_loss(student, sparse, labels, mask, loss="forward_kl")


# ---------------------------------------------------------------------------------------------------------------
# chunked_distill_loss: hidden states and heads, chunk by chunk
# ---------------------------------------------------------------------------------------------------------------

HIDDEN, TEACHER_HIDDEN, STUDENT_VOCAB, TEACHER_VOCAB = 8, 6, 11, 13


def make_hidden_batch(seed: int = 0):
    """B=2, T=9 with 14 kept positions; float64 heads (teacher vocabulary padded by 2)."""
    torch.manual_seed(seed)
    student_head = torch.nn.Linear(HIDDEN, STUDENT_VOCAB, bias=False, dtype=torch.float64)
    teacher_head = torch.nn.Linear(TEACHER_HIDDEN, TEACHER_VOCAB, bias=False, dtype=torch.float64)
    student_hidden = (torch.randn(2, 9, HIDDEN, dtype=torch.float64) * 2).requires_grad_(True)
    teacher_hidden = torch.randn(2, 9, TEACHER_HIDDEN, dtype=torch.float64) * 2
    labels = torch.randint(0, STUDENT_VOCAB, (2, 9))
    labels[0, 0] = labels[1, 4] = -100
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, 8] = mask[1, 7] = False
    return student_hidden, student_head, teacher_hidden, teacher_head, labels, mask


def assert_same_sums_and_grads(chunked: LossSums, reference: LossSums, params):
    for field in ("loss", "kd", "ce", "tv"):
        torch.testing.assert_close(getattr(chunked, field), getattr(reference, field), msg=field)
    assert chunked.num_tokens == reference.num_tokens
    got = torch.autograd.grad(chunked.loss, params)
    want = torch.autograd.grad(reference.loss, params)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


# the two ways chunked_distill_loss runs a head: a plain nn.Linear takes the fused path (closed-form gradients,
# distill/losses/fused.py), anything else (here the same Linear inside a Sequential) the checkpointed one
HEAD_PATHS = {"fused": lambda head: head, "checkpointed": lambda head: torch.nn.Sequential(head)}


@pytest.mark.parametrize("path", sorted(HEAD_PATHS))
@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("chunk_size", [1, 4, 5, 14, 100])
def test_chunked_equals_unchunked(loss, chunk_size, path):
    student_hidden, student_head, teacher_hidden, teacher_head, labels, mask = make_hidden_batch()
    options = dict(loss=loss, beta=0.3, temperature=1.5, ce_weight=0.25)
    chunked = chunked_distill_loss(student_hidden, HEAD_PATHS[path](student_head), teacher_hidden, labels, mask,
                                   teacher_head=teacher_head, chunk_size=chunk_size, **options)
    reference = distill_loss(student_head(student_hidden).flatten(0, 1), teacher_head(teacher_hidden).flatten(0, 1),
                             labels.flatten(), mask.flatten(), **options)
    assert reference.num_tokens == 14
    assert_same_sums_and_grads(chunked, reference, [student_hidden, student_head.weight])


@pytest.mark.parametrize("path", sorted(HEAD_PATHS))
@pytest.mark.parametrize("loss", ["forward_kl", "jsd", "tv"])
def test_under_bf16_autocast_the_heads_run_in_bf16_and_match_autocast_autograd(loss, path):
    """train.bf16 puts the loss under autocast (DistillTrainer.autocast_smart_context_manager): both heads' matmuls
    then run in bfloat16, the divergences in float32. The sums and gradients equal autograd through the plain
    formulas under the same autocast, and differ from float32 only by bfloat16 rounding."""
    student_hidden, student_head, teacher_hidden, teacher_head, labels, mask = make_hidden_batch(seed=7)
    hidden = student_hidden.detach().float().requires_grad_(True)
    heads = [head.float() for head in (student_head, teacher_head)]
    options = dict(loss=loss, beta=0.3, ce_weight=0.25)

    def reference() -> LossSums:
        return distill_loss(heads[0](hidden).flatten(0, 1), heads[1](teacher_hidden.float()).flatten(0, 1),
                            labels.flatten(), mask.flatten(), **options)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        chunked = chunked_distill_loss(hidden, HEAD_PATHS[path](heads[0]), teacher_hidden.float(), labels, mask,
                                       teacher_head=heads[1], chunk_size=5, **options)
        autocast_reference = reference()
    full = reference()
    params = [hidden, heads[0].weight]
    for field in ("loss", "kd", "ce", "tv"):
        torch.testing.assert_close(getattr(chunked, field), getattr(autocast_reference, field), rtol=2e-3, atol=2e-3)
        torch.testing.assert_close(getattr(chunked, field).float(), getattr(full, field), rtol=5e-2, atol=5e-2)
    assert chunked.loss.dtype == torch.float32 and chunked.loss.item() != full.loss.item()  # bf16 matmuls ran
    got = torch.autograd.grad(chunked.loss, params)
    want = torch.autograd.grad(autocast_reference.loss, params)
    exact = torch.autograd.grad(full.loss, params)
    for g, w, e in zip(got, want, exact):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=3e-2, atol=3e-2)
        assert F.cosine_similarity(g.flatten(), e.flatten(), dim=0) > 0.99


@pytest.mark.parametrize("loss,beta,temperature,ce_weight", [
    ("forward_kl", 0.5, 1.0, 0.0), ("reverse_kl", 0.5, 1.0, 0.0), ("jsd", 0.0, 1.0, 0.0), ("jsd", 1.0, 2.0, 0.5),
    ("jsd", 0.9, 1.0, 0.0), ("tv", 0.5, 0.7, 0.0), ("ce", 0.5, 1.0, 0.0), ("forward_kl", 0.5, 1.0, 1.0),
])
def test_fused_gradients_with_a_bias_match_autograd(loss, beta, temperature, ce_weight):
    """Closed-form gradients against autograd through the plain formulas, for the hidden states, the weight and
    the bias, at both JSD endpoints, other temperatures and a pure-ce mix."""
    student_hidden, _, teacher_hidden, teacher_head, labels, mask = make_hidden_batch(seed=4)
    torch.manual_seed(4)
    head = torch.nn.Linear(HIDDEN, STUDENT_VOCAB, bias=True, dtype=torch.float64)
    options = dict(loss=loss, beta=beta, temperature=temperature, ce_weight=ce_weight)
    fused = chunked_distill_loss(student_hidden, head, teacher_hidden, labels, mask, teacher_head=teacher_head,
                                 chunk_size=5, **options)
    reference = distill_loss(head(student_hidden).flatten(0, 1), teacher_head(teacher_hidden).flatten(0, 1),
                             labels.flatten(), mask.flatten(), **options)
    assert_same_sums_and_grads(fused, reference, [student_hidden, head.weight, head.bias])


def test_fused_path_with_a_frozen_head_gives_hidden_gradients_only():
    """A LoRA draft's lm_head is frozen: only the hidden states get a gradient, and it is the same."""
    student_hidden, student_head, teacher_hidden, teacher_head, labels, mask = make_hidden_batch(seed=5)
    reference = distill_loss(student_head(student_hidden).flatten(0, 1), teacher_head(teacher_hidden).flatten(0, 1),
                             labels.flatten(), mask.flatten(), loss="jsd", beta=0.4)
    (want,) = torch.autograd.grad(reference.loss, student_hidden)
    student_head.weight.requires_grad_(False)
    fused = chunked_distill_loss(student_hidden, student_head, teacher_hidden, labels, mask,
                                 teacher_head=teacher_head, chunk_size=4, loss="jsd", beta=0.4)
    fused.loss.backward()
    assert student_head.weight.grad is None
    torch.testing.assert_close(student_hidden.grad, want)


def test_fused_path_under_no_grad_gives_the_same_sums():
    student_hidden, student_head, teacher_hidden, teacher_head, labels, mask = make_hidden_batch(seed=6)
    options = dict(teacher_head=teacher_head, chunk_size=4, loss="reverse_kl", ce_weight=0.2)
    with_grad = chunked_distill_loss(student_hidden, student_head, teacher_hidden, labels, mask, **options)
    with torch.no_grad():
        without = chunked_distill_loss(student_hidden, student_head, teacher_hidden, labels, mask, **options)
    assert not without.loss.requires_grad
    for field in ("loss", "kd", "ce", "tv"):
        torch.testing.assert_close(getattr(without, field), getattr(with_grad, field).detach(), msg=field)


@pytest.mark.parametrize("path", sorted(HEAD_PATHS))
@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("k", [4, STUDENT_VOCAB])
def test_chunked_with_a_sparse_teacher_equals_unchunked(loss, k, path):
    student_hidden, student_head, teacher_hidden, teacher_head, labels, mask = make_hidden_batch(seed=1)
    with torch.no_grad():
        sparse = SparseTeacher.from_logits(teacher_head(teacher_hidden).flatten(0, 1)[:, :STUDENT_VOCAB], k=k)
    options = dict(loss=loss, beta=0.3, ce_weight=0.1)
    chunked = chunked_distill_loss(student_hidden, HEAD_PATHS[path](student_head), sparse, labels, mask,
                                   chunk_size=3, **options)
    reference = distill_loss(student_head(student_hidden).flatten(0, 1), sparse, labels.flatten(), mask.flatten(),
                             **options)
    assert_same_sums_and_grads(chunked, reference, [student_hidden, student_head.weight])


@contextlib.contextmanager
def recording_saved_shapes(shapes: list):
    """Append the shape of every tensor autograd saves for the backward pass to `shapes`."""
    def pack(tensor):
        shapes.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield


@pytest.mark.parametrize("loss", KD_LOSSES)
def test_fused_sparse_tail_from_the_top_k_alone_is_accurate_in_float32(loss):
    """The fused path takes the student's tail mass as 1 - sum_topk q (no [n, V] mask); with a peaked teacher
    (tail ~5e-4) in float32 it still matches the exact masked logsumexp of `bucketize`, values and gradients."""
    torch.manual_seed(12)
    n, hidden_size, vocab, k = 24, 16, 64, 8
    head = torch.nn.Linear(hidden_size, vocab, bias=False)
    hidden = torch.randn(1, n, hidden_size).requires_grad_(True)
    teacher_logits = head(hidden).detach()[0] + torch.randn(n, vocab)
    teacher_logits[torch.arange(n), torch.randint(0, vocab, (n,))] += 12.0
    sparse = SparseTeacher.from_logits(teacher_logits, k)
    labels, mask = torch.randint(0, vocab, (1, n)), torch.ones(1, n, dtype=torch.bool)
    fused = chunked_distill_loss(hidden, head, sparse, labels, mask, chunk_size=10, loss=loss, beta=0.5)
    reference = distill_loss(head(hidden)[0], sparse, labels[0], mask[0], loss=loss, beta=0.5)
    torch.testing.assert_close(fused.kd, reference.kd, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(fused.tv, reference.tv, rtol=1e-4, atol=1e-6)
    for got, want in zip(torch.autograd.grad(fused.loss, [hidden, head.weight]),
                         torch.autograd.grad(reference.loss, [hidden, head.weight])):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_fused_path_runs_each_head_once_and_keeps_no_logits():
    student_hidden, student_head, teacher_hidden, teacher_head, labels, mask = make_hidden_batch(seed=2)
    teacher_head_calls = []
    teacher_head.register_forward_hook(lambda module, args, out: teacher_head_calls.append(tuple(out.shape)))
    saved_shapes = []
    with recording_saved_shapes(saved_shapes):
        sums = chunked_distill_loss(student_hidden, student_head, teacher_hidden, labels, mask,
                                    teacher_head=teacher_head, chunk_size=4, loss="forward_kl", ce_weight=0.5)
    # autograd keeps the gradients computed on the way ([n, H] and [V, H]) and indices, never [*, V] logits
    assert saved_shapes and all(shape[-1:] not in ((STUDENT_VOCAB,), (TEACHER_VOCAB,)) for shape in saved_shapes)
    sums.loss.backward()
    assert teacher_head_calls == [(4, TEACHER_VOCAB)] * 3 + [(2, TEACHER_VOCAB)]  # once per chunk, not again
    assert torch.isfinite(student_hidden.grad).all()


def test_checkpointed_path_keeps_no_full_logits_for_backward():
    student_hidden, student_head, teacher_hidden, teacher_head, labels, mask = make_hidden_batch(seed=2)
    head_calls, teacher_head_calls = [], []
    student_head.register_forward_hook(lambda module, args, out: head_calls.append(tuple(out.shape)))
    teacher_head.register_forward_hook(lambda module, args, out: teacher_head_calls.append(tuple(out.shape)))
    saved_shapes = []
    with recording_saved_shapes(saved_shapes):
        sums = chunked_distill_loss(student_hidden, torch.nn.Sequential(student_head), teacher_hidden, labels, mask,
                                    teacher_head=teacher_head, chunk_size=4, loss="forward_kl", ce_weight=0.5)
    # outside the checkpoints autograd keeps only hidden-size tensors and indices, never [*, V] logits
    assert saved_shapes and all(shape[-1:] not in ((STUDENT_VOCAB,), (TEACHER_VOCAB,)) for shape in saved_shapes)
    assert head_calls == [(4, STUDENT_VOCAB)] * 3 + [(2, STUDENT_VOCAB)]
    sums.loss.backward()
    # backward recomputed each chunk's logits once, the teacher's too (none were kept alive between chunks)
    assert len(head_calls) == 8 and sorted(head_calls[4:]) == sorted(head_calls[:4])
    assert len(teacher_head_calls) == 8 and set(teacher_head_calls) == {(4, TEACHER_VOCAB), (2, TEACHER_VOCAB)}
    assert torch.isfinite(student_hidden.grad).all()


def test_chunked_gradient_accumulation_over_two_micro_batches():
    student_hidden, student_head, teacher_hidden, teacher_head, labels, mask = make_hidden_batch(seed=3)
    options = dict(teacher_head=teacher_head, chunk_size=3, loss="tv", ce_weight=0.3)
    full = chunked_distill_loss(student_hidden, student_head, teacher_hidden, labels, mask, **options)
    parts = [chunked_distill_loss(student_hidden[b:b + 1], student_head, teacher_hidden[b:b + 1], labels[b:b + 1],
                                  mask[b:b + 1], **options) for b in (0, 1)]
    accumulated = parts[0] + parts[1]
    assert accumulated.num_tokens == full.num_tokens == 14
    torch.testing.assert_close(accumulated.loss / accumulated.num_tokens, full.loss / full.num_tokens)


# ---------------------------------------------------------------------------------------------------------------
# Bad arguments
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,message", [
    (dict(loss="kl"), r"unknown loss 'kl'; allowed values: forward_kl, reverse_kl, jsd, tv, nla, lk_hybrid, ce"),
    (dict(loss="tvd"), r"unknown loss 'tvd' \(did you mean 'tv'\?\); allowed values: forward_kl, "),
    (dict(loss={"ce": 0.5, "lk_hybird": 0.5}), r"unknown loss 'lk_hybird' \(did you mean 'lk_hybrid'\?\)"),
    (dict(loss={"ce": 0.5, "tv": -0.5}), r"loss weight of 'tv' must be a number >= 0, got -0.5"),
    (dict(loss={}), r"a combination of losses needs at least one term"),
    (dict(loss={"tv": 1.0}, ce_weight=0.2), r"ce_weight must be 0 with a combination of losses"),
    (dict(loss="jsd", beta=-0.1), r"beta must be in \[0, 1\], got -0.1"),
    (dict(loss="jsd", beta=1.5), r"beta must be in \[0, 1\], got 1.5"),
    (dict(loss="forward_kl", temperature=0.0), r"temperature must be > 0, got 0.0"),
    (dict(loss="forward_kl", temperature=-1.0), r"temperature must be > 0, got -1.0"),
    (dict(loss="forward_kl", ce_weight=1.5), r"ce_weight must be in \[0, 1\], got 1.5"),
    (dict(loss="forward_kl", ce_weight=-0.1), r"ce_weight must be in \[0, 1\], got -0.1"),
])
def test_bad_arguments_raise_value_errors_naming_them(kwargs, message):
    student, teacher, labels, mask = make_batch()
    with pytest.raises(ValueError, match=message):
        distill_loss(student, teacher, labels, mask, **kwargs)
    student_hidden, student_head, teacher_hidden, teacher_head, labels, mask = make_hidden_batch()
    with pytest.raises(ValueError, match=message):
        chunked_distill_loss(student_hidden, student_head, teacher_hidden, labels, mask, teacher_head=teacher_head,
                             **kwargs)


def test_jsd_function_checks_beta():
    logp = F.log_softmax(random_logits(2, 3, seed=0), -1)
    with pytest.raises(ValueError, match="beta"):
        jsd(logp, logp, 2.0)


def test_missing_teacher_chunk_size_and_teacher_head_raise():
    student, _, labels, mask = make_batch()
    with pytest.raises(ValueError, match="loss='jsd' needs a teacher"):
        distill_loss(student, None, labels, mask, loss="jsd")
    student_hidden, student_head, teacher_hidden, teacher_head, labels, mask = make_hidden_batch()
    with pytest.raises(ValueError, match="chunk_size must be >= 1, got 0"):
        chunked_distill_loss(student_hidden, student_head, teacher_hidden, labels, mask, teacher_head=teacher_head,
                             chunk_size=0, loss="tv")
    with pytest.raises(ValueError, match="teacher_head"):
        chunked_distill_loss(student_hidden, student_head, teacher_hidden, labels, mask, loss="tv")


# ---------------------------------------------------------------------------------------------------------------
# nla and lk_hybrid: the acceptance-targeting losses, against autograd of plain formulas
# ---------------------------------------------------------------------------------------------------------------

def plain_acceptance_losses(s: torch.Tensor, teacher_logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """-log alpha and exp(-3 alpha) KL + (1 - exp(-3 alpha)) TV per row, from softmax by exp-and-divide; the
    lk_hybrid weight is computed from detached probabilities (a constant of the gradient)."""
    q = s.exp() / s.exp().sum(-1, keepdim=True)  # [N, V]
    p = teacher_logits.exp() / teacher_logits.exp().sum(-1, keepdim=True)
    alpha = torch.minimum(p, q).sum(-1)
    kl = (p * (p.log() - q.log())).sum(-1)
    tv = 0.5 * (p - q).abs().sum(-1)
    lam = torch.exp(-3.0 * torch.minimum(p, q.detach()).sum(-1))
    return {"nla": -alpha.log(), "lk_hybrid": lam * kl + (1 - lam) * tv}


@pytest.mark.parametrize("name", ["nla", "lk_hybrid"])
def test_acceptance_losses_value_and_closed_form_gradient_match_a_plain_formula(name):
    s = random_logits(7, 10, seed=20, scale=1.5, dtype=torch.float64).requires_grad_(True)
    teacher_logits = random_logits(7, 10, seed=21, scale=1.5, dtype=torch.float64)
    want = plain_acceptance_losses(s, teacher_logits)[name]
    (want_grad,) = torch.autograd.grad(want.sum(), s)
    teacher_logp = F.log_softmax(teacher_logits, -1)
    value, grad, tv = DIVERGENCES[name].value_and_grad(F.log_softmax(s, -1).detach(), teacher_logp, 0.5)
    torch.testing.assert_close(value, want.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-8, atol=1e-10)
    (autograd_of_value,) = torch.autograd.grad(per_token_divergence(name, F.log_softmax(s, -1), teacher_logp).sum(),
                                               s)
    torch.testing.assert_close(autograd_of_value, want_grad, rtol=1e-8, atol=1e-10)
    alpha = ref_acceptance(ref_probs(teacher_logits), ref_probs(s))
    torch.testing.assert_close(tv, 1 - alpha, rtol=1e-10, atol=1e-12)
    assert ((alpha > 0.1) & (alpha < 0.9)).all()  # a non-trivial overlap on every row


def test_lk_hybrid_weight_is_detached_and_moves_from_kl_to_tv():
    s = random_logits(6, 9, seed=22, dtype=torch.float64).requires_grad_(True)
    teacher_logits = random_logits(6, 9, seed=23, dtype=torch.float64)
    logq, logp = F.log_softmax(s, -1), F.log_softmax(teacher_logits, -1)
    (detached,) = torch.autograd.grad(lk_hybrid(logq, logp).sum(), s)
    # the same formula with lambda differentiated too gives another gradient: the detach is what we test
    logq = F.log_softmax(s, -1)
    alpha = acceptance_probability(logq, logp)
    attached = torch.exp(-3 * alpha) * forward_kl(logq, logp) + (1 - torch.exp(-3 * alpha)) * total_variation(logq,
                                                                                                            logp)
    (through_lambda,) = torch.autograd.grad(attached.sum(), s)
    assert (detached - through_lambda).abs().max() > 1e-3
    # alpha -> 1: lk_hybrid -> TV (lambda = e^-3 on a tiny KL); alpha -> 0: -> KL (lambda = 1)
    same = logp.clone()
    assert lk_hybrid(same, logp).abs().max() < 1e-12
    disjoint_q = torch.log(torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64))
    disjoint_p = torch.log(torch.tensor([[0.0, 0.5, 0.5]], dtype=torch.float64))
    assert lk_hybrid(disjoint_q.clamp_min(-700), disjoint_p).item() == pytest.approx(
        forward_kl(disjoint_q.clamp_min(-700), disjoint_p).item(), rel=1e-12)


def test_nla_is_finite_on_disjoint_supports_and_grows_as_acceptance_falls():
    student_logp = torch.tensor([[0.0, -math.inf, -math.inf]])
    teacher_logp = torch.tensor([[-math.inf, math.log(0.5), math.log(0.5)]])
    value, grad, tv = DIVERGENCES["nla"].value_and_grad(student_logp, teacher_logp.clamp_min(-1e30), 0.5)
    assert value.item() == pytest.approx(-math.log(ALPHA_FLOOR)) and torch.isfinite(grad).all() and tv.item() == 1
    t = F.log_softmax(random_logits(1, 8, seed=24), -1)
    values = [negative_log_acceptance(F.log_softmax(t * 0 + random_logits(1, 8, seed=25) * w, -1), t).item()
              for w in (0.0, 0.5, 2.0)]
    alphas = [acceptance_probability(F.log_softmax(random_logits(1, 8, seed=25) * w, -1), t).item()
              for w in (0.0, 0.5, 2.0)]
    assert values == pytest.approx([-math.log(a) for a in alphas], rel=1e-5)


def test_per_token_divergence_is_the_table_entry_and_names_a_bad_name():
    s, t = F.log_softmax(random_logits(4, 9, seed=26), -1), F.log_softmax(random_logits(4, 9, seed=27), -1)
    for name in DIVERGENCES:
        assert torch.equal(per_token_divergence(name, s, t, beta=0.3), DIVERGENCES[name].value(s, t, 0.3))
    with pytest.raises(ValueError, match=r"unknown loss 'ce'; allowed values: forward_kl, .*lk_hybrid$"):
        per_token_divergence("ce", s, t)
    with pytest.raises(ValueError, match=r"unknown loss 'nll' \(did you mean 'nla'\?\)"):
        per_token_divergence("nll", s, t)


# ---------------------------------------------------------------------------------------------------------------
# A weighted combination of losses: the weighted sum of the single losses, on every path
# ---------------------------------------------------------------------------------------------------------------

MIXES = [{"ce": 0.5, "tv": 0.5}, {"forward_kl": 0.3, "nla": 0.2, "ce": 0.25}, {"lk_hybrid": 1.0, "jsd": 0.0},
         {"reverse_kl": 2.0}]


def single_sums(name: str, student, teacher, labels, mask, **options) -> LossSums:
    return distill_loss(student, teacher if name != "ce" else None, labels, mask, loss=name, **options)


@pytest.mark.parametrize("mix", MIXES, ids=str)
@pytest.mark.parametrize("sparse", [False, True])
def test_a_combination_is_the_weighted_sum_of_its_single_losses(mix, sparse):
    student, teacher, labels, mask = make_batch(seed=7)
    teacher = SparseTeacher.from_logits(teacher, 4) if sparse else teacher
    options = dict(beta=0.3, temperature=1.0 if sparse else 1.5)
    combined = distill_loss(student, teacher, labels, mask, loss=mix, **options)
    singles = {name: single_sums(name, student, teacher, labels, mask, **options) for name in mix}
    want = sum(weight * singles[name].loss for name, weight in mix.items())
    torch.testing.assert_close(combined.loss, want)
    for got, expected in zip(torch.autograd.grad(combined.loss, student), torch.autograd.grad(want, student)):
        torch.testing.assert_close(got, expected)
    assert set(combined.terms) == set(mix)
    for name in mix:  # each term logged on its own, unweighted
        torch.testing.assert_close(combined.terms[name], singles[name].loss.detach())
    divergences = {n: w for n, w in mix.items() if n != "ce"}
    kd = sum(w * singles[n].loss for n, w in divergences.items()) / sum(divergences.values()) \
        if len(divergences) > 1 else singles[next(iter(divergences))].loss
    torch.testing.assert_close(combined.kd, kd.detach())
    torch.testing.assert_close(combined.tv, singles[next(iter(divergences))].tv)


def test_a_name_with_ce_weight_is_the_combination_it_stands_for():
    student, teacher, labels, mask = make_batch(seed=8)
    named = distill_loss(student, teacher, labels, mask, loss="nla", ce_weight=0.3)
    mixed = distill_loss(student, teacher, labels, mask, loss={"nla": 0.7, "ce": 0.3})
    for field in ("loss", "kd", "ce", "tv"):
        torch.testing.assert_close(getattr(named, field), getattr(mixed, field), msg=field)
    assert named.terms.keys() == {"nla", "ce"}


def test_only_ce_in_a_combination_needs_no_teacher_and_all_zero_weights_stay_connected():
    student, _, labels, mask = make_batch(seed=9)
    half = distill_loss(student, None, labels, mask, loss={"ce": 0.5})
    torch.testing.assert_close(half.loss, 0.5 * distill_loss(student, None, labels, mask, loss="ce").loss)
    _, teacher, _, _ = make_batch(seed=9)
    zero = distill_loss(student, teacher, labels, mask, loss={"tv": 0.0, "ce": 0.0})
    assert zero.loss.item() == 0 and zero.loss.requires_grad and zero.terms["tv"] > 0
    (grad,) = torch.autograd.grad(zero.loss, student)
    assert (grad == 0).all()


@pytest.mark.parametrize("path", sorted(HEAD_PATHS))
@pytest.mark.parametrize("mix", MIXES, ids=str)
@pytest.mark.parametrize("sparse", [False, True])
def test_chunked_combination_equals_unchunked(mix, path, sparse):
    student_hidden, student_head, teacher_hidden, teacher_head, labels, mask = make_hidden_batch(seed=11)
    with torch.no_grad():
        teacher_logits = teacher_head(teacher_hidden).flatten(0, 1)
    options = dict(loss=mix, beta=0.3, temperature=1.0 if sparse else 0.8)
    if sparse:
        teacher = reference_teacher = SparseTeacher.from_logits(teacher_logits[:, :STUDENT_VOCAB], k=4)
        kwargs = {}
    else:
        teacher, reference_teacher, kwargs = teacher_hidden, teacher_logits, dict(teacher_head=teacher_head)
    chunked = chunked_distill_loss(student_hidden, HEAD_PATHS[path](student_head), teacher, labels, mask,
                                   chunk_size=5, **kwargs, **options)
    reference = distill_loss(student_head(student_hidden).flatten(0, 1), reference_teacher, labels.flatten(),
                             mask.flatten(), **options)
    for name in mix:
        torch.testing.assert_close(chunked.terms[name], reference.terms[name], msg=name)
    assert_same_sums_and_grads(chunked, reference, [student_hidden, student_head.weight])


@pytest.mark.parametrize("loss,temperature,ce_weight", [
    ("nla", 1.0, 0.0), ("lk_hybrid", 1.0, 0.0), ("nla", 0.7, 0.4), ("lk_hybrid", 2.0, 0.2),
    ({"ce": 0.5, "nla": 0.25, "lk_hybrid": 0.25}, 1.0, 0.0), ({"tv": 0.0, "forward_kl": 1.5}, 1.3, 0.0),
])
def test_fused_gradients_of_the_new_losses_with_a_bias_match_autograd(loss, temperature, ce_weight):
    student_hidden, _, teacher_hidden, teacher_head, labels, mask = make_hidden_batch(seed=12)
    torch.manual_seed(12)
    head = torch.nn.Linear(HIDDEN, STUDENT_VOCAB, bias=True, dtype=torch.float64)
    options = dict(loss=loss, temperature=temperature, ce_weight=ce_weight)
    fused = chunked_distill_loss(student_hidden, head, teacher_hidden, labels, mask, teacher_head=teacher_head,
                                 chunk_size=4, **options)
    reference = distill_loss(head(student_hidden).flatten(0, 1), teacher_head(teacher_hidden).flatten(0, 1),
                             labels.flatten(), mask.flatten(), **options)
    assert_same_sums_and_grads(fused, reference, [student_hidden, head.weight, head.bias])
