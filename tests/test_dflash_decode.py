"""Decoding with a DFlash draft (kinds/dflash/model.py, kinds/dflash/drafter.py): lossless, the drafter's cached context
is what a fresh pass gives, the served folder round-trips, and `specdistill eval` runs it.

Targets are tiny Llama models with 4 layers; drafts are random, or trained here for a hundred steps on the target's
own greedy continuations (every block slot learns the token the target's greedy decoding puts there), which gives
partial acceptance, so rejections and resampling happen.
"""
import json

import pytest
import test_decode_sampling as sampling
import torch
import torch.nn.functional as F

import decode.loop.speculative as spec
from decode import autoregressive_generate
from decode.loop.sampling import SamplingConfig
from kinds import kind_of, kind_of_source
from kinds.dflash import KIND as DFLASH_KIND
from kinds.dflash.drafter import DFlashDrafter
from kinds.dflash.model import DFlashDraft, default_target_layer_ids, dflash_config_for, fit_problems, mask_token_id_for
from specdistill.drafts import speculative_generate

from tiny import save_and_load, tiny_model, tiny_tokenizer

PROMPTS = [torch.tensor([[1, 5, 7, 9, 11, 5, 7]]), torch.tensor([[1]]),
           torch.tensor([[1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 2, 9]])]
BLOCK = 5  # drafts up to 4 tokens


def new_draft(target: torch.nn.Module, seed: int = 1, **config) -> DFlashDraft:
    config = {"mask_token_id": target.config.vocab_size - 1, "block_size": BLOCK, **config}
    torch.manual_seed(seed)
    return DFlashDraft(dflash_config_for(target.config, **config)).bind_target(target).eval()


def block_mask(length: int, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One block per anchor M = 0..T-1, [x_M, mask x (slots - 1)] at positions M..M+slots-1, all in one pass: the
    query positions [T * slots] and the mask [1, 1, T * slots, T + T * slots] letting block M see context < M and
    its own slots (DFlash's training mask)."""
    anchor = torch.arange(length).repeat_interleave(slots)
    sees_context = torch.arange(length).view(1, -1) < anchor.view(-1, 1)
    same_block = anchor.view(1, -1) == anchor.view(-1, 1)
    mask = torch.cat([sees_context, same_block], dim=1).view(1, 1, length * slots, -1)
    return anchor + torch.arange(slots).repeat(length), mask


def train_draft(target: torch.nn.Module, draft: DFlashDraft, steps: int = 100, seed: int = 0) -> DFlashDraft:
    """Cross-entropy of every slot j of the block at anchor M against the token the target's greedy decoding puts
    at M + j, on the target's own greedy continuations of random 2-token prompts (all anchors of a sequence in one
    pass, block_mask)."""
    g = torch.Generator().manual_seed(seed)
    vocab, gamma, prompt_len = target.config.vocab_size, draft.block_size - 1, 2
    with torch.no_grad():
        seqs = torch.cat([autoregressive_generate(target, p.view(1, -1), max_new_tokens=30).sequences
                          for p in torch.randint(3, vocab, (32, prompt_len), generator=g)])  # [B, T]
        out = target(seqs, output_hidden_states=True)
        aux = torch.cat([out.hidden_states[i] for i in draft.context_layers], dim=-1)  # [B, T, k * H]
    b, t = seqs.shape
    labels = torch.full((b, t, gamma), -100)  # [B, M, j - 1]: the greedy token at M + j after x_0..x_M
    labels[:, :, 0] = out.logits.argmax(-1)
    for j in range(2, gamma + 1):  # slots past the first: known where x_{M+1}.. are greedy tokens themselves
        labels[:, prompt_len - 1: t - j, j - 1] = seqs[:, prompt_len - 1 + j:]
    blocks = torch.full((b, t, gamma + 1), draft.mask_token_id)
    blocks[:, :, 0] = seqs
    query_positions, mask = block_mask(t, gamma + 1)
    optimizer = torch.optim.Adam(draft.parameters(), lr=1e-2)
    for _ in range(steps):
        rows = torch.randint(0, b, (8,), generator=g)
        context = draft.context_kv(aux[rows], torch.arange(t).expand(8, -1))
        logits = draft.block_logits(blocks[rows].view(8, -1), query_positions.expand(8, -1), context, mask)
        logits = logits.view(8, t, gamma + 1, vocab)[:, :, 1:]  # slots 1..gamma
        loss = F.cross_entropy(logits.reshape(-1, vocab), labels[rows].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return draft.eval()


@pytest.fixture(scope="module")
def trained():
    target = tiny_model("llama", seed=0, layers=4)
    target.requires_grad_(False)  # the shared embedding and lm_head stay the target's
    return target, train_draft(target, new_draft(target, target_layer_ids=[0, 1, 2]))


# ---- greedy: the target's own output ------------------------------------------------------------------------------
def test_random_draft_greedy_equals_plain_decoding():
    target = tiny_model("llama", seed=0, layers=4)
    draft = new_draft(target)
    for prompt in PROMPTS:
        plain = autoregressive_generate(target, prompt, max_new_tokens=30)
        for gamma in (1, 2, 3, 4):
            out = speculative_generate(target, draft, prompt, max_new_tokens=30, gamma=gamma)
            assert out.sequences.tolist() == plain.sequences.tolist(), (prompt, gamma)


def test_trained_draft_greedy_equals_plain_decoding_with_rejections(trained):
    target, draft = trained
    for gamma in (1, 2, 3, 4):
        accepted = drafted = 0
        accepted_lengths = torch.zeros(gamma + 1, dtype=torch.long)
        for prompt in PROMPTS:
            plain = autoregressive_generate(target, prompt, max_new_tokens=40)
            out = speculative_generate(target, draft, prompt, max_new_tokens=40, gamma=gamma)
            assert out.sequences.tolist() == plain.sequences.tolist(), (prompt, gamma)
            accepted, drafted = accepted + out.stats.accepted_tokens, drafted + out.stats.drafted_tokens
            accepted_lengths += torch.tensor(out.stats.accepted_length_histogram)
        assert 0 < accepted < drafted, gamma  # accepted drafts, and rejections
        if gamma > 1:
            assert accepted_lengths[2:].sum() > 0, gamma  # later slots of a block are accepted too, not only the first


# ---- the cached context equals a fresh pass ------------------------------------------------------------------------
def reference_proposal(target, draft, history: list[int], gamma: int) -> list[int]:
    """Greedy drafts after `history` without any cache: the target's hidden states of every token but the newest
    as context, then the block [newest, mask x gamma], through DFlashDraft.forward."""
    ids = torch.tensor([history])
    with torch.no_grad():
        if len(history) > 1:
            hidden = target(ids[:, :-1], output_hidden_states=True).hidden_states
            aux = torch.cat([hidden[i] for i in draft.context_layers], dim=-1)  # [1, M, k * H]
        else:  # a one-token prompt's first block: no context yet
            aux = torch.zeros(1, 0, draft.fc.in_features)
        block = torch.tensor([[history[-1]] + [draft.mask_token_id] * gamma])
        return draft(aux, block)[0, 1:].argmax(-1).tolist()


def test_cached_context_after_rejections_equals_a_fresh_pass(trained, monkeypatch):
    target, draft = trained
    seen = []
    original = DFlashDrafter.propose
    # the committed ids on the host, which the decoder hands only to a drafter that asks (decode.loop.drafters)
    monkeypatch.setattr(DFlashDrafter, "host_history", True, raising=False)

    def recording(self, history, cur, gamma, cfg, generator):
        drafts, q = original(self, history, cur, gamma, cfg, generator)
        seen.append((list(history), drafts.tolist()))
        return drafts, q

    monkeypatch.setattr(DFlashDrafter, "propose", recording)
    for prompt in PROMPTS[:2]:
        out = speculative_generate(target, draft, prompt, max_new_tokens=30, gamma=3)
        assert out.stats.accepted_tokens < out.stats.drafted_tokens  # the context grew by accepted tokens only
    assert len(seen) > 10
    for history, drafts in seen:
        if drafts:
            assert drafts == reference_proposal(target, draft, history, len(drafts))


def test_many_blocks_in_one_masked_pass_equal_each_block_alone(trained):
    """block_mask (the trainer's pass above) computes what each block computes alone, position for position."""
    target, draft = trained
    ids = torch.tensor([[1, 5, 7, 9, 11, 5]])
    slots, t = 3, ids.shape[1]
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states
        aux = torch.cat([hidden[i] for i in draft.context_layers], dim=-1)
        blocks = torch.full((1, t, slots), draft.mask_token_id)
        blocks[:, :, 0] = ids
        positions, mask = block_mask(t, slots)
        together = draft.block_logits(blocks.view(1, -1), positions.view(1, -1),
                                      draft.context_kv(aux, torch.arange(t).view(1, -1)), mask).view(t, slots, -1)
        for m in range(1, t):
            torch.testing.assert_close(together[m], draft(aux[:, :m], blocks[:, m])[0])


# ---- sampling: lossless (chi-square), and the negative control fails -----------------------------------------------
def sampling_pair():
    target = tiny_model("llama", seed=0, vocab_size=sampling.VOCAB, layers=4)
    return target, new_draft(target, seed=3, block_size=3)  # gamma 2; q from the target's sharp lm_head


def test_dflash_sampling_is_lossless():
    target, draft = sampling_pair()
    for pvalue in sampling.lossless_pvalues(target, draft, sampling.CONFIGS[0], runs=1500):  # temperature 1
        assert pvalue > 1e-4


def test_dflash_sampling_negative_control(monkeypatch):
    target, draft = sampling_pair()
    monkeypatch.setattr(spec, "accept_sampled", sampling.accept_always)
    assert min(sampling.control_pvalues(target, draft, sampling.CONFIGS[0], runs=800)) < 1e-6


def test_q_rows_are_each_slots_distribution():
    target, draft = sampling_pair()
    drafter = DFlashDrafter(draft)
    prompt = sampling.PROMPT
    spec.prefill(spec.cached_lm(target, False, "target", 64, (3,), drafter.aux_layers), drafter, prompt)
    drafts, q = drafter.propose(prompt[0].tolist(), prompt[:, -1:], 2, SamplingConfig(1.0),
                                torch.Generator().manual_seed(0))
    assert drafts.shape == (2,) and q.shape == (2, sampling.VOCAB)
    torch.testing.assert_close(q.sum(-1), torch.ones(2))
    assert (q[torch.arange(2), drafts] > 0).all()
    with pytest.raises(ValueError, match="gamma 3 does not fit"):
        drafter.propose(prompt[0].tolist(), prompt[:, -1:], 3, SamplingConfig(1.0), None)


# ---- the served folder: round trip, vLLM's names and conventions --------------------------------------------------
def test_save_load_round_trip_gives_identical_proposals(trained, tmp_path):
    target, draft = trained
    DFLASH_KIND.save(draft, tmp_path / "dflash", gamma=3)
    loaded = DFlashDraft.from_pretrained(tmp_path / "dflash", target)
    ids, block = torch.tensor([[1, 5, 7, 9, 11]]), torch.tensor([[13] + [draft.mask_token_id] * 4])
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states
        aux = torch.cat([hidden[i] for i in draft.context_layers], dim=-1)
        torch.testing.assert_close(loaded(aux, block), draft(aux, block), rtol=0, atol=0)
    for prompt in PROMPTS:
        a = speculative_generate(target, draft, prompt, max_new_tokens=20, gamma=3)
        b = speculative_generate(target, loaded, prompt, max_new_tokens=20, gamma=3)
        assert a.sequences.tolist() == b.sequences.tolist() and a.stats.to_dict() == b.stats.to_dict()
    assert loaded.generation_config.num_assistant_tokens == 3
    assert kind_of(loaded) is DFLASH_KIND and kind_of(DFlashDrafter(loaded)) is DFLASH_KIND


def test_served_folder_holds_what_vllm_loads(tmp_path):
    """vLLM's qwen3_dflash: architectures DFlashDraftModel, model_type qwen3, dflash_config's mask_token_id and
    target_layer_ids (vLLM reads hidden-state ids t + 1), weights named as its loader maps them (after `model.`),
    no embedding and no lm_head (vLLM shares the target's)."""
    from safetensors.torch import load_file

    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # z-lab's Qwen3-8B-DFlash-b16
    assert default_target_layer_ids(36, 1) == [18] and default_target_layer_ids(4, 2) == [1, 2]
    assert all(len(set(default_target_layer_ids(n, k))) == min(k, n - 1) for n in range(2, 40) for k in (1, 3, 5))
    target = tiny_model("llama", seed=0, layers=4)
    draft = new_draft(target, num_layers=2, target_layer_ids=[0, 2])
    assert draft.context_layers == (1, 3)
    draft.save_pretrained(tmp_path / "dflash")
    config = json.loads((tmp_path / "dflash" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"] == {"mask_token_id": 95, "target_layer_ids": [0, 2]}
    assert config["block_size"] == BLOCK and config["num_hidden_layers"] == 2 and config["num_target_layers"] == 4
    layer = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm",
             "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
             "post_attention_layernorm"]
    expected = {f"layers.{i}.{name}.weight" for i in range(2) for name in layer} | {
        "fc.weight", "hidden_norm.weight", "norm.weight"}
    weights = load_file(tmp_path / "dflash" / "model.safetensors")
    assert set(weights) == expected and weights["fc.weight"].shape == (32, 2 * 32)


def test_mask_token_is_the_tokenizers_or_a_spare_row():
    tok = tiny_tokenizer()
    assert mask_token_id_for(tok, len(tok) + 4) == len(tok)  # the first row past the tokenizer (SpecForge's <|MASK|>)
    with pytest.raises(ValueError, match="no spare row"):
        mask_token_id_for(tok, len(tok))
    tok.add_special_tokens({"mask_token": "<mask>"})
    assert mask_token_id_for(tok, len(tok)) == tok.mask_token_id


# ---- the kind: recognised, measured by `specdistill eval`, a wrong folder in one line ------------------------------
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A target with a padded lm_head (a spare row for the mask token), its tokenizer, a DFlash folder (with the
    target's tokenizer, as the export writes it), prompts."""
    root = tmp_path_factory.mktemp("dflash-pair")
    tok = tiny_tokenizer()
    target = save_and_load(tiny_model("llama", seed=0, vocab_size=len(tok) + 4, layers=4), root / "target", tok)
    draft = new_draft(target, mask_token_id=mask_token_id_for(tok, target.config.vocab_size))
    DFLASH_KIND.save(draft, root / "dflash", gamma=2)
    tok.save_pretrained(root / "dflash")  # as the export writes it (the target's tokenizer)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in
                                                ["def add(a, b):", "class Point:"]))
    return root


def run_specdistill(argv: list[str], capsys) -> tuple[int, str]:
    """`specdistill ARGV` in process: (exit code, stderr)."""
    from specdistill.cli.main import cli

    try:
        cli(argv)
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code
    return code, capsys.readouterr().err


def test_specdistill_eval_runs_a_dflash_folder(served, tmp_path, capsys):
    assert kind_of_source(served / "dflash") is DFLASH_KIND and kind_of_source(served / "target").name == "standalone"
    out = tmp_path / "eval.json"
    code, err = run_specdistill(["eval", "--target", str(served / "target"), "--draft", str(served / "dflash"),
                                 "--prompts", str(served / "prompts.jsonl"), "--gamma", "2", "4",
                                 "--max-new-tokens", "8", "--output", str(out), "--quiet"], capsys)
    assert code == 0, err
    report = json.loads(out.read_text())
    assert report["draft_kind"] == "dflash"
    assert [(r["gamma"], r["greedy_match"]) for r in report["results"]] == [(2, 1.0), (4, 1.0)]


def test_a_draft_of_another_target_is_one_line(served, tmp_path, capsys):
    other = tiny_model("llama", seed=0, hidden=64, layers=4, vocab_size=324)
    new_draft(other).save_pretrained(tmp_path / "other")
    config = json.loads((tmp_path / "other" / "config.json").read_text())
    assert fit_problems(config, other.config) == {}
    wrong = tiny_model("llama", seed=0, vocab_size=324, layers=4)
    assert list(fit_problems(config, wrong.config)) == ["hidden_size"]
    with pytest.raises(ValueError, match="hidden_size=64.* but the target's hidden_size is 32"):
        DFlashDraft.from_pretrained(tmp_path / "other", wrong)  # loading next to the wrong target names it
    code, err = run_specdistill(["eval", "--target", str(served / "target"), "--draft", str(tmp_path / "other"),
                                 "--prompts", str(served / "prompts.jsonl"), "--quiet"], capsys)
    assert code == 1 and "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "(dflash) does not fit" in lines[0] and "hidden_size" in lines[0], err


def test_what_only_vllm_implements_is_refused_in_one_line(tmp_path):
    """Variants vLLM's qwen3_dflash reads and this decoder does not: refused, never silently run otherwise."""
    target = tiny_model("llama", seed=0, layers=4)
    draft = new_draft(target)
    config = draft.config.to_dict()
    for change, check in [({"dflash_config": {**config["dflash_config"], "use_swa": True}}, "attention"),
                          ({"layer_types": ["sliding_attention"]}, "attention"),
                          ({"draft_vocab_size": 32}, "vocab"),
                          ({"dflash_config": {**config["dflash_config"], "mask_token_id": 96}}, "mask_token")]:
        assert list(fit_problems({**config, **change}, target.config)) == [check], change
    draft.save_pretrained(tmp_path / "dflash")
    (tmp_path / "dflash" / "mask_embedding.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="mask_embedding.pt"):
        DFlashDraft.from_pretrained(tmp_path / "dflash", target)


def test_a_gamma_past_the_block_is_one_line(trained):
    target, draft = trained
    with pytest.raises(ValueError, match=f"gamma 5 does not fit this DFlash draft's block of {BLOCK} tokens"):
        speculative_generate(target, draft, PROMPTS[0], max_new_tokens=8, gamma=5)
    with pytest.raises(ValueError, match="target_layer_ids \\[3\\] must be distinct ascending ids in 0..2"):
        new_draft(target, target_layer_ids=[3])


def test_specdistill_check_passes_a_dflash_folder_and_prints_its_vllm_command(served, capsys):
    """The DFlash deployment checks (kinds/dflash/deploy.py) pass on the saved folder, and the commands serve it with
    vLLM's dflash method at the folder's gamma."""
    from specdistill.cli.main import cli

    try:
        cli(["check", "--target", str(served / "target"), "--draft", str(served / "dflash")])
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code
    captured = capsys.readouterr()
    assert code in (0, None), captured.err
    assert "mask_token" in captured.out and '"method": "dflash"' in captured.out, captured.out
    assert '"num_speculative_tokens": 2' in captured.out
