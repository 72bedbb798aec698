"""specdistill-check: every check fails on a draft crafted to break it, and all pass on a good draft."""
import ast
import json
import shutil
import sys

import pytest
import torch

from decode.deploy.deploy_check import DEFAULT_GAMMA
from kinds.standalone.deploy import CHECKS
from specdistill.cli import check as check_script
from specdistill.drafts import check_deploy, serving_commands

from helpers import as_bash_runs_them
from tiny import tiny_model, tiny_tokenizer

GAMMA = 3


def edit_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny float32 target and a good exported draft: same tokenizer and vocab, gamma in its generation_config."""
    root = tmp_path_factory.mktemp("deploy")
    tok = tiny_tokenizer()
    tiny_model("llama", vocab_size=len(tok)).save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    draft = tiny_model("llama", vocab_size=len(tok), layers=1, seed=1)
    gc = draft.generation_config
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = GAMMA, "constant"
    gc.assistant_confidence_threshold = 0.0
    draft.save_pretrained(root / "good")
    tok.save_pretrained(root / "good")
    return root


def replace_model(d, model):
    """Save ``model`` into ``d`` keeping d's generation_config.json (save_pretrained writes its own)."""
    kept = (d / "generation_config.json").read_text()
    model.save_pretrained(d)
    (d / "generation_config.json").write_text(kept)


def break_safetensors(d, root):
    weights = {k: v.clone() for k, v in tiny_model("llama", vocab_size=320, layers=1).state_dict().items()}
    torch.save(weights, d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()


def break_tokenizer_vocab(d, root):
    tiny_tokenizer(text="completely different text " * 40).save_pretrained(d)


def break_special_tokens(d, root):
    tok = tiny_tokenizer()
    tok.eos_token = "<unk>"  # same vocabulary, another eos id
    tok.save_pretrained(d)


def break_vocab(d, root):
    replace_model(d, tiny_model("llama", vocab_size=328, layers=1))  # lm_head padded by 8 rows past the target's


def break_positions(d, root):
    edit_json(d / "config.json", max_position_embeddings=128)  # target: 512


def break_rope(d, root):
    edit_json(d / "config.json", rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})


def break_dtype(d, root):
    replace_model(d, tiny_model("llama", vocab_size=320, layers=1).to(torch.bfloat16))


def break_generation_config(d, root):
    edit_json(d / "generation_config.json", assistant_confidence_threshold=0.4)


def drop_generation_config(d, root):
    (d / "generation_config.json").unlink()


BROKEN = [("safetensors", break_safetensors), ("tokenizer", break_tokenizer_vocab),
          ("tokenizer", break_special_tokens), ("vocab", break_vocab), ("max_position_embeddings", break_positions),
          ("rope", break_rope), ("dtype", break_dtype), ("generation_config", break_generation_config)]


def run_cli(argv, capsys):
    sys.argv = ["specdistill-check", *argv]
    with pytest.raises(SystemExit) as exit_info:
        check_script.cli()
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def test_a_good_draft_passes_and_gets_serving_commands(pair, tmp_path, capsys):
    report = check_deploy(str(pair / "target"), pair / "good")
    assert report.passed and report.problems == {} and report.gamma == GAMMA
    code, out, _ = run_cli(["--target", str(pair / "target"), "--draft", str(pair / "good"),
                            "--json", str(tmp_path / "check.json")], capsys)
    assert code == 0
    assert [line.split()[1] for line in out.splitlines()[:len(CHECKS)]] == list(CHECKS)
    assert all(line.startswith("ok ") for line in out.splitlines()[:len(CHECKS)])
    assert "assistant_model=draft" in out
    assert f'"method": "draft_model", "model": "{pair / "good"}", "num_speculative_tokens": {GAMMA}' in out
    assert "--speculative-algorithm STANDALONE" in out and f"--speculative-num-steps {GAMMA}" in out
    assert json.loads((tmp_path / "check.json").read_text())["passed"] is True


@pytest.mark.parametrize("check, breaker", BROKEN, ids=[b.__name__ for _, b in BROKEN])
def test_each_check_fails_on_a_draft_crafted_to_break_it(pair, tmp_path, capsys, check, breaker):
    draft = tmp_path / "draft"
    shutil.copytree(pair / "good", draft)
    breaker(draft, pair)
    report = check_deploy(str(pair / "target"), draft)
    assert list(report.problems) == [check], report.problems
    code, out, _ = run_cli(["--target", str(pair / "target"), "--draft", str(draft)], capsys)
    assert code == 1
    fails = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and fails[0].startswith(f"FAIL {check}: ") and "\n" not in fails[0]


@pytest.mark.parametrize("remove", ["file", "key"])
def test_a_draft_naming_no_gamma_is_a_warning_and_the_commands_claim_none(pair, tmp_path, capsys, remove):
    """Any hub draft (e.g. Qwen2.5-0.5B-Instruct) has no num_assistant_tokens: a warning with the fix, exit 0."""
    draft = tmp_path / "draft"
    shutil.copytree(pair / "good", draft)
    if remove == "file":
        drop_generation_config(draft, pair)
    else:
        config = json.loads((draft / "generation_config.json").read_text())
        config.pop("num_assistant_tokens")
        (draft / "generation_config.json").write_text(json.dumps(config))
    report = check_deploy(str(pair / "target"), draft)
    assert report.passed and report.gamma is None and list(report.warnings) == ["generation_config"]
    code, out, _ = run_cli(["--target", str(pair / "target"), "--draft", str(draft)], capsys)
    assert code == 0
    [warn] = [line for line in out.splitlines() if line.startswith("WARN")]
    assert warn.startswith("WARN generation_config: ") and "num_assistant_tokens" in warn and "specdistill-eval" in warn
    assert "GAMMA=4  # the draft names no gamma" in out and "num_speculative_tokens\\\": $GAMMA}" in out
    assert f"num_speculative_tokens\": {GAMMA}" not in out and "--speculative-num-steps $GAMMA" in out


def test_serve_without_a_vllm_interpreter_is_one_line(pair, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPECDISTILL_VLLM_PYTHON", raising=False)
    code, _, err = run_cli(["--target", str(pair / "target"), "--draft", str(pair / "good"), "--serve"], capsys)
    assert code == 1 and "make serving" in err and len(err.strip().splitlines()) == 1


def test_unreadable_inputs_are_one_line_errors(pair, tmp_path, capsys):
    code, out, err = run_cli(["--target", str(pair / "target"), "--draft", str(tmp_path / "nope")], capsys)
    assert code == 1 and "is not a model folder with a config.json" in err and "Traceback" not in err
    code, _, err = run_cli(["--target", str(tmp_path / "no-target"), "--draft", str(pair / "good")], capsys)
    assert code == 1 and err.startswith("specdistill-check: error: could not read the target") and len(
        err.strip().splitlines()) == 1


def test_serving_commands_with_a_gamma_variable_expand_to_the_commands_with_that_gamma():
    """decode.deploy.serving_commands: the $GAMMA form (a draft that names no gamma), expanded by the shell with
    GAMMA=3, is exactly the command written for gamma 3."""
    import shlex
    import subprocess

    from decode.deploy.serving_commands import sglang_launch, vllm_serve, vllm_speculative_config

    for method, algorithm in (("draft_model", "STANDALONE"), ("eagle3", "EAGLE3")):
        fixed = [vllm_serve("org/target", vllm_speculative_config(method, "out/d", 3)),
                 sglang_launch("org/target", "out/d", algorithm, 3)]
        variable = [vllm_serve("org/target", vllm_speculative_config(method, "out/d", "$GAMMA"), expand=True),
                    sglang_launch("org/target", "out/d", algorithm, "$GAMMA")]
        for want, command in zip(fixed, variable):
            # the words the shell passes to the program, with GAMMA=3 and without a variable
            words = subprocess.run(["bash", "-c", f"GAMMA=3; for w in {command.replace(chr(92) + chr(10), ' ')}; "
                                                  "do printf '%s\\n' \"$w\"; done"],
                                   capture_output=True, text=True, check=True).stdout.splitlines()
            assert words == shlex.split(want.replace("\\\n", " "))


@pytest.mark.parametrize("gamma", [GAMMA, None])
def test_the_serving_commands_run_as_printed_from_any_folder_name(gamma, pair, tmp_path):
    """Folders with a space, a quote and a $ in their names: each printed command, run by bash as printed, hands
    the paths to vLLM, SGLang and transformers unchanged (and $GAMMA, when the draft names no gamma, expands)."""
    target, draft = tmp_path / "my models" / "target", tmp_path / "my models" / "bob's $draft"
    shutil.copytree(pair / "target", target)
    shutil.copytree(pair / "good", draft)
    if gamma is None:
        edit_json(draft / "generation_config.json", num_assistant_tokens=None)
    report = check_deploy(str(target), str(draft))
    commands = {args[0] + (" -c" if "-c" in args else ""): args
                for args in as_bash_runs_them(serving_commands(report))}
    vllm = commands["vllm"]
    assert vllm[:3] == ["vllm", "serve", str(target)]
    spec = json.loads(vllm[vllm.index("--speculative-config") + 1])
    assert spec["model"] == str(draft) and spec["num_speculative_tokens"] == (gamma or DEFAULT_GAMMA)
    sglang = commands["python"]
    assert sglang[sglang.index("--model-path") + 1] == str(target)
    assert sglang[sglang.index("--speculative-draft-model-path") + 1] == str(draft)
    script = commands["python -c"][2]
    loaded = [node.args[0].value for node in ast.walk(ast.parse(script))
              if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "from_pretrained"]
    assert loaded == [str(target), str(target), str(draft)]
