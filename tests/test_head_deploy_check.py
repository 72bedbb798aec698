"""specdistill-check on an EAGLE-3 head folder: every head check fails on a head crafted to break it, all pass on
a good one, and the serving commands are vLLM's eagle3 and SGLang's EAGLE3."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_deploy_check import edit_json, run_cli

from kinds.eagle3.deploy import HEAD_CHECKS
from kinds.eagle3.model import Eagle3Head, head_config
from specdistill.drafts import check_deploy, serving_commands

from helpers import as_bash_runs_them
from tiny import tiny_model, tiny_tokenizer

GAMMA = 3


def export(head: Eagle3Head, folder, dtype=None) -> None:
    head.save_pretrained(folder, dtype=dtype)
    (folder / "generation_config.json").write_text(json.dumps(
        {"num_assistant_tokens": GAMMA, "num_assistant_tokens_schedule": "constant",
         "assistant_confidence_threshold": 0.0}))


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """A 6-layer float32 target; a good whole-vocabulary head and a good head over 40 tokens (d2t non-trivial)."""
    root = tmp_path_factory.mktemp("heads")
    tok = tiny_tokenizer()
    target = tiny_model("llama", vocab_size=len(tok), layers=6)
    target.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    export(Eagle3Head(head_config(target.config)), root / "good")
    small = Eagle3Head(head_config(target.config, draft_vocab_size=40))
    small.set_vocab(torch.arange(40) * 7)
    export(small, root / "small")
    return root


def edit_weights(folder, change) -> None:
    state = load_file(folder / "model.safetensors")
    change(state)
    save_file(state, str(folder / "model.safetensors"))


def two_aux_layers(d):
    config = json.loads((d / "config.json").read_text())
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 4]
    (d / "config.json").write_text(json.dumps(config))
    edit_weights(d, lambda s: s.update({"fc.weight": s["fc.weight"][:, : 2 * 32].contiguous()}))


def aux_layer_past_the_target(d):
    config = json.loads((d / "config.json").read_text())
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 3, 6]  # the target has layers 0..5
    (d / "config.json").write_text(json.dumps(config))


BROKEN = [
    ("aux_layers", "good", two_aux_layers),
    ("aux_layers", "good", aux_layer_past_the_target),
    ("hidden_size", "good", lambda d: edit_json(d / "config.json", target_hidden_size=64)),
    ("vocab", "good", lambda d: edit_json(d / "config.json", vocab_size=300)),
    ("lm_head", "good", lambda d: edit_weights(d, lambda s: s.update({"lm_head.weight": s["lm_head.weight"][:300]}))),
    ("d2t", "good", lambda d: edit_weights(d, lambda s: s.update({"d2t": torch.zeros(320, dtype=torch.long)}))),
    ("d2t", "small", lambda d: edit_weights(d, lambda s: s.pop("d2t"))),
    ("d2t", "small", lambda d: edit_weights(d, lambda s: s.update({"d2t": s["d2t"] + 100}))),  # past the vocab
    ("d2t", "small", lambda d: edit_weights(d, lambda s: s.update({"d2t": -torch.arange(40)}))),  # all to id 0
    ("dtype", "good", lambda d: export(Eagle3Head.from_pretrained(d), d, dtype=torch.bfloat16)),
    ("generation_config", "good", lambda d: (d / "generation_config.json").write_text('{"num_assistant_tokens": 0}')),
]


@pytest.mark.parametrize("name", ["good", "small"])
def test_a_good_head_passes_and_gets_eagle3_serving_commands(heads, tmp_path, capsys, name):
    report = check_deploy(str(heads / "target"), heads / name)
    assert report.passed and report.kind == "eagle3" and report.gamma == GAMMA, report.problems
    code, out, _ = run_cli(["--target", str(heads / "target"), "--draft", str(heads / name),
                            "--json", str(tmp_path / "check.json")], capsys)
    assert code == 0
    assert [line.split()[1] for line in out.splitlines()[:len(HEAD_CHECKS)]] == list(HEAD_CHECKS)
    assert f'--speculative-config \'{{"method": "eagle3", "model": "{heads / name}", "num_speculative_tokens": ' \
           f'{GAMMA}}}\'' in out
    assert "--speculative-algorithm EAGLE3" in out and f"--speculative-draft-model-path {heads / name}" in out
    assert f"--speculative-num-steps {GAMMA} --speculative-eagle-topk 1" in out
    assert f"--speculative-num-draft-tokens {GAMMA + 1}" in out
    saved = json.loads((tmp_path / "check.json").read_text())
    assert saved["passed"] is True and saved["kind"] == "eagle3" and saved["checks"] == list(HEAD_CHECKS)


@pytest.mark.parametrize("check, base, breaker", BROKEN, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(BROKEN)])
def test_each_head_check_fails_on_a_head_crafted_to_break_it(heads, tmp_path, capsys, check, base, breaker):
    head = tmp_path / "head"
    shutil.copytree(heads / base, head)
    breaker(head)
    report = check_deploy(str(heads / "target"), head)
    assert list(report.problems) == [check], report.problems
    code, out, _ = run_cli(["--target", str(heads / "target"), "--draft", str(head)], capsys)
    assert code == 1
    fails = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and fails[0].startswith(f"FAIL {check}: ")


def test_a_head_without_a_gamma_is_a_warning_not_a_failure(heads, tmp_path):
    """Hub heads name no gamma (issue 17): the check warns with the fix and the commands use a placeholder."""
    head = tmp_path / "head"
    shutil.copytree(heads / "good", head)
    (head / "generation_config.json").unlink()
    report = check_deploy(str(heads / "target"), head)
    assert report.passed and list(report.warnings) == ["generation_config"] and report.gamma is None
    assert "WARN generation_config: " in "\n".join(report.lines())


def test_a_heads_serving_commands_run_as_printed_from_any_folder_name(heads, tmp_path):
    """A head and its target in folders with a space, a quote and a $: specdistill-eval, both vLLM lines and SGLang,
    run by bash as printed, get the paths unchanged."""
    target, head = tmp_path / "my models" / "target", tmp_path / "my models" / "bob's $head"
    shutil.copytree(heads / "target", target)
    shutil.copytree(heads / "good", head)
    commands = as_bash_runs_them(serving_commands(check_deploy(str(target), str(head))))
    evaluate, *vllm, sglang = commands
    assert evaluate[:5] == ["specdistill-eval", "--target", str(target), "--draft", str(head)]
    assert all(alone == ["vllm", "serve", str(head)] for alone in vllm[:-1])  # the speculators format: the head alone
    assert vllm[-1][:3] == ["vllm", "serve", str(target)] and json.loads(vllm[-1][-1])["model"] == str(head)
    assert sglang[sglang.index("--model-path") + 1] == str(target)
    assert sglang[sglang.index("--speculative-draft-model-path") + 1] == str(head)
