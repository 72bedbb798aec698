"""A standalone draft's draft vocabulary (kinds/draft_vocab.py, FR-Spec): our decoder reads out only those lm_head rows
and proposes only those tokens. Greedy output still equals the target's (eager and compiled), sampled output is still
distributed as the target's (tokens outside the vocabulary included), the drafted token is the argmax over the
vocabulary; the trainer chooses the rows' most frequent label tokens, the export stores them beside whole weights,
specdistill-eval reads them (and leaves them out under --draft-vocab full); a bad file is one line."""
from __future__ import annotations

import json

import pytest
import torch
from test_decode_sampling import CONFIGS, VOCAB, accept_always, control_pvalues, lossless_pvalues
from test_eval_cli import pair, run_cli  # noqa: F401 - the tiny saved pair (a module fixture) and the CLI runner
from transformers import AutoModelForCausalLM, AutoTokenizer

import decode.loop.speculative as spec
import decode.loop.static as static
from decode.loop.sampling import SamplingConfig
from distill.data.dataset import build_data
from kinds import kind_named, kind_of
from kinds.draft_vocab import (
    DRAFT_VOCAB_FILE,
    DraftVocabError,
    label_token_counts,
    most_frequent,
    read_draft_vocab,
    write_draft_vocab,
)
from kinds.standalone.drafter import ModelDrafter, subset_lm
from specdistill.recipes import load_recipe

from helpers import TINY_RECIPE, cli_error, learnt_tiny_pair, run_train
from tiny import perturbed_copy, tiny_model

STANDALONE = kind_named("standalone")


def greedy_pair(vocab: int = 96):
    target = tiny_model("llama", seed=0, vocab_size=vocab)
    return target, perturbed_copy(target, 0.3)


# ---- the decoder -----------------------------------------------------------------------------------------------------

def test_the_drafted_token_is_the_argmax_over_the_vocabulary_and_nothing_is_added_to_the_draft():
    target, draft = greedy_pair()
    keys = set(draft.state_dict())
    ids = torch.tensor([3, 7, 8, 20, 41, 42, 60, 95])
    drafter = ModelDrafter(draft, vocab=ids)
    prompt = torch.tensor([[5, 9, 13, 2]])
    drafter.start(prompt[:, :-1], target.config.vocab_size)
    proposed, q = drafter.propose(prompt[0].tolist(), prompt[:, -1:], 3, SamplingConfig(0.0), None)
    expected, seq = [], prompt
    with torch.no_grad():
        for _ in range(3):
            logits = draft(seq).logits[0, -1]
            token = ids[logits[ids].argmax()]
            expected.append(int(token))
            seq = torch.cat([seq, token.view(1, 1)], dim=1)
    assert proposed.tolist() == expected and q is None
    assert set(draft.state_dict()) == keys  # the readout lives beside the model, not in it
    assert subset_lm(draft, ids) is subset_lm(draft, ids)  # made once per model and vocabulary (compiled steps reused)


@pytest.mark.parametrize("gamma", [1, 3])
def test_greedy_output_with_a_draft_vocabulary_equals_the_target(gamma):
    target, draft = greedy_pair()
    draft.draft_vocab_ids = torch.arange(0, 96, 3)  # a third of the vocabulary: many proposals must be wrong
    prompt = torch.tensor([[5, 9, 13, 2, 40]])
    plain = spec.autoregressive_generate(target, prompt, max_new_tokens=24)
    out = spec.speculative_generate(target, draft, prompt, max_new_tokens=24, gamma=gamma, kind=kind_of(draft))
    assert out.new_tokens == plain.new_tokens
    assert any(t % 3 for t in out.new_tokens)  # tokens outside the vocabulary still come, from the target
    assert out.stats.accepted_tokens > 0


def test_compiled_greedy_output_with_a_draft_vocabulary_equals_the_target(monkeypatch):
    monkeypatch.setattr(static, "BACKEND", "aot_eager")
    target, draft = greedy_pair()
    draft.draft_vocab_ids = torch.arange(0, 96, 2)
    prompt = torch.tensor([[5, 9, 13, 2, 40]])
    plain = spec.autoregressive_generate(target, prompt, max_new_tokens=16)
    for _ in range(2):  # the second prompt reuses the compiled steps of the same readout
        out = spec.speculative_generate(target, draft, prompt, max_new_tokens=16, gamma=2, compile=True,
                                        kind=kind_of(draft))
        assert out.new_tokens == plain.new_tokens


def test_a_training_draft_is_read_out_with_its_current_weights():
    target, draft = greedy_pair()
    ids = torch.arange(0, 96, 2)
    lm = subset_lm(draft, ids)
    with torch.no_grad():
        draft.get_output_embeddings().weight.mul_(2.0)  # an optimizer step between two checks
    assert subset_lm(draft, ids) is lm
    torch.testing.assert_close(lm.weight, draft.get_output_embeddings().weight[ids])


def small_pair():
    target = tiny_model("llama", seed=0, vocab_size=VOCAB)
    draft = tiny_model("llama", seed=5, vocab_size=VOCAB, layers=1)
    draft.draft_vocab_ids = torch.tensor([0, 2, 3, 6])  # half of the 8 tokens can never be proposed
    return target, draft


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[3]], ids=str)
def test_sampling_with_a_draft_vocabulary_is_lossless(cfg):
    target, draft = small_pair()
    assert min(lossless_pvalues(target, draft, cfg)) > 1e-4  # first, second, third token and the joint of two


def test_sampling_negative_control_with_a_draft_vocabulary(monkeypatch):
    target, draft = small_pair()
    monkeypatch.setattr(spec, "accept_sampled", accept_always)  # output follows q: nothing outside the vocabulary
    assert min(control_pvalues(target, draft, CONFIGS[0])) < 1e-6


def test_a_vocabulary_id_past_the_target_is_refused():
    target, draft = greedy_pair()
    drafter = ModelDrafter(draft, vocab=torch.tensor([1, 2, 200]))
    with pytest.raises(ValueError, match="id 200, outside the target's 96 logits"):
        drafter.start(torch.tensor([[1, 2]]), target.config.vocab_size)


# ---- the file --------------------------------------------------------------------------------------------------------

def test_the_file_round_trips_and_bad_files_are_one_clear_error(tmp_path):
    assert read_draft_vocab(tmp_path, 96) is None
    write_draft_vocab(tmp_path, torch.tensor([4, 1, 9]), 96)
    assert read_draft_vocab(tmp_path, 96).tolist() == [1, 4, 9]
    path = tmp_path / DRAFT_VOCAB_FILE
    for text, words in [("\x00\x01not json", "is not a JSON file"), ('{"ids": "1,2"}', "holds no list of token ids"),
                        ('{"ids": [1, 2, 96]}', "distinct ids in [0, 96)"), ('{"ids": [1, 1]}', "with repeats"),
                        ("[1, 2]", "holds no list of token ids")]:
        path.write_text(text)
        with pytest.raises(DraftVocabError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            read_draft_vocab(tmp_path, 96)


# ---- training, export, eval ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny standalone draft trained with model.draft_vocab_size=48 (and the workdir it came from)."""
    root = learnt_tiny_pair(tmp_path_factory.mktemp("vocab"))
    out = run_train(root, "draft", "model.draft_vocab_size=48", "train.max_steps=8", "train.save_steps=8",
                    "train.report_to=[]", "eval.gammas=[2]")
    return root, out


def test_training_chooses_the_most_frequent_label_tokens_and_the_export_stores_them(trained):
    root, out = trained
    recipe = load_recipe(out / "recipe.yaml")
    rows = build_data(recipe.data, AutoTokenizer.from_pretrained(root / "target"), seed=recipe.train.seed).train
    vocab_size = json.loads((out / "config.json").read_text())["vocab_size"]
    expected = most_frequent(label_token_counts(rows, vocab_size), 48)
    assert read_draft_vocab(out, vocab_size).tolist() == expected.tolist()
    stored = json.loads((out / DRAFT_VOCAB_FILE).read_text())
    assert stored["size"] == 48 and stored["vocab_size"] == vocab_size
    # the weights stay whole: transformers (and vLLM) load the folder as any causal LM
    assert AutoModelForCausalLM.from_pretrained(out).get_output_embeddings().weight.shape[0] == vocab_size
    records = [json.loads(line) for line in (out / "acceptance.jsonl").read_text().splitlines()]
    assert records and all(r["greedy_match"] == 1.0 for r in records)  # the trainer's checks ran with the readout


def test_a_lora_draft_keeps_its_vocabulary_through_the_merge(trained):
    root, _ = trained
    out = run_train(root, "lora", "model.draft_config=null", "model.draft_layers=[0, 3]", "lora.enabled=true",
                    "model.draft_vocab_size=40", "train.max_steps=4", "train.save_steps=4", "train.report_to=[]",
                    "eval.gammas=[2]")
    assert read_draft_vocab(out, 321).numel() == 40 and not (out / "adapter_config.json").exists()
    records = [json.loads(line) for line in (out / "acceptance.jsonl").read_text().splitlines()]
    assert records and all(r["greedy_match"] == 1.0 for r in records)


def test_eval_reads_the_vocabulary_and_leaves_it_out_when_asked(trained, tmp_path, capsys):
    root, out = trained
    (tmp_path / "prompts.txt").write_text("def add(a, b):\nclass Point:\n")
    reports = {}
    for mode in ("auto", "full"):
        path = tmp_path / f"{mode}.json"
        code, _, _ = run_cli(["--target", str(root / "target"), "--draft", str(out), "--prompts",
                              str(tmp_path / "prompts.txt"), "--gamma", "2", "--max-new-tokens", "12",
                              "--draft-vocab", mode, "--output", str(path), "--quiet"], capsys)
        assert code == 0
        reports[mode] = json.loads(path.read_text())
    assert reports["auto"]["draft_vocab"] == 48 and reports["full"]["draft_vocab"] is None
    for report in reports.values():
        assert report["results"][0]["greedy_match"] == 1.0


def test_a_bad_vocabulary_file_is_one_line_from_eval(pair, tmp_path, capsys):  # noqa: F811 - the fixture
    import shutil
    draft = tmp_path / "draft"
    shutil.copytree(pair / "draft", draft)
    (draft / DRAFT_VOCAB_FILE).write_text('{"ids": [1, 2, 99999]}')
    code, _, err = run_cli(["--target", str(pair / "target"), "--draft", str(draft), "--prompts",
                            str(pair / "prompts.txt"), "--max-new-tokens", "4", "--quiet"], capsys)
    assert code == 1 and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert DRAFT_VOCAB_FILE in line and "distinct ids in [0," in line, err


# ---- recipes ---------------------------------------------------------------------------------------------------------

def test_recipes_that_cannot_take_a_draft_vocabulary_refuse_it_in_one_line(monkeypatch, capsys, tmp_path):
    message = cli_error(monkeypatch, capsys, TINY_RECIPE, "model.target=t", "data.dataset=x.txt",
                        "model.draft_kind=dflash", "model.draft_config=null", "model.draft_vocab_size=64")
    assert "model.draft_vocab_size: got 64; allowed: null with model.draft_kind dflash" in message
    root = learnt_tiny_pair(tmp_path)
    message = cli_error(monkeypatch, capsys, TINY_RECIPE, f"model.target={root / 'target'}",
                        f"data.dataset={root / 'code.txt'}", f"train.output_dir={tmp_path / 'out'}",
                        "model.draft_vocab_size=100000")
    assert "model.draft_vocab_size: got 100000; allowed: at most the vocabulary's" in message
