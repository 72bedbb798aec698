"""P-EAGLE heads (kinds/p_eagle/): an EAGLE-3 head drafts all gamma tokens in one pass from mask slots. Decoding is
lossless (greedy exact, eager and compiled; sampling passes chi-square and its negative control fails), the drafter's
cached proposals equal a fresh pass, the training pass (the row and its blocks of mask slots under one mask) computes
what each block computes alone, the trainer's loss and gradients equal a plain one-slot-at-a-time reference, a recipe
trains a head that serves losslessly, exports vLLM's fields (ptd_token_id, mask_hidden) and resumes bit for bit, and
recipe mistakes are one line.

Targets are tiny Llama models; heads are random, or trained here on the target's own greedy continuations (every
slot's cross-entropy in one pass), which gives partial acceptance, so rejections and resampling happen.
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
from decode.loop.sampling import SamplingConfig
from distill.data.rows import DistillCollator
from distill.models import load
from kinds import kind_named, kind_of, kind_of_source
from kinds.eagle3 import KIND as EAGLE3
from kinds.eagle3.model import Eagle3Head, head_config, target_aux_hidden
from kinds.p_eagle import KIND as P_EAGLE
from kinds.p_eagle.drafter import ParallelHeadDrafter
from kinds.p_eagle.loss import ParallelHead, head_anchors, slot_labels
from kinds.p_eagle.trainer import PEagleTrainer
from kinds.pard.drafter import feed_lengths
from kinds.pard.loss import slot_weights
from specdistill.drafts import check_deploy, speculative_generate
from specdistill.recipes import DistillConfig

from helpers import ROOT, cli_error, learnt_tiny_pair, train_script
from tiny import tiny_model, tiny_tokenizer

RECIPE = str(ROOT / "recipes" / "tiny_p_eagle.yaml")
PROMPTS = [torch.tensor([[1, 5, 7, 9, 11, 5, 7]]), torch.tensor([[1]]),
           torch.tensor([[1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 2, 9]])]
IGNORE = -100


def new_head(target: torch.nn.Module, seed: int = 1, gamma: int = 4, token: int = 3, **config) -> Eagle3Head:
    """A random P-EAGLE head on `target` (mask_hidden drawn too: a zero one would make every slot alike)."""
    cfg = head_config(target.config, **config)
    cfg.ptd_token_id, cfg.ptd_gamma = token, gamma
    torch.manual_seed(seed)
    head = Eagle3Head(cfg).bind_embeddings(target.get_input_embeddings())
    with torch.no_grad():
        head.mask_hidden.normal_()
    return head.eval()


def training_prompts(vocab: int, seed: int = 0) -> torch.Tensor:
    """The 32 random 2-token prompts whose greedy continuations train_head learns, [32, 2]: a head this small learns
    those continuations, not the target, so the trained head is measured on some of them."""
    return torch.randint(4, vocab, (32, 2), generator=torch.Generator().manual_seed(seed))


def train_head(target: torch.nn.Module, head: Eagle3Head, steps: int = 150, seed: int = 0, lr: float = 1e-2,
               prompts: list[torch.Tensor] | None = None) -> Eagle3Head:
    """Cross-entropy of every slot against the target's greedy continuations (30 tokens) of `prompts` (default: the
    random 2-token training_prompts): slot 0 at every position, mask slots at every anchor, all in one pass
    (ParallelHead), on the last 32 positions of each prompt and its continuation."""
    g = torch.Generator().manual_seed(seed)
    vocab, gamma = target.config.vocab_size, head.config.ptd_gamma
    if prompts is None:
        prompts = list(training_prompts(vocab, seed).unsqueeze(1))
    windows, features = [], []
    with torch.no_grad():
        for prompt in prompts:
            full = autoregressive_generate(target, prompt.view(1, -1), max_new_tokens=30).sequences
            aux = target_aux_hidden(target(full, output_hidden_states=True).hidden_states, head.aux_layers)
            windows.append(full[:, -32:])
            features.append(aux[:, -32:])
    seqs, aux = torch.cat(windows), torch.cat(features)  # [B, 32], [B, 32, 3H]
    b, t = seqs.shape
    labels = seqs.clone()
    labels[:, :2] = IGNORE  # the prompt
    anchors = torch.arange(1, t - 3).expand(b, -1)
    kept = torch.ones_like(anchors, dtype=torch.bool)
    mask = torch.ones_like(seqs)
    row_labels = torch.cat([labels[:, 2:], torch.full((b, 2), IGNORE)], 1)  # row t: x_{t+2}
    slots = slot_labels(labels, mask, anchors, kept, gamma)  # [B, n, gamma - 1]
    model = ParallelHead(head, gamma, head.config.ptd_token_id).train()
    optimizer = torch.optim.Adam(head.parameters(), lr=lr)
    for _ in range(steps):
        rows = torch.randint(0, b, (8,), generator=g)
        row, slot = model(seqs[rows], aux[rows], anchors[rows], mask[rows])
        logits = torch.cat([head.logits(row), head.logits(slot).flatten(1, 2)], 1)
        wanted = torch.cat([row_labels[rows], slots[rows].flatten(1)], 1)
        loss = F.cross_entropy(logits.reshape(-1, vocab), wanted.reshape(-1), ignore_index=IGNORE)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval()


@pytest.fixture(scope="module")
def trained():
    target = tiny_model("llama", seed=0, layers=4)
    return target, train_head(target, new_head(target, seed=2), steps=300, lr=3e-3)


SEEN = [training_prompts(96)[i].view(1, -1) for i in (0, 1, 2)] + [PROMPTS[1]]  # what the trained head learnt


# ---- greedy: the target's own output ------------------------------------------------------------------------------
def test_random_p_eagle_head_greedy_equals_plain_decoding():
    target = tiny_model("llama", seed=0, layers=4)
    head = new_head(target)
    assert kind_of(head) is P_EAGLE and kind_of(ParallelHeadDrafter(head)) is P_EAGLE
    for prompt in PROMPTS:
        plain = autoregressive_generate(target, prompt, max_new_tokens=30)
        for gamma in (1, 2, 3, 4, "auto"):
            out = speculative_generate(target, head, prompt, max_new_tokens=30, gamma=gamma)
            assert out.sequences.tolist() == plain.sequences.tolist(), (prompt, gamma)


def test_trained_head_greedy_equals_plain_decoding_with_rejections(trained):
    target, head = trained
    for gamma in (2, 3, 4):
        accepted = drafted = 0
        lengths = torch.zeros(gamma + 1, dtype=torch.long)
        for prompt in SEEN:
            plain = autoregressive_generate(target, prompt, max_new_tokens=40)
            out = speculative_generate(target, head, prompt, max_new_tokens=40, gamma=gamma)
            assert out.sequences.tolist() == plain.sequences.tolist(), (prompt, gamma)
            accepted, drafted = accepted + out.stats.accepted_tokens, drafted + out.stats.drafted_tokens
            lengths += torch.tensor(out.stats.accepted_length_histogram)
        assert 0 < accepted < drafted, gamma  # accepted drafts, and rejections
        assert lengths[2:].sum() > 0, gamma  # mask slots are accepted too, not only the first token


def test_the_compiled_path_is_lossless_and_compiles_feed_lengths_only(trained):
    target, head = trained
    torch._dynamo.reset()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(static, "BACKEND", "aot_eager")
        for prompt in SEEN[:2]:
            plain = autoregressive_generate(target, prompt, max_new_tokens=24)
            for gamma in (2, 4):
                out = speculative_generate(target, head, prompt, max_new_tokens=24, gamma=gamma, compile=True)
                assert out.sequences.tolist() == plain.sequences.tolist(), (prompt, gamma)
                assert out.stats.accepted_tokens < out.stats.drafted_tokens
        cache = static.register(head, "head", lambda: None)
        assert set(cache.steps) <= set(feed_lengths(8)) and cache.steps
    torch._dynamo.reset()


# ---- the cache: proposals equal a fresh pass; the training pass equals each block alone ----------------------------
def fresh_proposal(target, head, history: list[int], gamma: int) -> list[int]:
    """No cache: positions 0..M-1 = (x_{t+1}, fc(h_t)) and gamma - 1 mask slots (m, fc(mask_hidden)), one causal pass,
    the argmax (in target ids) of the last gamma rows."""
    ids = torch.tensor([history])
    with torch.no_grad():
        aux = target_aux_hidden(target(ids, output_hidden_states=True).hidden_states, head.aux_layers)[:, :-1]
        slots = gamma - 1
        tokens = torch.tensor([history[1:] + [head.config.ptd_token_id] * slots])
        hidden = torch.cat([head.fuse(aux), head.mask_input().expand(1, slots, -1)], 1)
        logits, _ = head(tokens, hidden, torch.arange(tokens.shape[1]).view(1, -1))
    return head.target_ids[logits[0, -gamma:].argmax(-1)].tolist()


def test_cached_proposals_after_rejections_equal_a_fresh_pass(trained, monkeypatch):
    target, head = trained
    seen = []
    original = ParallelHeadDrafter.propose
    # the committed ids on the host, which the decoder hands only to a drafter that asks (decode.loop.drafters)
    monkeypatch.setattr(ParallelHeadDrafter, "host_history", True, raising=False)

    def recording(self, history, cur, gamma, cfg, generator):
        drafts, q = original(self, history, cur, gamma, cfg, generator)
        seen.append((list(history), drafts.tolist()))
        return drafts, q

    monkeypatch.setattr(ParallelHeadDrafter, "propose", recording)
    for prompt in SEEN[:2]:
        out = speculative_generate(target, head, prompt, max_new_tokens=30, gamma=3)
        assert out.stats.accepted_tokens < out.stats.drafted_tokens
    assert len(seen) > 8
    for history, drafts in seen:
        if drafts:
            assert drafts == fresh_proposal(target, head, history, len(drafts))


def test_the_training_pass_computes_what_each_block_computes_alone():
    """The row equals a plain causal pass of the head over it; block i's slots equal a plain causal pass over positions
    0..a_i and three mask slots (padding in the second row)."""
    target = tiny_model("llama", seed=0, layers=4)
    head = new_head(target, seed=3)
    model = ParallelHead(head, 4, 3)
    ids = torch.tensor([[1, 5, 7, 9, 11, 5, 3, 8], [1, 9, 9, 4, 2, 0, 0, 0]])
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    anchors = torch.tensor([[1, 4, 6], [0, 2, 3]])
    with torch.no_grad():
        aux = target_aux_hidden(target(ids, attention_mask=mask, output_hidden_states=True).hidden_states,
                                head.aux_layers)
        row, slots = model(ids, aux, anchors, mask)
        for b in range(2):
            real = int(mask[b].sum())
            tokens = torch.tensor([ids[b, 1:real].tolist() + [0]])  # x_{t+1}; the last one is past the row
            alone, _ = head(tokens, head.fuse(aux[b:b + 1, :real]), torch.arange(real).view(1, -1))
            torch.testing.assert_close(head.logits(row[b, :real]), alone[0], rtol=1e-5, atol=1e-5)  # slot 0
            for i, a in enumerate(anchors[b].tolist()):
                tokens = torch.tensor([ids[b, 1:a + 2].tolist() + [3] * 3])  # x_{a+1} the newest token
                hidden = torch.cat([head.fuse(aux[b:b + 1, :a + 1]), head.mask_input().expand(1, 3, -1)], 1)
                block, _ = head(tokens, hidden, torch.arange(a + 4).view(1, -1))
                torch.testing.assert_close(head.logits(slots[b, i]), block[0, a + 1:], rtol=1e-5, atol=1e-5)
    # distill.feature_noise: in training the row's features are noised; in eval the pass is exactly the plain one
    noised = ParallelHead(head, 4, 3, feature_noise=0.5)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(noised.eval()(ids, aux, anchors, mask), (row, slots)))
        assert not torch.allclose(noised.train()(ids, aux, anchors, mask)[0], row)


# ---- sampling: lossless (chi-square), and the negative control fails -----------------------------------------------
def sampling_pair():
    target = tiny_model("llama", seed=0, vocab_size=sampling.VOCAB, layers=4)
    return target, new_head(target, seed=3, gamma=2)


def test_p_eagle_sampling_is_lossless():
    target, head = sampling_pair()
    for pvalue in sampling.lossless_pvalues(target, head, sampling.CONFIGS[0], runs=1500):  # temperature 1
        assert pvalue > 1e-4


def test_p_eagle_sampling_negative_control(monkeypatch):
    target, head = sampling_pair()
    monkeypatch.setattr(spec, "accept_sampled", sampling.accept_always)
    assert min(sampling.control_pvalues(target, head, sampling.CONFIGS[0], runs=800)) < 1e-6


def test_q_rows_are_each_slots_distribution():
    target, head = sampling_pair()
    drafter = ParallelHeadDrafter(head)
    prompt = sampling.PROMPT
    spec.prefill(spec.cached_lm(target, False, "target", 64, (3,), tuple(head.aux_layers)), drafter, prompt)
    drafts, q = drafter.propose(prompt[0].tolist(), prompt[:, -1:], 2, SamplingConfig(1.0),
                                torch.Generator().manual_seed(0))
    assert drafts.shape == (2,) and q.shape == (2, sampling.VOCAB)
    torch.testing.assert_close(q.sum(-1), torch.ones(2))
    assert (q[torch.arange(2), drafts] > 0).all()


# ---- the trainer's loss against a plain reference --------------------------------------------------------------------
def text_batch(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n, prompt in ((12, 4), (9, 0), (16, 7)):
        ids = torch.randint(4, 94, (n,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": [IGNORE] * prompt + ids[prompt:]})
    return DistillCollator(0)(rows)


def reference_loss(head, target, batch, anchors, kept, weights, loss: str) -> torch.Tensor:
    """(sum_k w_k mean_k) / sum_k w_k, each slot's mean over its positions; slot 0 from a plain causal pass of the head
    over each row, slot k of anchor a from a plain causal pass over positions 0..a and k mask slots (its last one)."""
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    with torch.no_grad():
        out = target(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        p_all, aux = out.logits, target_aux_hidden(out.hidden_states, head.aux_layers)

    def term(q_logits, p_logits, label):
        log_q = F.log_softmax(q_logits, -1)
        if loss == "ce":
            return -log_q[label]
        log_p = F.log_softmax(p_logits, -1)
        return (log_p.exp() * (log_p - log_q)).sum()

    gamma, token = head.config.ptd_gamma, head.config.ptd_token_id
    slots = [[] for _ in range(gamma)]
    for b in range(ids.shape[0]):
        real = int(mask[b].sum())
        tokens = torch.tensor([ids[b, 1:real].tolist() + [0]])
        q_row, _ = head(tokens, head.fuse(aux[b:b + 1, :real]), torch.arange(real).view(1, -1))
        for t in range(real - 2):
            if labels[b, t + 2] != IGNORE:
                slots[0].append(term(q_row[0, t], p_all[b, t + 1], labels[b, t + 2]))
        for a, keep in zip(anchors[b].tolist(), kept[b].tolist()):
            if not keep:
                continue
            tokens = torch.tensor([ids[b, 1:a + 2].tolist() + [token] * (gamma - 1)])
            hidden = torch.cat([head.fuse(aux[b:b + 1, :a + 1]), head.mask_input().expand(1, gamma - 1, -1)], 1)
            q_block, _ = head(tokens, hidden, torch.arange(a + gamma).view(1, -1))
            for k in range(1, gamma):
                if a + 2 + k < real and labels[b, a + 2 + k] != IGNORE:
                    slots[k].append(term(q_block[0, a + k], p_all[b, a + 1 + k], labels[b, a + 2 + k]))
    all_weights = [1.0, *weights]
    return sum(w * torch.stack(s).mean() for w, s in zip(all_weights, slots)) / sum(all_weights)


@pytest.mark.parametrize("loss, decay", [("forward_kl", None), ("ce", 2.0)])
def test_the_p_eagle_loss_and_its_gradients_equal_one_slot_at_a_time(loss, decay, tmp_path):
    target = tiny_model("llama", vocab_size=96, layers=4)
    head = new_head(target, seed=4, gamma=3).train()
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    trainer = PEagleTrainer(model=head, target=target, args=args,
                            distill=DistillConfig(loss=loss, chunk_size=5, pard_blocks=4, pard_position_decay=decay),
                            train_dataset=[], data_collator=DistillCollator(0))
    (batch,), count = trainer.get_batch_samples(iter([text_batch()]), 1, torch.device("cpu"))
    anchors, kept = batch["p_eagle_anchors"], batch["p_eagle_kept"]
    assert kept.any(dim=1).all()
    params = [p for p in head.parameters() if p.requires_grad]
    ours = trainer.compute_loss(trainer.model, batch, num_items_in_batch=count)
    ours_grads = torch.autograd.grad(ours, params)
    plain = reference_loss(head, target, batch, anchors, kept, slot_weights(3, decay), loss)
    plain_grads = torch.autograd.grad(plain, params)
    torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-6)
    for got, want in zip(ours_grads, plain_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert ours_grads[[n for n, p in head.named_parameters() if p.requires_grad].index("mask_hidden")].abs().sum() > 0


def test_anchors_sit_where_slot_one_has_a_loss_token():
    labels = torch.full((2, 10), IGNORE)
    labels[0, 5:] = 7
    labels[1, 8] = 7  # x_8 is the one loss token: slot 1 of anchor 5 drafts it (position 5 reads x_6, drafts x_7)
    anchors, kept = head_anchors(labels, torch.ones_like(labels), 3, torch.Generator().manual_seed(1))
    assert kept[0].all() and all(2 <= a <= 6 for a in anchors[0].tolist())
    assert kept[1].tolist() == [True, False, False] and anchors[1, 0] == 5


# ---------------------------------------------------------------------------------------------------------------
# A whole run on a tiny pair
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """target/ (a 4-layer tiny Llama that has learnt TINY_TEXT; its embedding has a spare row for the mask token)
    and code.txt."""
    return learnt_tiny_pair(tmp_path_factory.mktemp("p_eagle"))


def run(workdir: Path, out: str, *overrides: str) -> Path:
    output_dir = workdir / out
    train_script.main([RECIPE, f"model.target={workdir / 'target'}", f"data.dataset={workdir / 'code.txt'}",
                       f"train.output_dir={output_dir}", "train.report_to=[]", *overrides])
    return output_dir


@pytest.fixture(scope="module")
def run_dir(workdir) -> Path:
    return run(workdir, "run", "train.max_steps=48", "train.save_steps=24")


def test_a_recipe_trains_a_p_eagle_head_that_serves_losslessly(run_dir, workdir):
    last = max(run_dir.glob("checkpoint-*"), key=lambda folder: int(folder.name.split("-")[1]))
    state = json.loads((last / "trainer_state.json").read_text())
    logged = [e for e in state["log_history"] if "loss" in e]
    assert logged[-1]["loss"] < 0.7 * logged[0]["loss"], logged
    assert all(f"p_eagle/slot{k}_tv" in e for e in logged for k in (1, 3))
    assert logged[-1]["p_eagle/slot1_tv"] < logged[0]["p_eagle/slot1_tv"]  # the mask slots learn
    config = json.loads((run_dir / "config.json").read_text())
    assert config["ptd_token_id"] == 320 and config["ptd_gamma"] == 4
    assert list(load_file(run_dir / "model.safetensors")["mask_hidden"].shape) == [1, 3 * config["hidden_size"]]
    assert kind_of_source(run_dir) is P_EAGLE
    rows = [json.loads(line) for line in (run_dir / "acceptance.jsonl").read_text().splitlines()]
    assert rows and all(r["greedy_match"] == 1.0 for r in rows)  # our decoder: exactly the target's greedy text
    last_rows = [r for r in rows if r["step"] == max(r["step"] for r in rows) and r["gamma"] == 4]
    assert last_rows[0]["per_position_acceptance"][1] > 0.05  # a mask slot's draft is accepted
    report = check_deploy(str(workdir / "target"), run_dir)
    assert report.passed and report.kind == "p_eagle", report.problems
    commands = kind_named("p_eagle").serving_commands(report)
    assert '"method": "eagle3"' in commands and '"parallel_drafting": true' in commands


def test_an_exported_head_reloads_to_the_same_proposals(run_dir, workdir):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(workdir / "target").eval()
    head = P_EAGLE.load(str(run_dir), target, torch.device("cpu"), torch.float32)
    assert kind_of(head) is P_EAGLE and head.mask_hidden.abs().sum() > 0
    prompt = torch.tensor([[1, 5, 7, 9, 11]])
    out = speculative_generate(target, head, prompt, max_new_tokens=20, gamma=4)
    assert out.sequences.tolist() == autoregressive_generate(target, prompt, max_new_tokens=20).sequences.tolist()
    eagle = EAGLE3.load(str(run_dir), target, torch.device("cpu"), torch.float32)  # served sequentially, it still runs
    assert speculative_generate(target, EAGLE3.drafter(eagle, target), prompt, max_new_tokens=20,
                                gamma=2).sequences.tolist() == out.sequences.tolist()


def test_the_deploy_check_names_a_missing_token_or_mask_hidden(run_dir, workdir, tmp_path):
    from safetensors.torch import save_file

    broken = tmp_path / "broken"
    shutil.copytree(run_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    config["ptd_token_id"] = 5000
    (broken / "config.json").write_text(json.dumps(config))
    generation = json.loads((broken / "generation_config.json").read_text())
    generation["num_assistant_tokens"] = 6
    (broken / "generation_config.json").write_text(json.dumps(generation))
    weights = load_file(broken / "model.safetensors")
    del weights["mask_hidden"]
    save_file(weights, str(broken / "model.safetensors"), metadata={"format": "pt"})
    report = check_deploy(str(workdir / "target"), broken)
    assert set(report.problems) == {"ptd_token", "mask_hidden", "gamma", "manifest"}, report.problems
    assert "ptd_token_id=5000" in report.problems["ptd_token"] and "at most 4" in report.problems["gamma"]
    assert "no mask_hidden" in report.problems["mask_hidden"]


def test_a_resumed_p_eagle_run_continues_bit_for_bit(workdir):
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
    ("distill.ttt_steps=3", "distill.ttt_steps: got 3; allowed: 1 with model.draft_kind p_eagle"),
    ("eval.gammas=[2, 6]", "eval.gammas: got [2, 6]; allowed: gammas <= 4 with model.ptd_gamma 4"),
    ("model.ptd_gamma=1", "model.ptd_gamma: got 1; allowed: an integer >= 2"),
    ("model.ptd_token_id=5000", "model.ptd_token_id: got 5000; allowed: an id of the target's embedding, 0..320"),
    ("model.pard_gamma=3", "model.pard_gamma: got 3; allowed: 8 with model.draft_kind p_eagle (it is a key of PARD "
                           "drafts: model.draft_kind pard)"),
    ("model.aux_layers=[3, 1, 2]", "model.aux_layers: got [3, 1, 2]; allowed: null or 3 distinct, ascending"),
])
def test_p_eagle_recipe_refusals_are_one_line(monkeypatch, capsys, no_weights, workdir, tmp_path, override,
                                              expected):
    message = cli_error(monkeypatch, capsys, RECIPE, f"model.target={workdir / 'target'}",
                        f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={tmp_path / 'out'}", override)
    assert expected in message, message
    assert "\n" not in message.strip()


def test_a_vocabulary_without_a_spare_row_needs_a_named_ptd_token(monkeypatch, capsys, no_weights, workdir,
                                                                    tmp_path):
    tokenizer = tiny_tokenizer()
    tiny_model("llama", vocab_size=len(tokenizer), hidden=32, layers=4).save_pretrained(tmp_path / "full")
    tokenizer.save_pretrained(tmp_path / "full")
    message = cli_error(monkeypatch, capsys, RECIPE, f"model.target={tmp_path / 'full'}",
                        f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={tmp_path / 'out'}")
    assert "model.ptd_token_id: the embedding has no spare row" in message, message
