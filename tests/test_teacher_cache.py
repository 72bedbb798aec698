"""Cached top-k teacher: same loss as the online teacher at k = V, close at small k; mismatches, reuse, resume."""
from __future__ import annotations

import copy
import json

import datasets
import pytest
import torch
from torch.utils.data import DataLoader
from transformers import Trainer, TrainingArguments

import distill.data.teacher_cache as teacher_cache
from distill.data.rows import IGNORE_INDEX, DistillCollator
from distill.data.shard_store import CacheMismatchError
from distill.data.teacher_cache import (
    METADATA_FILE,
    TEACHER_COLUMNS,
    TeacherCollator,
    build_teacher_cache,
    load_teacher_cache,
    sparse_teacher_from_batch,
    with_teacher_columns,
)
from distill.losses.distill_loss import chunked_distill_loss

from helpers import ForwardCounter, record_packing
from tiny import perturbed_copy, save_and_load, tiny_model, tiny_tokenizer

VOCAB = 96


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return save_and_load(tiny_model(vocab_size=VOCAB, seed=0), tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="module")
def sharp_target(tmp_path_factory):
    """The target with logits 6x larger: its top-16 tokens hold > 99% of the mass, like a trained LLM's."""
    model = tiny_model(vocab_size=VOCAB, seed=0)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(6.0)
    return save_and_load(model, tmp_path_factory.mktemp("sharp_target"))


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    return save_and_load(tiny_model(vocab_size=VOCAB, hidden=16, layers=1, seed=3), tmp_path_factory.mktemp("draft"))


@pytest.fixture(scope="module")
def rows():
    """Training rows of 6..20 random tokens; the first 3 labels are -100 (a prompt, as in chat data)."""
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(4, VOCAB, (int(n),), generator=g).tolist() for n in torch.randint(6, 21, (12,), generator=g)]
    labels = [[IGNORE_INDEX] * 3 + row[3:] for row in ids]
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": labels})


@pytest.fixture(scope="module")
def cache_k4(target, rows, tokenizer, tmp_path_factory):
    return build_teacher_cache(target, rows, tmp_path_factory.mktemp("cache_k4"), k=4, batch_size=4,
                               target_id="tiny-target", tokenizer=tokenizer, rows_per_shard=5, progress=False)


def build(target, rows, tokenizer, path, **kwargs):
    settings = dict(k=4, batch_size=4, target_id="tiny-target", tokenizer=tokenizer, rows_per_shard=5,
                    progress=False)
    return build_teacher_cache(target, rows, path, **{**settings, **kwargs})


# ---------------------------------------------------------------------------------------------------------------
# The loss from the cache against the online teacher (the trainer's computation)
# ---------------------------------------------------------------------------------------------------------------

def one_batch(rows, cache):
    loader = DataLoader(with_teacher_columns(rows, cache), batch_size=len(rows),
                        collate_fn=TeacherCollator(DistillCollator(pad_token_id=0)))
    return next(iter(loader))


def draft_hidden(draft, batch):
    out = draft(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
    return out.hidden_states[-1]  # [B, T, H]


def online_loss(draft, target, batch, loss):
    with torch.no_grad():
        teacher_hidden = target.base_model(input_ids=batch["input_ids"],
                                           attention_mask=batch["attention_mask"]).last_hidden_state
    return chunked_distill_loss(draft_hidden(draft, batch)[:, :-1], draft.get_output_embeddings(),
                                teacher_hidden[:, :-1], batch["labels"][:, 1:], batch["attention_mask"][:, 1:].bool(),
                                teacher_head=target.get_output_embeddings(), chunk_size=16, loss=loss)


def cached_loss(draft, batch, loss):
    return chunked_distill_loss(draft_hidden(draft, batch)[:, :-1], draft.get_output_embeddings(),
                                sparse_teacher_from_batch(batch), batch["labels"][:, 1:],
                                batch["attention_mask"][:, 1:].bool(), chunk_size=16, loss=loss)


def loss_and_grads(draft, compute):
    draft.zero_grad()
    sums = compute()
    sums.loss.backward()
    return sums, [p.grad.clone() for p in draft.parameters()]


@pytest.mark.parametrize("loss", ["forward_kl", "tv"])
def test_full_width_cache_gives_the_online_loss_and_gradients(target, draft, rows, tokenizer, tmp_path, loss):
    cache = build(target, rows, tokenizer, tmp_path, k=VOCAB, logprob_dtype="float32")
    batch = one_batch(rows, cache)
    online, online_grads = loss_and_grads(draft, lambda: online_loss(draft, target, batch, loss))
    cached, cached_grads = loss_and_grads(draft, lambda: cached_loss(draft, batch, loss))
    assert cached.num_tokens == online.num_tokens == sum(len(r) - 3 for r in rows["input_ids"])
    torch.testing.assert_close(cached.loss, online.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cached.tv, online.tv, rtol=1e-5, atol=1e-6)
    for got, want in zip(cached_grads, online_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("loss", ["forward_kl", "tv"])
def test_float16_log_probabilities_move_the_loss_by_less_than_1e4(target, draft, rows, tokenizer, tmp_path, loss):
    # storage rounding only: |error of log p| <= |log p| * 2**-11, then renormalised (measured: ~1e-6 relative)
    cache = build(target, rows, tokenizer, tmp_path, k=VOCAB, logprob_dtype="float16")
    batch = one_batch(rows, cache)
    with torch.no_grad():
        online = online_loss(draft, target, batch, loss).loss
        cached = cached_loss(draft, batch, loss).loss
    torch.testing.assert_close(cached, online, rtol=1e-4, atol=0)


@pytest.mark.parametrize("loss", ["forward_kl", "tv"])
def test_small_k_cache_of_a_sharp_target_stays_close_to_the_online_loss(sharp_target, draft, rows, tokenizer,
                                                                         tmp_path, loss):
    # k = 16 of 96 tokens, float16 log-probs. Merging the 80 tail tokens into one bucket can only lower an
    # f-divergence; the gap scales with the teacher's tail mass, here ~0.3% (an LLM's top-16 is usually as sharp).
    # Measured: -0.19% (forward_kl), -0.0004% (tv).
    cache = build(sharp_target, rows, tokenizer, tmp_path, k=16, logprob_dtype="float16")
    batch = one_batch(rows, cache)
    with torch.no_grad():
        online = online_loss(draft, sharp_target, batch, loss).loss
        cached = cached_loss(draft, batch, loss).loss
    assert online * (1 - 0.01) < cached < online * (1 + 1e-4)


def test_small_k_total_variation_is_below_the_online_one_by_at_most_the_tail_mass(target, draft, rows, tokenizer,
                                                                                    tmp_path):
    # TV_dense - TV_buckets = (sum_tail |p - q| - |P_tail - Q_tail|) / 2, in [0, min(P_tail, Q_tail)] per token.
    # The tiny random target is flat (top-16 mass ~0.46), so here the gap is large (~27%) but still bounded.
    cache = build(target, rows, tokenizer, tmp_path, k=16, logprob_dtype="float32")
    batch = one_batch(rows, cache)
    with torch.no_grad():
        online = online_loss(draft, target, batch, "tv").loss
        cached = cached_loss(draft, batch, "tv").loss
    keep = (batch["labels"][:, 1:] != IGNORE_INDEX) & batch["attention_mask"][:, 1:].bool()  # [B, T-1]
    tail_mass = 1 - batch[TEACHER_COLUMNS[1]][:, :-1][keep].exp().sum(dim=-1)  # [n]
    assert 0.1 * online < online - cached <= tail_mass.sum() + 1e-4


def test_cached_topk_is_the_top_of_the_targets_own_logits(target, rows, cache_k4):
    for index in (0, 7):
        ids = torch.tensor([rows[index]["input_ids"]])
        with torch.no_grad():
            logprobs = torch.log_softmax(target(ids).logits[0].float(), dim=-1)  # [T, V]
        want = logprobs.topk(4, dim=-1)
        got_ids, got_logprobs = cache_k4.topk([index])
        assert torch.equal(got_ids[0], want.indices)
        # float16 storage: |error| <= |log p| * 2**-11
        torch.testing.assert_close(got_logprobs[0], want.values, rtol=2 ** -10, atol=1e-6)


def test_sparse_teacher_rows_are_flattened_positions_with_valid_pads(cache_k4, rows):
    teacher = cache_k4.sparse_teacher([3, 0], width=25)
    assert len(teacher) == 2 * 25
    for b, index in enumerate((3, 0)):
        ids, logprobs = cache_k4.topk([index])
        n = len(rows[index]["input_ids"])
        assert torch.equal(teacher.topk_ids[b * 25:b * 25 + n], ids[0])
        assert torch.equal(teacher.topk_logprobs[b * 25:b * 25 + n], logprobs[0])
        pads = teacher.topk_ids[b * 25 + n:(b + 1) * 25]
        assert torch.equal(pads, torch.arange(4).expand_as(pads))


def test_metadata_describes_the_cache(cache_k4, rows, tokenizer):
    meta = json.loads((cache_k4.path / METADATA_FILE).read_text())
    lengths = [len(r) for r in rows["input_ids"]]
    assert meta["complete"] and meta["k"] == 4 and meta["vocab_size"] == VOCAB and meta["temperature"] == 1.0
    assert (meta["num_rows"], meta["max_length"], meta["num_positions"]) == (12, max(lengths), sum(lengths))
    assert (meta["target_id"], meta["logprob_dtype"], meta["num_shards"]) == ("tiny-target", "float16", 3)
    assert meta["bytes_on_disk"] > sum(lengths) * 4 * (4 + 2)


def test_the_build_runs_the_target_on_packed_layers_and_restores_it(target, rows, tokenizer, tmp_path, cache_k4,
                                                                     monkeypatch):
    """On CPU the target's forwards over the rows multiply by oneDNN-packed weights during the build (faster than
    F.linear); the cache holds the same top-k ids, and the target is its own nn.Linear layers again after."""
    from decode.loop.packed_linear import packed_layers

    if not torch.backends.mkldnn.is_available():
        pytest.skip("oneDNN is not built into torch")
    seen = record_packing(monkeypatch, teacher_cache, "teacher_topk")
    rebuilt = build(target, rows, tokenizer, tmp_path)
    assert seen and all(seen) and not packed_layers(target)
    assert rebuilt.topk(range(len(rows)))[0].tolist() == cache_k4.topk(range(len(rows)))[0].tolist()


def test_the_cache_build_benchmark_turns_packing_off_and_back_on(target, rows, tokenizer, tmp_path, monkeypatch):
    """scripts/bench_cache_builds.py times the builds with the packing made a no-op; the builds pack again after."""
    import distill.data.row_cache as row_cache
    from decode.loop.packed_linear import packed_linears
    from scripts import bench_cache_builds

    seen = record_packing(monkeypatch, teacher_cache, "teacher_topk")
    with bench_cache_builds.linear_mode("F.linear"):
        build(target, rows, tokenizer, tmp_path / "f_linear")
    assert seen and not any(seen) and row_cache.packed_linears is packed_linears
    if torch.backends.mkldnn.is_available():
        seen.clear()
        with bench_cache_builds.linear_mode("packed"):
            build(target, rows, tokenizer, tmp_path / "packed")
        assert seen and all(seen)


# ---------------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [0, VOCAB + 1])
def test_k_outside_the_vocabulary_is_refused_before_anything_runs(target, rows, tokenizer, tmp_path, k):
    with pytest.raises(ValueError, match=rf"k={k} .*vocabulary has {VOCAB} tokens"):
        build(target, rows, tokenizer, tmp_path, k=k)
    assert not (tmp_path / METADATA_FILE).exists()


def test_load_names_the_mismatched_target(cache_k4, target):
    other_weights = perturbed_copy(target, 0.1)
    with pytest.raises(CacheMismatchError, match="target weights") as err:
        load_teacher_cache(cache_k4.path, target=other_weights)
    assert "target config" not in str(err.value)
    with pytest.raises(CacheMismatchError, match="target config"):
        load_teacher_cache(cache_k4.path, target=tiny_model(vocab_size=VOCAB, layers=3))
    with pytest.raises(CacheMismatchError, match="target \\(target_id\\): 'tiny-target' in the teacher cache, "
                                                 "expected 'other/model'"):
        load_teacher_cache(cache_k4.path, target_id="other/model")


def test_load_names_the_mismatched_tokenizer_dataset_and_k(cache_k4, rows, tokenizer):
    with pytest.raises(CacheMismatchError, match="tokenizer vocabulary"):
        load_teacher_cache(cache_k4.path, tokenizer=tiny_tokenizer(vocab_size=300))
    changed = rows.map(lambda row, i: {"input_ids": row["input_ids"][:-1] + [5] if i == 4 else row["input_ids"]},
                       with_indices=True)
    with pytest.raises(CacheMismatchError, match="dataset tokens") as err:
        load_teacher_cache(cache_k4.path, dataset=changed)
    assert "number of dataset rows" not in str(err.value)
    with pytest.raises(CacheMismatchError, match="number of dataset rows"):
        load_teacher_cache(cache_k4.path, dataset=rows.select(range(6)))
    with pytest.raises(CacheMismatchError, match="top-k width \\(k\\)"):
        load_teacher_cache(cache_k4.path, k=8)
    # everything matching: opens
    same = load_teacher_cache(cache_k4.path, target_id="tiny-target", tokenizer=tokenizer, dataset=rows, k=4)
    assert len(same) == len(rows)


def test_teacher_columns_refuse_a_reordered_dataset(cache_k4, rows):
    with pytest.raises(CacheMismatchError, match="other order"):
        with_teacher_columns(rows.shuffle(seed=0), cache_k4)
    with pytest.raises(CacheMismatchError, match="12"):
        with_teacher_columns(rows.select(range(5)), cache_k4)


def test_collator_refuses_rows_whose_cache_has_another_length(cache_k4, rows):
    row = with_teacher_columns(rows, cache_k4)[0]
    row = {**row, "input_ids": row["input_ids"] + [7], "labels": row["labels"] + [7]}
    with pytest.raises(ValueError, match="cached teacher positions"):
        TeacherCollator(DistillCollator(pad_token_id=0))([row])


def test_building_into_a_folder_of_another_cache_is_refused_unless_overwrite(target, rows, tokenizer, cache_k4):
    with pytest.raises(CacheMismatchError, match="overwrite=True") as err:
        build(target, rows, tokenizer, cache_k4.path, k=8)
    assert "top-k width (k): 4 in the teacher cache, expected 8" in str(err.value)
    assert load_teacher_cache(cache_k4.path).k == 4  # untouched


def test_overwrite_replaces_another_cache(target, rows, tokenizer, tmp_path):
    build(target, rows, tokenizer, tmp_path, k=4)
    assert build(target, rows, tokenizer, tmp_path, k=8, overwrite=True).k == 8


# ---------------------------------------------------------------------------------------------------------------
# Reuse and resume
# ---------------------------------------------------------------------------------------------------------------

def test_rebuilding_with_the_same_inputs_reuses_the_cache(target, rows, tokenizer, cache_k4):
    counter = ForwardCounter(target)
    try:
        again = build(target, rows, tokenizer, cache_k4.path, rows_per_shard=7)
    finally:
        counter.remove()
    assert counter.calls == 0
    assert torch.equal(again.topk(range(12))[0], cache_k4.topk(range(12))[0])


def test_an_interrupted_build_resumes_after_its_last_complete_shard(target, rows, tokenizer, tmp_path, cache_k4):
    # 12 rows, shards of 4 rows, batches of 2 rows: 6 forward passes; pass 4 (inside shard 2) is interrupted
    counter = ForwardCounter(target, fail_at=4)
    try:
        with pytest.raises(KeyboardInterrupt):
            build(target, rows, tokenizer, tmp_path, batch_size=2, rows_per_shard=4)
    finally:
        counter.remove()
    with pytest.raises(FileNotFoundError, match="unfinished"):
        load_teacher_cache(tmp_path)

    counter = ForwardCounter(target)
    try:
        resumed = build(target, rows, tokenizer, tmp_path, batch_size=2, rows_per_shard=4)
    finally:
        counter.remove()
    assert counter.calls == 4  # shards 2 and 3 only
    ids, logprobs = resumed.topk(range(12))
    want_ids, want_logprobs = cache_k4.topk(range(12))
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(logprobs, want_logprobs, rtol=0, atol=1e-3)  # other batching: float noise only


def test_a_target_with_a_few_changed_embedding_rows_never_reuses_the_cache(cache_k4, target):
    """A target re-saved after a fine-tune that rewrote 8 embedding rows (new chat tokens) is another target, also when
    the change misses every value a strided sample reads (1024 of the embedding's 3072, stride 3): its teacher cache
    is refused with one error naming the weights, never reused; the same weights loaded again are the same target."""
    changed = copy.deepcopy(target)
    with torch.no_grad():
        flat = changed.get_input_embeddings().weight.view(-1)
        rows = torch.arange((VOCAB - 8) * flat.numel() // VOCAB, flat.numel())
        flat[rows[rows % 3 != 0]] += 0.5
    with pytest.raises(CacheMismatchError, match="target weights"):
        load_teacher_cache(cache_k4.path, target=changed)
    load_teacher_cache(cache_k4.path, target=copy.deepcopy(target))


def test_teacher_columns_travel_through_a_dataloader_with_shuffling(cache_k4, rows):
    dataset = with_teacher_columns(rows, cache_k4)
    loader = DataLoader(dataset, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(0),
                        collate_fn=TeacherCollator(DistillCollator(pad_token_id=0)))
    for batch in loader:
        assert batch[TEACHER_COLUMNS[0]].shape[:2] == batch["input_ids"].shape
        for b in range(batch["input_ids"].shape[0]):
            n = int(batch["attention_mask"][b].sum())
            index = [i for i, r in enumerate(rows["input_ids"]) if r == batch["input_ids"][b, :n].tolist()][0]
            assert torch.equal(batch[TEACHER_COLUMNS[0]][b, :n], cache_k4.topk([index])[0][0])


# ---------------------------------------------------------------------------------------------------------------
# Through transformers.Trainer: the columns reach compute_loss and the draft learns without a target forward
# ---------------------------------------------------------------------------------------------------------------

class CachedKDTrainer(Trainer):
    """The smallest Trainer that distils from cached teacher columns (what DistillTrainer does with a cache)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        hidden = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                       output_hidden_states=True).hidden_states[-1]  # [B, T, H]
        sums = chunked_distill_loss(hidden[:, :-1], model.get_output_embeddings(), sparse_teacher_from_batch(inputs),
                                    inputs["labels"][:, 1:], inputs["attention_mask"][:, 1:].bool(), loss="forward_kl")
        return sums.loss / sums.num_tokens


def test_trainer_distils_from_the_cache_without_running_the_target(target, rows, tokenizer, tmp_path):
    cache = build(target, rows, tokenizer, tmp_path / "cache", k=16)
    draft = tiny_model(vocab_size=VOCAB, hidden=16, layers=1, seed=3).train()
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=30, per_device_train_batch_size=4,
                             learning_rate=1e-2, lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
                             report_to="none", use_cpu=True, remove_unused_columns=False, seed=0)
    trainer = CachedKDTrainer(model=draft, args=args, train_dataset=with_teacher_columns(rows, cache),
                              data_collator=TeacherCollator(DistillCollator(pad_token_id=0)))
    counter = ForwardCounter(target)
    try:
        trainer.train()
    finally:
        counter.remove()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert counter.calls == 0
    assert len(losses) == 30 and sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
