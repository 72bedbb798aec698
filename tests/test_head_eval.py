"""Measuring an EAGLE-3 head: evaluate_acceptance with a head, and `specdistill-eval --draft HEAD_DIR`."""
import json

import pytest
import torch
from test_eval_cli import pair, run_cli  # noqa: F401 - the tiny saved pair (a module fixture) and the CLI runner
from test_head_decode import new_head, train_head
from transformers import AutoModelForCausalLM

from decode.measure.settings import EvalSettings
from kinds.eagle3.model import Eagle3Head, head_config
from specdistill.drafts import evaluate_acceptance

from tiny import tiny_model


@pytest.fixture(scope="module")
def head_dir(pair):
    """A briefly trained head for the pair's target, exported with the target's tokenizer and a served gamma."""
    target = AutoModelForCausalLM.from_pretrained(pair / "target").eval()
    head = train_head(target, new_head(target), steps=30)
    head.save_pretrained(pair / "head")
    (pair / "head" / "generation_config.json").write_text(json.dumps(
        {"num_assistant_tokens": 3, "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (pair / "head" / name).write_bytes((pair / "target" / name).read_bytes())
    return pair / "head"


def test_evaluate_acceptance_with_a_head_by_category():
    target = tiny_model("llama", seed=0, layers=4)
    head = train_head(target, new_head(target), steps=30)
    prompts = [torch.tensor([1, 5, 7, 9]), torch.tensor([1, 40, 41, 42, 43]), torch.tensor([1, 9])]
    settings = EvalSettings(gammas=[2, "auto"], max_new_tokens=12)
    results = evaluate_acceptance(target, head, prompts, settings, progress=False,
                                  categories=["a", "a", None])
    for r in results:
        assert r["greedy_match"] == 1.0 and r["num_prompts"] == 3 and r["new_tokens"] == 36
        assert r["draft_cost_ratio"] > 0 and r["predicted_speedup"] > 0
        assert sorted(r["by_category"]) == ["a", "uncategorized"]
    assert results[0]["stats"]["accepted_tokens"] > 0
    with pytest.raises(ValueError, match="compare-hf"):
        evaluate_acceptance(target, head, prompts, EvalSettings(gammas=[2], compare_hf=True), progress=False)


def test_cli_recognises_a_head_folder(pair, head_dir, tmp_path, capsys):
    out = tmp_path / "eval.json"
    code, stdout, err = run_cli(["--target", str(pair / "target"), "--draft", str(head_dir), "--prompts",
                                 str(pair / "prompts.jsonl"), "--gamma", "2", "auto", "--max-new-tokens", "10",
                                 "--output", str(out), "--quiet"], capsys)
    assert code == 0, err
    report = json.loads(out.read_text())
    assert report["draft_kind"] == "eagle3"
    assert [r["greedy_match"] for r in report["results"]] == [1.0, 1.0]
    for draft, kind in ((str(pair / "draft"), "standalone"), ("prompt-lookup", "prompt_lookup")):
        run_cli(["--target", str(pair / "target"), "--draft", draft, "--prompts", str(pair / "prompts.txt"),
                 "--max-new-tokens", "4", "--output", str(out), "--quiet"], capsys)
        assert json.loads(out.read_text())["draft_kind"] == kind


def test_cli_refuses_a_head_of_another_target_in_one_line(pair, tmp_path, capsys):
    other = tiny_model("llama", seed=0, hidden=64, layers=4, vocab_size=320)
    Eagle3Head(head_config(other.config)).save_pretrained(tmp_path / "other-head")
    code, _, err = run_cli(["--target", str(pair / "target"), "--draft", str(tmp_path / "other-head"), "--prompts",
                            str(pair / "prompts.txt"), "--quiet"], capsys)
    assert code == 1 and "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "does not fit" in lines[0] and "hidden_size" in lines[0], err


def test_a_mistyped_relative_target_is_one_line_naming_where_it_was_looked_for(pair, head_dir, monkeypatch, capsys):
    """A relative --target that is not a folder reads as a hub id (owner/name); offline it is found in neither
    place. With a head (whose fit is checked on the target's config first), a standalone draft or prompt lookup:
    one error line that says no such local folder and offers the parent's folder of the closest name, no traceback;
    a name close to none lists the parent's folders."""
    monkeypatch.chdir(pair.parent)
    typo = f"{pair.name}/targt"
    for draft in (str(head_dir), str(pair / "draft"), "prompt-lookup"):
        code, _, err = run_cli(["--target", typo, "--draft", draft, "--prompts", str(pair / "prompts.txt"),
                                "--max-new-tokens", "4", "--quiet"], capsys)
        lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
        assert code == 1 and "Traceback" not in err and len(lines) == 1, err
        assert f"'{typo}': no such local folder (did you mean {pair.name}/target?), and not found on the Hub (" \
            in lines[0], err
    code, _, err = run_cli(["--target", f"{pair.name}/zzzzzz", "--draft", "prompt-lookup", "--prompts",
                            str(pair / "prompts.txt"), "--quiet"], capsys)
    assert code == 1 and f"no such local folder ({pair.name}/ holds " in err and "target" in err, err


def test_a_drafts_folder_given_as_the_target_is_one_line_in_every_command(pair, head_dir, tmp_path, monkeypatch,
                                                                          capsys):
    """A head's folder (its config.json names LlamaForCausalLMEagle3, no transformers class) given where the target
    goes: eval, check, data and train each refuse it in one line naming the flag or key and the class, before any
    weight loads (before, eval and data loaded it as a Llama with half its weights missing, and check passed it)."""
    from decode.inputs.checks import FileProblem, check_language_model_folder
    from specdistill.cli import check, data

    from helpers import cli_error

    expected = f"{head_dir} is not a model to draft for: its config.json's architectures LlamaForCausalLMEagle3 is " \
               "no transformers class"
    code, _, err = run_cli(["--target", str(head_dir), "--draft", "prompt-lookup", "--prompts",
                            str(pair / "prompts.txt"), "--quiet"], capsys)
    assert code == 1 and f"error: --target: {expected}" in err and "Traceback" not in err, err
    for command, argv in ((check.cli, ["--target", str(head_dir), "--draft", str(head_dir)]),
                          (data.cli, ["prompts", "--target", str(head_dir), "--num", "2", "--out",
                                      str(tmp_path / "rows")])):
        with pytest.raises(SystemExit) as exit_info:
            command(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 1 and f"error: --target: {expected}" in err and "Traceback" not in err, err
    line = cli_error(monkeypatch, capsys, "recipes/tiny_eagle3.yaml", f"model.target={head_dir}",
                     f"data.dataset={pair / 'prompts.txt'}", f"train.output_dir={tmp_path / 'out'}")
    assert f"model.target: {expected}" in line
    # a language model passes, and so does a folder that brings its own code (auto_map)
    check_language_model_folder(pair / "target", "--target")
    own = tmp_path / "own_code"
    own.mkdir()
    (own / "config.json").write_text(json.dumps({"architectures": ["MyModel"], "auto_map": {"AutoModel": "m.M"}}))
    check_language_model_folder(own, "--target")
    (own / "config.json").write_text(json.dumps({"architectures": ["MyModel"]}))
    with pytest.raises(FileProblem, match="MyModel is no transformers class"):
        check_language_model_folder(own, "--target")
