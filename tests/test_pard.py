"""PARD drafts (kinds/pard/): one draft forward drafts all gamma tokens. Decoding is lossless (greedy exact, eager and
compiled; sampling passes chi-square and its negative control fails), the drafter's cached proposals equal a fresh
pass, the training pass (the row and its blocks of mask slots under one 4D mask) computes what each block computes
alone, the trainer's loss and gradients equal a plain one-slot-at-a-time reference, a recipe trains a draft that
serves losslessly, exports vLLM's fields and resumes bit for bit, and recipe mistakes are one line.

Targets are tiny Llama models; drafts are random, or trained here on the target's own greedy continuations, which
gives partial acceptance, so rejections and resampling happen.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import test_decode_sampling as sampling
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import TrainingArguments

import decode.loop.speculative as spec
import decode.loop.static as static
from decode import autoregressive_generate
from decode.loop.auto_gamma import GammaChooser, best_gamma
from decode.loop.sampling import SamplingConfig
from distill.data.rows import DistillCollator
from distill.models import load
from kinds import kind_named, kind_of, kind_of_source
from kinds.p_eagle.options import KEYS as P_EAGLE_KEYS
from kinds.parallel_drafting import gamma_problems, token_problems
from kinds.pard import KIND as PARD
from kinds.pard.drafter import ParallelDrafter, feed_lengths
from kinds.pard.loss import block_attention, block_inputs, pard_anchors, slot_labels, slot_weights
from kinds.pard.options import KEYS as PARD_KEYS
from kinds.pard.trainer import PardTrainer
from specdistill.drafts import check_deploy, speculative_generate
from specdistill.recipes import DistillConfig

from helpers import ROOT, cli_error, learnt_tiny_pair, train_script
from tiny import tiny_model, tiny_tokenizer

RECIPE = str(ROOT / "recipes" / "tiny_pard.yaml")
PROMPTS = [torch.tensor([[1, 5, 7, 9, 11, 5, 7]]), torch.tensor([[1]]),
           torch.tensor([[1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 2, 9]])]
IGNORE = -100


def as_pard(model: torch.nn.Module, token: int, gamma: int = 4) -> torch.nn.Module:
    model.config.pard_token, model.config.pard_gamma = token, gamma
    return model


def new_draft(seed: int = 1, vocab_size: int = 96, layers: int = 1, gamma: int = 4) -> torch.nn.Module:
    return as_pard(tiny_model("llama", seed=seed, vocab_size=vocab_size, layers=layers), vocab_size - 1, gamma).eval()


def train_draft(target: torch.nn.Module, draft: torch.nn.Module, steps: int = 120, seed: int = 0,
                lr: float = 1e-2) -> torch.nn.Module:
    """Cross-entropy of every slot against the target's greedy continuations of random 2-token prompts: slot 0 at every
    position, mask slots at every anchor, all in one pass (block_inputs, block_attention)."""
    g = torch.Generator().manual_seed(seed)
    vocab, gamma = target.config.vocab_size, draft.config.pard_gamma
    with torch.no_grad():
        seqs = torch.cat([autoregressive_generate(target, p.view(1, -1), max_new_tokens=30).sequences
                          for p in torch.randint(3, vocab - 1, (32, 2), generator=g)])  # [B, T]
    b, t = seqs.shape
    labels = seqs.clone()
    labels[:, :2] = IGNORE  # the prompt
    anchors = torch.arange(1, t - 2).expand(b, -1)
    kept = torch.ones_like(anchors, dtype=torch.bool)
    mask = torch.ones_like(seqs)
    tokens, positions = block_inputs(seqs, anchors, gamma, draft.config.pard_token)
    attention = block_attention(anchors, mask, gamma, torch.float32)
    targets = torch.cat([labels[:, 1:], torch.full((b, 1), IGNORE)], 1)  # slot 0: x_{t+1}
    slots = slot_labels(labels, mask, anchors, kept, gamma).flatten(1)  # [B, n * (gamma - 1)]
    optimizer = torch.optim.Adam(draft.parameters(), lr=lr)
    draft.train()
    for _ in range(steps):
        rows = torch.randint(0, b, (8,), generator=g)
        logits = draft(input_ids=tokens[rows], attention_mask=attention[rows], position_ids=positions[rows]).logits
        wanted = torch.cat([targets[rows], slots[rows]], 1)
        loss = F.cross_entropy(logits.reshape(-1, vocab), wanted.reshape(-1), ignore_index=IGNORE)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return draft.eval()


@pytest.fixture(scope="module")
def trained():
    target = tiny_model("llama", seed=0, layers=4)
    return target, train_draft(target, new_draft(seed=2, layers=2))


# ---- greedy: the target's own output ------------------------------------------------------------------------------
def test_random_pard_draft_greedy_equals_plain_decoding():
    target, draft = tiny_model("llama", seed=0, layers=4), new_draft()
    assert kind_of(draft) is PARD and kind_of(ParallelDrafter(draft)) is PARD
    for prompt in PROMPTS:
        plain = autoregressive_generate(target, prompt, max_new_tokens=30)
        for gamma in (1, 2, 3, 4, "auto"):
            out = speculative_generate(target, draft, prompt, max_new_tokens=30, gamma=gamma)
            assert out.sequences.tolist() == plain.sequences.tolist(), (prompt, gamma)


def test_trained_draft_greedy_equals_plain_decoding_with_rejections(trained):
    target, draft = trained
    for gamma in (2, 3, 4):
        accepted = drafted = 0
        lengths = torch.zeros(gamma + 1, dtype=torch.long)
        for prompt in PROMPTS:
            plain = autoregressive_generate(target, prompt, max_new_tokens=40)
            out = speculative_generate(target, draft, prompt, max_new_tokens=40, gamma=gamma)
            assert out.sequences.tolist() == plain.sequences.tolist(), (prompt, gamma)
            accepted, drafted = accepted + out.stats.accepted_tokens, drafted + out.stats.drafted_tokens
            lengths += torch.tensor(out.stats.accepted_length_histogram)
        assert 0 < accepted < drafted, gamma  # accepted drafts, and rejections
        assert lengths[2:].sum() > 0, gamma  # mask slots are accepted too, not only the first token


def test_the_compiled_path_is_lossless_and_compiles_each_feed_length_once(trained):
    target, draft = trained
    torch._dynamo.reset()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(static, "BACKEND", "aot_eager")
        for prompt in PROMPTS[:2]:
            plain = autoregressive_generate(target, prompt, max_new_tokens=24)
            for gamma in (2, 4):
                out = speculative_generate(target, draft, prompt, max_new_tokens=24, gamma=gamma, compile=True)
                assert out.sequences.tolist() == plain.sequences.tolist(), (prompt, gamma)
                assert out.stats.accepted_tokens < out.stats.drafted_tokens
        assert set(static.session(draft, "draft").steps) <= set(feed_lengths(4))
    torch._dynamo.reset()
    assert feed_lengths(4) == (1, 2, 4, 8) and feed_lengths(3) == (1, 2, 4, 6)


# ---- the cache: proposals equal a fresh pass; the training pass equals each block alone ----------------------------
def test_cached_proposals_after_rejections_equal_a_fresh_pass(trained, monkeypatch):
    target, draft = trained
    seen = []
    original = ParallelDrafter.propose
    # the committed ids on the host, which the decoder hands only to a drafter that asks (decode.loop.drafters)
    monkeypatch.setattr(ParallelDrafter, "host_history", True, raising=False)

    def recording(self, history, cur, gamma, cfg, generator):
        drafts, q = original(self, history, cur, gamma, cfg, generator)
        seen.append((list(history), drafts.tolist()))
        return drafts, q

    monkeypatch.setattr(ParallelDrafter, "propose", recording)
    for prompt in PROMPTS[:2]:
        out = speculative_generate(target, draft, prompt, max_new_tokens=30, gamma=3)
        assert out.stats.accepted_tokens < out.stats.drafted_tokens
    assert len(seen) > 8
    token = draft.config.pard_token
    for history, drafts in seen:
        if drafts:  # no cache: the history and gamma - 1 mask tokens, one causal pass, the last gamma rows
            with torch.no_grad():
                logits = draft(torch.tensor([history + [token] * (len(drafts) - 1)])).logits[0]
            assert drafts == logits[-len(drafts):].argmax(-1).tolist()


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_training_pass_computes_what_each_block_computes_alone(attention):
    draft = new_draft(seed=3, layers=2, gamma=4)
    draft.config._attn_implementation = attention
    ids = torch.tensor([[1, 5, 7, 9, 11, 5, 3, 8], [1, 9, 9, 4, 2, 0, 0, 0]])
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    anchors = torch.tensor([[1, 4, 6], [0, 2, 3]])
    tokens, positions = block_inputs(ids, anchors, 4, 95)
    with torch.no_grad():
        out = draft(input_ids=tokens, attention_mask=block_attention(anchors, mask, 4, torch.float32),
                    position_ids=positions).logits
        for b in range(2):
            real = int(mask[b].sum())
            alone = draft(ids[b:b + 1, :real]).logits[0]
            torch.testing.assert_close(out[b, :real], alone, rtol=1e-5, atol=1e-5)  # the row: slot 0, unchanged
            for i, a in enumerate(anchors[b].tolist()):
                block = draft(torch.tensor([ids[b, :a + 1].tolist() + [95] * 3])).logits[0, a + 1:]
                torch.testing.assert_close(out[b, 8 + 3 * i: 8 + 3 * i + 3], block, rtol=1e-5, atol=1e-5)


# ---- sampling: lossless (chi-square), and the negative control fails -----------------------------------------------
def sampling_pair():
    target = tiny_model("llama", seed=0, vocab_size=sampling.VOCAB, layers=4)
    return target, new_draft(seed=3, vocab_size=sampling.VOCAB, gamma=2)


def test_pard_sampling_is_lossless():
    target, draft = sampling_pair()
    for pvalue in sampling.lossless_pvalues(target, draft, sampling.CONFIGS[0], runs=1500):  # temperature 1
        assert pvalue > 1e-4


def test_pard_sampling_negative_control(monkeypatch):
    target, draft = sampling_pair()
    monkeypatch.setattr(spec, "accept_sampled", sampling.accept_always)
    assert min(sampling.control_pvalues(target, draft, sampling.CONFIGS[0], runs=800)) < 1e-6


def test_q_rows_are_each_slots_distribution():
    target, draft = sampling_pair()
    drafter = ParallelDrafter(draft)
    prompt = sampling.PROMPT
    spec.prefill(spec.cached_lm(target, False, "target", 64, (3,)), drafter, prompt)
    drafts, q = drafter.propose(prompt[0].tolist(), prompt[:, -1:], 2, SamplingConfig(1.0),
                                torch.Generator().manual_seed(0))
    assert drafts.shape == (2,) and q.shape == (2, sampling.VOCAB)
    torch.testing.assert_close(q.sum(-1), torch.ones(2))
    assert (q[torch.arange(2), drafts] > 0).all()
    with torch.no_grad():  # each row is the softmax of its own position's logits
        logits = draft(torch.cat([prompt, torch.tensor([[draft.config.pard_token]])], 1)).logits[0, -2:]
    torch.testing.assert_close(q, logits.softmax(-1))


# ---- a draft vocabulary: every slot reads out the same lm_head rows (kinds/draft_vocab.py) -------------------------
def test_each_slot_drafts_the_argmax_over_the_draft_vocabulary(trained):
    target, draft = trained
    ids = torch.arange(0, target.config.vocab_size, 2)
    keys = set(draft.state_dict())
    drafter = ParallelDrafter(draft, vocab=ids)
    prompt = PROMPTS[0]
    drafter.start(prompt[:, :-1], target.config.vocab_size)
    drafts, q = drafter.propose(prompt[0].tolist(), prompt[:, -1:], 3, SamplingConfig(0.0), None)
    with torch.no_grad():  # the history and 2 mask tokens, one causal pass: the last 3 rows over the vocabulary
        logits = draft(torch.cat([prompt, torch.full((1, 2), draft.config.pard_token)], 1)).logits[0, -3:]
    assert drafts.tolist() == ids[logits[:, ids].argmax(-1)].tolist() and q is None
    assert set(draft.state_dict()) == keys  # the readout lives beside the model, not in it


def test_a_vocabulary_id_past_the_target_is_refused(trained):
    target, draft = trained
    with pytest.raises(ValueError, match="id 500, outside the target's 96 logits"):
        ParallelDrafter(draft, vocab=torch.tensor([1, 2, 500])).start(torch.tensor([[1, 2]]), target.config.vocab_size)


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_greedy_output_with_a_draft_vocabulary_equals_plain_decoding(trained, compile, monkeypatch):
    target, draft = trained
    monkeypatch.setattr(static, "BACKEND", "aot_eager")
    monkeypatch.setattr(draft, "draft_vocab_ids", torch.arange(0, target.config.vocab_size, 3), raising=False)
    torch._dynamo.reset()
    outside = accepted = 0
    for prompt in PROMPTS[:2]:
        plain = autoregressive_generate(target, prompt, max_new_tokens=30)
        for gamma in (2, 4):
            out = speculative_generate(target, draft, prompt, max_new_tokens=30, gamma=gamma, compile=compile)
            assert out.sequences.tolist() == plain.sequences.tolist(), (prompt, gamma)
            outside += sum(t % 3 != 0 for t in out.new_tokens)
            accepted += out.stats.accepted_tokens
    torch._dynamo.reset()
    assert outside > 0 and accepted > 0  # tokens outside the vocabulary still come, from the target


def test_pard_sampling_with_a_draft_vocabulary_is_lossless_and_its_control_fails(monkeypatch):
    target, draft = sampling_pair()
    draft.draft_vocab_ids = torch.tensor([0, 2, 3, 6])  # half of the 8 tokens can never be proposed
    for pvalue in sampling.lossless_pvalues(target, draft, sampling.CONFIGS[0], runs=1500):  # temperature 1
        assert pvalue > 1e-4
    monkeypatch.setattr(spec, "accept_sampled", sampling.accept_always)  # output follows q: nothing outside it
    assert min(sampling.control_pvalues(target, draft, sampling.CONFIGS[0], runs=800)) < 1e-6


def test_gamma_auto_costs_a_one_pass_drafter_per_step():
    verify = {g: 1.0 + 0.05 * g for g in (1, 2, 3, 4, 6)}
    assert best_gamma(0.7, 0.3, verify) == 2  # per drafted token: long drafts cost
    assert best_gamma(0.7, 0.3, verify, one_pass=True) == 6  # one forward whatever gamma is
    chooser = GammaChooser(one_pass=True)
    chooser.observe(4, 4, [0.7] * 4, 0.3, 1.2)
    assert chooser.drafted == 1 and chooser.draft_seconds == 0.3  # one drafting step, not four tokens


# ---- the trainer's loss against a plain reference --------------------------------------------------------------------
def text_batch(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n, prompt in ((12, 4), (9, 0), (16, 7)):
        ids = torch.randint(4, 94, (n,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": [IGNORE] * prompt + ids[prompt:]})
    return DistillCollator(0)(rows)


def reference_loss(draft, target, batch, anchors, kept, weights, loss: str) -> torch.Tensor:
    """(sum_k w_k mean_k) / sum_k w_k, each slot's mean over its positions; slot 0 from a plain forward of each row,
    slot k of anchor a from a plain forward of x_0..x_a and k mask tokens (its last position)."""
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    with torch.no_grad():
        p_all = target(input_ids=ids, attention_mask=mask).logits

    def term(q_logits, p_logits, label):
        log_q = F.log_softmax(q_logits, -1)
        if loss == "ce":
            return -log_q[label]
        log_p = F.log_softmax(p_logits, -1)
        return (log_p.exp() * (log_p - log_q)).sum()

    gamma, token = draft.config.pard_gamma, draft.config.pard_token
    slots = [[] for _ in range(gamma)]
    for b in range(ids.shape[0]):
        real = int(mask[b].sum())
        q_row = draft(ids[b:b + 1, :real]).logits[0]
        for t in range(real - 1):
            if labels[b, t + 1] != IGNORE:
                slots[0].append(term(q_row[t], p_all[b, t], labels[b, t + 1]))
        for a, keep in zip(anchors[b].tolist(), kept[b].tolist()):
            if not keep:
                continue
            q_block = draft(torch.tensor([ids[b, :a + 1].tolist() + [token] * (gamma - 1)])).logits[0]
            for k in range(1, gamma):
                if a + k + 1 < real and labels[b, a + k + 1] != IGNORE:
                    slots[k].append(term(q_block[a + k], p_all[b, a + k], labels[b, a + k + 1]))
    all_weights = [1.0, *weights]
    return sum(w * torch.stack(s).mean() for w, s in zip(all_weights, slots)) / sum(all_weights)


@pytest.mark.parametrize("loss, decay", [("forward_kl", None), ("ce", 2.0)])
def test_the_pard_loss_and_its_gradients_equal_one_slot_at_a_time(loss, decay, tmp_path):
    target = tiny_model("llama", vocab_size=96, layers=2)
    draft = new_draft(seed=4, layers=1, gamma=3).train()
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    trainer = PardTrainer(model=draft, target=target, args=args,
                          distill=DistillConfig(loss=loss, chunk_size=5, pard_blocks=4, pard_position_decay=decay),
                          train_dataset=[], data_collator=DistillCollator(0))
    (batch,), count = trainer.get_batch_samples(iter([text_batch()]), 1, torch.device("cpu"))
    anchors, kept = batch["pard_anchors"], batch["pard_kept"]
    assert kept.any(dim=1).all()
    ours = trainer.compute_loss(draft, batch, num_items_in_batch=count)
    ours_grads = torch.autograd.grad(ours, list(draft.parameters()))
    plain = reference_loss(draft, target, batch, anchors, kept, slot_weights(3, decay), loss)
    plain_grads = torch.autograd.grad(plain, list(draft.parameters()))
    torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-6)
    for got, want in zip(ours_grads, plain_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_anchors_sit_where_slot_one_has_a_loss_token():
    labels = torch.full((2, 10), IGNORE)
    labels[0, 5:] = 7
    labels[1, 8] = 7  # x_8 is the one loss token: slot 1 of anchor 6 drafts it
    anchors, kept = pard_anchors(labels, torch.ones_like(labels), 3, torch.Generator().manual_seed(1))
    assert kept[0].all() and all(3 <= a <= 7 for a in anchors[0].tolist())
    assert kept[1].tolist() == [True, False, False] and anchors[1, 0] == 6
    assert slot_weights(3, None) == [1.0, 1.0]


# ---------------------------------------------------------------------------------------------------------------
# A whole run on a tiny pair
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """target/ (a 4-layer tiny Llama that has learnt TINY_TEXT; its embedding has a spare row for the mask token)
    and code.txt."""
    return learnt_tiny_pair(tmp_path_factory.mktemp("pard"))


def run(workdir: Path, out: str, *overrides: str) -> Path:
    output_dir = workdir / out
    train_script.main([RECIPE, f"model.target={workdir / 'target'}", f"data.dataset={workdir / 'code.txt'}",
                       f"train.output_dir={output_dir}", "train.report_to=[]", *overrides])
    return output_dir


@pytest.fixture(scope="module")
def run_dir(workdir) -> Path:
    return run(workdir, "run")


def test_a_recipe_trains_a_pard_draft_that_serves_losslessly(run_dir, workdir):
    last = max(run_dir.glob("checkpoint-*"), key=lambda folder: int(folder.name.split("-")[1]))
    state = json.loads((last / "trainer_state.json").read_text())
    logged = [e for e in state["log_history"] if "loss" in e]
    assert logged[-1]["loss"] < 0.7 * logged[0]["loss"], logged
    assert all(f"pard/slot{k}_tv" in e and f"pard/slot{k}_ce" in e for e in logged for k in (1, 3))
    assert logged[-1]["pard/slot1_tv"] < logged[0]["pard/slot1_tv"]  # the mask slots learn
    config = json.loads((run_dir / "config.json").read_text())
    assert config["pard_token"] == 320 and config["pard_gamma"] == 4 and config["num_hidden_layers"] == 2
    assert kind_of_source(run_dir) is PARD and (run_dir / "tokenizer.json").is_file()
    rows = [json.loads(line) for line in (run_dir / "acceptance.jsonl").read_text().splitlines()]
    assert rows and all(r["greedy_match"] == 1.0 for r in rows)  # our decoder: exactly the target's greedy text
    last_rows = [r for r in rows if r["step"] == max(r["step"] for r in rows) and r["gamma"] == 4]
    assert last_rows[0]["per_position_acceptance"][1] > 0.1  # a mask slot's draft is accepted
    report = check_deploy(str(workdir / "target"), run_dir)
    assert report.passed and report.kind == "pard", report.problems
    commands = kind_named("pard").serving_commands(report)
    assert '"method": "draft_model"' in commands and '"parallel_drafting": true' in commands


def test_a_recipe_with_a_draft_vocabulary_exports_it_and_serves_losslessly(workdir):
    """With `ce` on the data (no target in the step) the log has each mask slot's cross-entropy and no tv."""
    from kinds.draft_vocab import DRAFT_VOCAB_FILE, read_draft_vocab

    out = run(workdir, "vocab", "model.draft_vocab_size=64", "distill.loss=ce", "train.max_steps=8",
              "train.save_steps=8")
    logged = [e for e in json.loads((out / "checkpoint-8" / "trainer_state.json").read_text())["log_history"]
              if "loss" in e]
    assert logged and all(e["pard/slot1_ce"] > 0 and "pard/slot1_tv" not in e for e in logged)
    ids = read_draft_vocab(out, 321)
    assert ids is not None and ids.numel() == 64 and (out / DRAFT_VOCAB_FILE).is_file()
    rows = [json.loads(line) for line in (out / "acceptance.jsonl").read_text().splitlines()]
    assert rows and all(r["greedy_match"] == 1.0 for r in rows)  # the trainer's checks read out the 64 rows
    draft = PARD.load(str(out), None, torch.device("cpu"), torch.float32)
    assert draft.get_output_embeddings().weight.shape[0] == 321  # the weights stay whole
    drafter = PARD.drafter(draft, None)
    assert torch.equal(drafter.vocab, ids)
    assert check_deploy(str(workdir / "target"), out).passed


def test_the_deploy_check_names_a_missing_or_wrong_pard_token(run_dir, workdir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(run_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    config["pard_token"] = 5000
    (broken / "config.json").write_text(json.dumps(config))
    generation = json.loads((broken / "generation_config.json").read_text())
    generation["num_assistant_tokens"] = 6
    (broken / "generation_config.json").write_text(json.dumps(generation))
    report = check_deploy(str(workdir / "target"), broken)
    assert set(report.problems) == {"pard_token", "gamma", "manifest"}, report.problems  # edited after export
    assert "pard_token=5000" in report.problems["pard_token"] and "at most 4" in report.problems["gamma"]


def test_a_resumed_pard_run_continues_bit_for_bit(workdir):
    """Anchors are drawn from the step, the micro-batch and the process: resuming draws the same ones."""
    common = ("train.max_steps=8", "train.save_steps=4", "eval.at_checkpoints=false")
    whole = run(workdir, "whole", *common)
    first = run(workdir, "part", *common)
    shutil.rmtree(first / "checkpoint-8")
    for name in ("train_results.json", "model.safetensors", "config.json"):
        (first / name).unlink(missing_ok=True)
    resumed = run(workdir, "part", *common, "train.resume_from_checkpoint=true")
    a, b = load_file(whole / "checkpoint-8" / "model.safetensors"), load_file(resumed / "checkpoint-8" /
                                                                               "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------------------------------------------------
# Refusals: one line, before any weights load
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture
def no_weights(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("model weights were loaded before the error")
    monkeypatch.setattr(load, "load_target", refuse)


@pytest.mark.parametrize("override, expected", [
    ("distill.teacher_cache=cache", "distill.teacher_cache: got 'cache'; allowed: null with model.draft_kind pard"),
    ("eval.gammas=[2, 6]", "eval.gammas: got [2, 6]; allowed: gammas <= 4 with model.pard_gamma 4"),
    ("model.pard_gamma=1", "model.pard_gamma: got 1; allowed: an integer >= 2"),
    ("model.pard_token=5000", "model.pard_token: got 5000; allowed: an id of the draft's embedding, 0..320"),
    ("model.dflash_layers=2", "model.dflash_layers: got 2; allowed: 1 with model.draft_kind pard (it is a key of "
                              "DFlash drafts: model.draft_kind dflash)"),
    ("distill.pard_blockz=3", "distill.pard_blockz"),
    ("model.draft_config={num_hidden_layers: 1}", "allowed: exactly one of model.draft, model.draft_layers, "
                                                 "model.draft_config (drop the other with model.draft_layers=null or "
                                                 "model.draft_config=null)"),
])
def test_pard_recipe_refusals_are_one_line(monkeypatch, capsys, no_weights, workdir, tmp_path, override, expected):
    message = cli_error(monkeypatch, capsys, RECIPE, f"model.target={workdir / 'target'}",
                        f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={tmp_path / 'out'}", override)
    assert expected in message, message
    assert "\n" not in message.strip()


def test_a_vocabulary_without_a_spare_row_needs_a_named_pard_token(monkeypatch, capsys, no_weights, workdir,
                                                                     tmp_path):
    tokenizer = tiny_tokenizer()
    tiny_model("llama", vocab_size=len(tokenizer), hidden=32, layers=4).save_pretrained(tmp_path / "full")
    tokenizer.save_pretrained(tmp_path / "full")
    message = cli_error(monkeypatch, capsys, RECIPE, f"model.target={tmp_path / 'full'}",
                        f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={tmp_path / 'out'}")
    assert "model.pard_token: the embedding has no spare row" in message, message


def test_standalone_recipes_refuse_pard_keys(monkeypatch, capsys, no_weights):
    message = cli_error(monkeypatch, capsys, str(ROOT / "recipes" / "tiny_distill.yaml"), "model.target=t",
                        "data.dataset=x.txt", "model.pard_gamma=6")
    assert "model.pard_gamma: got 6; allowed: 8 with model.draft_kind standalone (it is a key of PARD drafts" \
        in message


@pytest.mark.parametrize("keys, check, trained", [
    (PARD_KEYS, "pard_token", "the draft was trained for at most 4 tokens per forward"),
    (P_EAGLE_KEYS, "ptd_token", "the head was trained for at most 4 tokens per pass"),
])
def test_the_shared_parallel_drafting_checks_speak_each_kinds_names(keys, check, trained):
    """kinds/parallel_drafting.py writes the mask-token and gamma checks once; each kind's keys name its own fields."""
    config = {keys.token: 5000, keys.gamma: 4, "vocab_size": 321}
    assert f"config.json has {keys.token}=5000" in token_problems(config, keys)[check]
    assert token_problems({**config, keys.token: 320}, keys) == {}
    assert trained in gamma_problems(config, keys, 6)["gamma"]
    assert gamma_problems(config, keys, 4) == {} == gamma_problems(config, keys, None)
