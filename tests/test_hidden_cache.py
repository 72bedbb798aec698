"""Hidden-state cache of EAGLE-3 heads (distill.hidden_state_cache): the cached features are the target's, a head
trained from them has the online loss curve, builds resume and refuse other inputs, and heads train from the cache
under ZeRO-3 and FSDP2 (2 CPU processes) as on one process; the recipe's refusals."""
from __future__ import annotations

import copy
import json
import shlex
import sys
from pathlib import Path

import datasets
import pytest
import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM

from distill.data.hidden_cache import (
    METADATA_FILE,
    HiddenStateCollator,
    build_hidden_cache,
    cached_features,
    load_hidden_cache,
    target_features,
    with_hidden_columns,
)
from distill.data.rows import IGNORE_INDEX, DistillCollator
from distill.data.shard_store import CacheMismatchError
from distill.fingerprints import full_weights_hash
from distill.models import load
from distill.utils import ModelSetupError
from kinds.eagle3 import trainer as head_trainer
from kinds.eagle3.model import Eagle3Head
from specdistill.recipes import ModelConfig

from helpers import (
    ROOT,
    TINY_RECIPE,
    ForwardCounter,
    accelerate_command,
    assert_same_weights,
    cli_error,
    run_process,
    torchrun,
    train_script,
)
from tiny import TINY_TEXT, perturbed_copy, save_and_load, tiny_model, tiny_tokenizer

VOCAB = 96
AUX = [1, 2, 3]
HEAD_RECIPE = str(ROOT / "recipes" / "tiny_eagle3.yaml")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return save_and_load(tiny_model(vocab_size=VOCAB, layers=4, seed=0), tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="module")
def rows():
    """12 training rows of 6..20 random tokens; the first 3 labels are -100 (a prompt)."""
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(4, VOCAB, (int(n),), generator=g).tolist() for n in torch.randint(6, 21, (12,), generator=g)]
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": [[IGNORE_INDEX] * 3 + r[3:] for r in ids]})


def build(target, rows, path, **kwargs):
    settings = dict(aux_layers=AUX, batch_size=4, target_id="tiny-target", rows_per_shard=5, dtype="float32",
                    progress=False)
    return build_hidden_cache(target, rows, path, **{**settings, **kwargs})


@pytest.fixture(scope="module")
def cache32(target, rows, tmp_path_factory):
    return build(target, rows, tmp_path_factory.mktemp("cache32"))


def alone(target, row: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """target_features of one row run alone: ([T, 3 H], [T, H])."""
    ids = torch.tensor([row])
    with torch.no_grad():
        aux, final = target_features(target, ids, torch.ones_like(ids), AUX)
    return aux[0], final[0]


# ---------------------------------------------------------------------------------------------------------------
# (a) the cached features are the target's
# ---------------------------------------------------------------------------------------------------------------

def test_float32_cache_holds_the_targets_features_exactly(target, rows, tmp_path):
    cache = build(target, rows, tmp_path, batch_size=1)  # one row per forward: the very computation of `alone`
    aux, final = cache.features(range(len(rows)))  # [12, W, 3 H], [12, W, H]
    assert aux.dtype == final.dtype == torch.float32 and aux.shape[-1] == 3 * final.shape[-1] == 96
    for i, row in enumerate(rows["input_ids"]):
        want_aux, want_final = alone(target, row)
        assert torch.equal(aux[i, :len(row)], want_aux) and torch.equal(final[i, :len(row)], want_final)
        assert not aux[i, len(row):].any()  # pads are zeros
    # batched builds (right padding) differ by float noise only
    batched_aux, batched_final = load_hidden_cache(cache.path).features(range(len(rows)))
    torch.testing.assert_close(build(target, rows, tmp_path / "b4").features(range(len(rows)))[0], batched_aux,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype, rtol", [("bfloat16", 2**-8), ("float16", 2**-10)])
def test_narrow_storage_rounds_each_value_once(target, rows, cache32, tmp_path, dtype, rtol):
    cache = build(target, rows, tmp_path, dtype=dtype)
    aux, final = cache.features(range(len(rows)))
    want_aux, want_final = cache32.features(range(len(rows)))
    assert aux.dtype == final.dtype == getattr(torch, dtype)
    assert torch.equal(aux, want_aux.to(aux.dtype)) and torch.equal(final, want_final.to(final.dtype))
    torch.testing.assert_close(aux.float(), want_aux, rtol=rtol, atol=1e-6)


def test_metadata_records_what_the_cache_holds_and_its_bytes_per_token(cache32, rows, target):
    meta = json.loads((cache32.path / METADATA_FILE).read_text())
    assert meta["complete"] and meta["aux_layers"] == AUX and meta["hidden_size"] == 32 and meta["dtype"] == "float32"
    assert meta["num_positions"] == sum(len(r) for r in rows["input_ids"]) and meta["num_rows"] == 12
    assert meta["bytes_per_token"] == 4 * 32 * 4  # (3 aux + final) x H' values x 4 bytes
    assert meta["target_weights_hash"] == full_weights_hash(target) and meta["target_dtype"] == "float32"
    assert meta["bytes_on_disk"] / meta["num_positions"] > meta["bytes_per_token"]  # arrow adds a little


# ---------------------------------------------------------------------------------------------------------------
# (c) resume, reuse, mismatches
# ---------------------------------------------------------------------------------------------------------------

def test_an_interrupted_build_resumes_to_the_uninterrupted_cache(target, rows, cache32, tmp_path):
    # 12 rows, shards of 5 rows, batches of 4: passes 1-2 shard 0, 3-4 shard 1, 5 shard 2; pass 3 is interrupted
    counter = ForwardCounter(target, fail_at=3)
    try:
        with pytest.raises(KeyboardInterrupt):
            build(target, rows, tmp_path)
    finally:
        counter.remove()
    with pytest.raises(FileNotFoundError, match="unfinished"):
        load_hidden_cache(tmp_path)
    counter = ForwardCounter(target)
    try:
        resumed = build(target, rows, tmp_path)
        again = build(target, rows, tmp_path)  # complete: reused as it is
    finally:
        counter.remove()
    assert counter.calls == 3  # shards 1 and 2 only, then nothing
    for got, want in zip(resumed.features(range(12)), cache32.features(range(12))):
        assert torch.equal(got, want)
    assert torch.equal(again.features(range(12))[0], cache32.features(range(12))[0])


def test_a_cache_of_other_inputs_is_refused_naming_what_differs(target, rows, cache32):
    other_rows = rows.select(list(reversed(range(12))))
    cases = [(dict(target=perturbed_copy(target, 1e-3)), "target weights \\(target_weights_hash\\)"),
             (dict(target=copy.deepcopy(target).to(torch.bfloat16)), "target dtype"),
             (dict(rows=other_rows), "dataset tokens"),
             (dict(aux_layers=[0, 1, 2]), "aux layer ids \\(aux_layers\\): \\[1, 2, 3\\] in the hidden-state cache, "
                                          "expected \\[0, 1, 2\\]"),
             (dict(dtype="bfloat16"), "storage dtype")]
    for change, named in cases:
        inputs = {"target": target, "rows": rows, **change}
        settings = {k: v for k, v in change.items() if k not in ("target", "rows")}
        with pytest.raises(CacheMismatchError, match=named):
            build(inputs["target"], inputs["rows"], cache32.path, **settings)
    with pytest.raises(CacheMismatchError, match="target weights"):
        load_hidden_cache(cache32.path, target=perturbed_copy(target, 1e-3))
    load_hidden_cache(cache32.path, target=target, dataset=rows, aux_layers=AUX, dtype="float32")  # the same: opens
    with pytest.raises(CacheMismatchError, match="other order"):
        with_hidden_columns(other_rows, cache32)


def test_the_full_weights_hash_sees_a_change_a_strided_sample_misses(target):
    """Every byte counts: a change between the values a strided sample of 1024 per tensor reads (the embedding's
    3072 values at stride 3), and one below bfloat16's precision, change the hash; any chunking does not."""
    changed = copy.deepcopy(target)
    with torch.no_grad():
        embed = changed.get_input_embeddings().weight  # [96, 32]: 3072 values; a stride-3 sample skips index 1
        embed.view(-1)[1] += 1.0
    assert full_weights_hash(changed) != full_weights_hash(target)
    below_bfloat16 = copy.deepcopy(target)
    with torch.no_grad():
        weight = below_bfloat16.get_input_embeddings().weight
        weight.view(-1)[40] = weight.view(-1)[40] * (1 + 2 ** -12)  # bfloat16 keeps 8 bits of mantissa (row 0: padding)
    assert weight.view(-1)[40] != target.get_input_embeddings().weight.view(-1)[40]
    assert weight.view(-1)[40].bfloat16() == target.get_input_embeddings().weight.view(-1)[40].bfloat16()
    assert full_weights_hash(below_bfloat16) != full_weights_hash(target)
    assert full_weights_hash(copy.deepcopy(target)) == full_weights_hash(target)
    assert full_weights_hash(target, chunk_values=7) == full_weights_hash(target)  # streamed in any chunks


def test_collator_pads_the_cached_columns_to_the_batch(cache32, rows):
    loader = DataLoader(with_hidden_columns(rows, cache32), batch_size=5, shuffle=True,
                        generator=torch.Generator().manual_seed(0),
                        collate_fn=HiddenStateCollator(DistillCollator(pad_token_id=0), "float32"))
    for batch in loader:
        aux, final = cached_features(batch)
        assert aux.shape[:2] == final.shape[:2] == batch["input_ids"].shape
        for b in range(batch["input_ids"].shape[0]):
            n = int(batch["attention_mask"][b].sum())
            index = rows["input_ids"].index(batch["input_ids"][b, :n].tolist())
            want_aux, want_final = cache32.features([index])
            assert torch.equal(aux[b, :n], want_aux[0]) and torch.equal(final[b, :n], want_final[0])
    row = {**with_hidden_columns(rows, cache32)[0]}
    row["input_ids"] = row["input_ids"][:-1]
    with pytest.raises(ValueError, match="cached hidden-state positions"):
        HiddenStateCollator(DistillCollator(pad_token_id=0), "float32")([row])
    assert cached_features({"input_ids": torch.zeros(1, 2)}) is None


# ---------------------------------------------------------------------------------------------------------------
# (e) recipe refusals
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture
def no_weights(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("model weights were loaded before the error")
    monkeypatch.setattr(load, "load_target", refuse)


def test_recipes_refuse_the_wrong_cache_for_the_draft_kind(monkeypatch, capsys, no_weights, tmp_path):
    message = cli_error(monkeypatch, capsys, HEAD_RECIPE, "model.target=t", "data.dataset=x.txt",
                        "distill.teacher_cache=cache")
    assert "distill.teacher_cache: got 'cache'; allowed: null with model.draft_kind eagle3" in message
    assert "use distill.hidden_state_cache" in message
    message = cli_error(monkeypatch, capsys, TINY_RECIPE, "model.target=t", "data.dataset=x.txt",
                        "distill.hidden_state_cache=cache")
    assert "distill.hidden_state_cache: got 'cache'; allowed: null with model.draft_kind standalone" in message
    message = cli_error(monkeypatch, capsys, HEAD_RECIPE, "model.target=t", "data.dataset=x.txt",
                        "distill.hidden_state_cache=cache", "distill.hidden_state_cache_dtype=int8")
    assert "distill.hidden_state_cache_dtype" in message and "bfloat16" in message


@pytest.mark.parametrize("mode", ["zero3_enabled", "fsdp_enabled"])
def test_heads_under_zero3_or_fsdp_need_the_hidden_state_cache(monkeypatch, target, tmp_path, mode):
    import distill.models.distributed as distributed
    import distill.models.fsdp as fsdp

    target.save_pretrained(tmp_path)
    monkeypatch.setattr(distributed if mode == "zero3_enabled" else fsdp, mode, lambda: True)
    cfg = ModelConfig(target=str(tmp_path), draft_kind="eagle3")
    with pytest.raises(ModelSetupError, match="only from distill.hidden_state_cache"):
        load.check_model_plan(cfg, tiny_tokenizer())
    load.check_model_plan(cfg, tiny_tokenizer(), hidden_state_cache=True)


# ---------------------------------------------------------------------------------------------------------------
# (b) training from the cache = training online; (d) under ZeRO-3 and FSDP2 = one process
# ---------------------------------------------------------------------------------------------------------------

CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """target/ (a 4-layer tiny Llama with a chat-template tokenizer), code.txt, chat.jsonl (rows of 1..4 blocks)."""
    root = tmp_path_factory.mktemp("hidden_runs")
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    tiny_model("llama", vocab_size=len(tokenizer), hidden=32, layers=4).save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    (root / "code.txt").write_text(TINY_TEXT)
    blocks = TINY_TEXT.split("\n\n")[:4]
    chat = [{"messages": [{"role": "user", "content": f"show {i}"},
                          {"role": "assistant", "content": "\n".join(blocks[: 1 + i % 4])}]} for i in range(36)]
    (root / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat))
    return root


def run(workdir: Path, out: str, *overrides: str) -> Path:
    train_script.main([HEAD_RECIPE, f"model.target={workdir / 'target'}", f"data.dataset={workdir / 'code.txt'}",
                       f"train.output_dir={workdir / out}", "train.report_to=[]", *overrides])
    return workdir / out


def train_losses(checkpoint: Path) -> list[float]:
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry]


STEPS = ("data.num_eval_prompts=0", "train.max_steps=6", "train.logging_steps=1", "train.save_steps=6",
         "train.save_total_limit=null", "model.draft_vocab_size=150")


def test_a_head_trained_from_the_cache_has_the_online_loss_curve(workdir, monkeypatch):
    online = run(workdir, "online", *STEPS)
    cache = workdir / "cache_code"

    def no_target(*_args, **_kwargs):
        raise AssertionError("a training step ran the target")

    monkeypatch.setattr(head_trainer, "target_features", no_target)
    cached = run(workdir, "cached", *STEPS, f"distill.hidden_state_cache={cache}",
                 "distill.hidden_state_cache_dtype=float32")
    want = train_losses(online / "checkpoint-6")
    assert len(want) == 6 and train_losses(cached / "checkpoint-6") == pytest.approx(want, rel=1e-4)
    assert_same_weights(online / "model.safetensors", cached / "model.safetensors", rtol=1e-4, atol=1e-5)

    # a later run on the same rows reuses the cache: the target is not run for it either
    from distill.data import hidden_cache
    monkeypatch.setattr(hidden_cache, "target_features", no_target)
    again = run(workdir, "cached_again", *STEPS, f"distill.hidden_state_cache={cache}",
                "distill.hidden_state_cache_dtype=float32")
    assert train_losses(again / "checkpoint-6") == train_losses(cached / "checkpoint-6")


def test_a_cache_of_other_rows_stops_the_run_in_one_line(workdir, monkeypatch, capsys):
    cache = workdir / "cache_other"
    run(workdir, "first", *STEPS, "train.max_steps=1", f"distill.hidden_state_cache={cache}")
    message = cli_error(monkeypatch, capsys, HEAD_RECIPE, f"model.target={workdir / 'target'}",
                        f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={workdir / 'second'}",
                        "train.report_to=[]", *STEPS, "data.max_length=32", f"distill.hidden_state_cache={cache}")
    assert message.startswith("specdistill-train: error: distill.hidden_state_cache: ") and "dataset tokens" in message
    assert "or delete this folder" in message


# DeepSpeed ZeRO-3 and FSDP2 over 2 CPU processes (gloo): the launchers of tests/test_scale.py and tests/test_fsdp.py
DISTRIBUTED_RUN = ("data.dataset={chat}", "data.format=chat", "data.max_length=48", "data.num_eval_prompts=2",
                   "eval.gammas=[2]", "eval.max_new_tokens=8", "train.max_steps=4", "train.logging_steps=1",
                   "train.save_steps=2", "train.save_total_limit=null", "model.draft_vocab_size=150",
                   "distill.hidden_state_cache_dtype=float32", "distill.loss=forward_kl")


def distributed_args(workdir: Path, cache: str) -> list[str]:
    return [a.format(chat=workdir / "chat.jsonl") for a in DISTRIBUTED_RUN] + [
        f"distill.hidden_state_cache={workdir / cache}"]


@pytest.fixture(scope="module")
def one_process(workdir) -> Path:
    """One process, the 6 rows of each optimizer step in one micro-batch, from the cache it builds."""
    return run(workdir, "one_process", *distributed_args(workdir, "cache_chat"),
               "train.per_device_train_batch_size=6")


def assert_same_run(out: Path, reference: Path, cache: Path, atol: float = 1e-6) -> None:
    """The same loss curve and weights (within `atol`) as the one-process run, from a cache equal to its cache;
    acceptance measured at both checkpoints on rank 0."""
    assert train_losses(out / "checkpoint-4") == pytest.approx(train_losses(reference / "checkpoint-4"), rel=2e-5)
    for name in ("checkpoint-2", "checkpoint-4"):
        assert_same_weights(reference / name / "model.safetensors", out / name / "model.safetensors", atol=atol)
    ours, theirs = load_hidden_cache(cache), load_hidden_cache(reference.parent / "cache_chat")
    assert ours.metadata["dataset_hash"] == theirs.metadata["dataset_hash"]
    for got, want in zip(ours.features(range(len(ours))), theirs.features(range(len(theirs)))):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    records = [json.loads(line) for line in (out / "acceptance.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in records}) == [2, 4] and all(r["greedy_match"] == 1.0 for r in records)
    assert (out / "model.safetensors").is_file() and json.loads((out / "config.json").read_text())[
        "architectures"] == ["LlamaForCausalLMEagle3"]


@pytest.mark.integration
def test_zero3_head_from_the_cache_matches_one_process(workdir, one_process, tmp_path):
    """2 processes x 3 rows under ZeRO-3 (the target partitioned; the cache built by both processes together, the
    main one writing) = 1 process x 6 rows."""
    from test_scale import ZERO3_ON_CPU

    launcher = tmp_path / "zero3_on_cpu.py"
    launcher.write_text(ZERO3_ON_CPU)
    out = workdir / "zero3"
    torchrun(launcher, HEAD_RECIPE, f"model.target={workdir / 'target'}", f"train.output_dir={out}",
             "train.report_to=[]", *distributed_args(workdir, "cache_zero3"), "train.per_device_train_batch_size=3",
             timeout=400)
    # ZeRO-3 sums the gradients in another order. With the head's attention started as the target's layer (the kind's
    # default head_attn_init: target) some q / k gradients are differences of nearly equal terms (|g| ~ 1e-6), and
    # Adam's m / sqrt(v) turns their float32 rounding into update differences of up to ~lr * 1e-3: 4.4e-6 on 6 of 2048
    # q_proj entries on an AVX-512 EPYC (none on AVX2). 2e-5 is under 1% of one step (lr 3e-3); a wrong row, shard
    # or step moves most entries by about lr.
    assert_same_run(out, one_process, workdir / "cache_zero3", atol=2e-5)


@pytest.mark.integration
def test_fsdp2_head_from_the_cache_matches_one_process(workdir, one_process, tmp_path):
    """2 processes x 3 rows under FSDP2 (the cache built by the main process with the whole target, then the target
    sharded) = 1 process x 6 rows."""
    out = fsdp2_run(workdir, tmp_path, "fsdp", "cache_fsdp")
    assert_same_run(out, one_process, workdir / "cache_fsdp")


def fsdp2_run(workdir: Path, tmp_path: Path, name: str, cache: str, *overrides: str) -> Path:
    """The distributed run on 2 processes x 3 rows under FSDP2 (CPU, gloo), from hidden-state cache `cache`, into
    workdir / name."""
    from test_fsdp import FSDP_CONFIG, FSDP_ENV, FSDP_ON_CPU

    launcher = tmp_path / "fsdp_on_cpu.py"
    launcher.write_text(FSDP_ON_CPU)
    out = workdir / name
    command = accelerate_command(launcher, HEAD_RECIPE, f"model.target={workdir / 'target'}",
                                 f"train.output_dir={out}", "train.report_to=[]", *distributed_args(workdir, cache),
                                 *overrides, "train.per_device_train_batch_size=3", config_file=FSDP_CONFIG)
    run_process(command, timeout=400, env=FSDP_ENV)
    return out


@pytest.mark.integration
def test_fsdp2_head_with_frozen_parts_and_a_top_k_teacher_matches_one_process(workdir, tmp_path):
    """model.head_frozen (parameters that never train, beside sharded ones that do) and distill.soft_target_top_k under
    FSDP2 on 2 processes = 1 process x 6 rows; the exported lm_head is still the target's rows."""
    few_rows = ["model.head_frozen=[lm_head, norm]", "distill.soft_target_top_k=10"]
    reference = run(workdir, "one_process_frozen", *distributed_args(workdir, "cache_chat"), *few_rows,
                    "train.per_device_train_batch_size=6")
    out = fsdp2_run(workdir, tmp_path, "fsdp_frozen", "cache_fsdp_frozen", *few_rows)
    assert_same_run(out, reference, workdir / "cache_fsdp_frozen")
    target = AutoModelForCausalLM.from_pretrained(workdir / "target")
    head = Eagle3Head.from_pretrained(out, target.get_input_embeddings())
    assert torch.equal(head.lm_head.weight, target.lm_head.weight[head.target_ids])


def test_the_data_command_builds_the_cache_a_later_run_reads(workdir, monkeypatch, capsys):
    """`specdistill-data hidden-states RECIPE ...` builds the cache (without touching the run's output folder);
    the run then reads it and never runs the target for it. The train line it prints runs as printed (an output
    folder with a space in its name is one word)."""
    from distill.data import hidden_cache
    from specdistill.cli import data as data_command

    cache, out = workdir / "cache_by_command", workdir / "after the command"
    argv = [HEAD_RECIPE, f"model.target={workdir / 'target'}", f"data.dataset={workdir / 'code.txt'}",
            f"train.output_dir={out}", "train.report_to=[]", *STEPS, f"distill.hidden_state_cache={cache}"]
    assert data_command.main(["hidden-states", *argv]) == cache
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert shlex.split(printed.split("; train with ", 1)[1]) == ["specdistill-train", *argv]
    assert json.loads((cache / METADATA_FILE).read_text())["complete"] and not out.exists()

    def no_target(*_args, **_kwargs):
        raise AssertionError("the cache was built again")

    monkeypatch.setattr(hidden_cache, "target_features", no_target)
    train_script.main(argv)
    assert len(train_losses(out / "checkpoint-6")) == 6

    monkeypatch.setattr(sys, "argv", ["specdistill-data", "hidden-states", *argv[:-1]])  # no cache key
    with pytest.raises(SystemExit):
        data_command.cli()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("specdistill-data: error: ") and "distill.hidden_state_cache: is null" in err
