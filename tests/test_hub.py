"""distill.publish.model_card, distill.publish.hub and specdistill-push (specdistill/cli/push.py): model card, upload
plan, upload through a fake HfApi, error lines, no token."""
from __future__ import annotations

import fnmatch
import json
import shutil
from pathlib import Path

import httpx2
import pytest
import yaml
from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

import distill.publish.hub as hub
from distill.publish.hub import HubError, upload_plan
from distill.publish.model_card import load_eval_results
from specdistill.cli.push import main
from specdistill.drafts import build_model_card, push_to_hub, write_card
from tests.helpers import as_bash_runs_them
from tests.tiny import tiny_model

SECRET = "hf_secretvalue"
TARGET = "Qwen/Qwen2.5-0.5B"
RECIPE = f"# python scripts/train.py recipes/x.yaml\nmodel:\n  target: {TARGET}\n  draft_layers: [0, 1]\n"
RESULTS = [  # numbers chosen so every one is distinctive in the card
    {"gamma": 1, "temperature": 0.0, "acceptance_rate": 0.8123, "draft_acceptance_rate": 0.7011,
     "mean_accepted_tokens": 1.7011, "per_position_acceptance": [0.7011], "speedup": 1.3456,
     "predicted_speedup": 1.4012},
    {"gamma": 4, "temperature": 0.0, "acceptance_rate": 0.7765, "draft_acceptance_rate": 0.5502,
     "mean_accepted_tokens": 3.2109, "per_position_acceptance": [0.8, 0.7, 0.6, 0.5], "speedup": 2.0789,
     "predicted_speedup": 2.2222},
]
SHIPPED = {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
           "recipe.yaml", "acceptance.jsonl", "README.md"}


def log_rows(step: int, base: float) -> list[dict]:
    return [{"step": step, "checkpoint": f"checkpoint-{step}", **r, "acceptance_rate": base + r["gamma"] / 1000}
            for r in RESULTS]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A training OUTPUT_DIR: exported tiny draft, tokenizer files, recipe, log, plus trainer leftovers."""
    out = tmp_path_factory.mktemp("out")
    tiny_model("llama").save_pretrained(out)
    (out / "tokenizer.json").write_text("{}")
    (out / "tokenizer_config.json").write_text("{}")
    (out / "recipe.yaml").write_text(RECIPE)
    rows = log_rows(10, 0.5) + log_rows(20, 0.6)
    (out / "acceptance.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "checkpoints" / "checkpoint-10").mkdir(parents=True)
    (out / "checkpoints" / "checkpoint-10" / "optimizer.pt").write_bytes(b"x" * 10)
    (out / "runs").mkdir()
    (out / "optimizer.pt").write_bytes(b"x")
    (out / "training_args.bin").write_bytes(b"x")
    return out


@pytest.fixture
def run_dir(model_dir, tmp_path) -> Path:
    """A copy of the OUTPUT_DIR for the tests that write the card into it."""
    return Path(shutil.copytree(model_dir, tmp_path / "run"))


@pytest.fixture
def eval_json(tmp_path) -> Path:
    path = tmp_path / "eval_kl.json"
    path.write_text(json.dumps({"device": "cuda (NVIDIA H100 80GB HBM3)", "dtype": "bfloat16",
                                "torch_version": "2.13.0", "target": TARGET, "draft": "out/draft",
                                "results": RESULTS}))
    return path


class FakeApi:
    """Records the calls push_to_hub makes; optionally raises ``error`` from ``fail_on``."""

    def __init__(self, error: BaseException | None = None, fail_on: str = "create_repo"):
        self.calls: list[tuple[str, dict]] = []
        self.error, self.fail_on = error, fail_on

    def _maybe_fail(self, name: str) -> None:
        if self.error is not None and name == self.fail_on:
            raise self.error

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))
        self._maybe_fail("create_repo")

    def upload_folder(self, **kwargs):
        """As HfApi: the files under folder_path that match one of allow_patterns (fnmatch) are uploaded."""
        root = Path(kwargs["folder_path"])
        files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
                       and any(fnmatch.fnmatch(str(p.relative_to(root)), pattern)
                               for pattern in kwargs["allow_patterns"]))
        self.calls.append(("upload_folder", {**kwargs, "files": files}))
        self._maybe_fail("upload_folder")


def table_rows(card: str) -> list[list[str]]:
    """The cells of every markdown table row in ``card`` (header and rule lines included)."""
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in card.splitlines()
            if line.startswith("|")]


def front_matter(card: str) -> dict:
    lines = card.splitlines()
    assert lines[0] == "---"
    end = lines.index("---", 1)
    return yaml.safe_load("\n".join(lines[1:end]))


# ---- model card ----

def test_card_from_eval_json_has_measured_numbers_usage_and_metadata(model_dir, eval_json):
    results, hardware = load_eval_results(model_dir, eval_json)
    card = build_model_card(model_dir, target=TARGET, recipe_text=RECIPE, eval_results=results,
                            hardware=hardware, repo_id="me/qwen-draft")
    meta = front_matter(card)
    index = meta.pop("model-index")
    assert meta == {"library_name": "transformers", "tags": ["speculative-decoding", "draft-model", "specdistill"],
                    "base_model": TARGET, "pipeline_tag": "text-generation"}
    # model-index: every measured number of the table, as huggingface_hub's EvalResult writes it
    assert index[0]["name"] == "qwen-draft"
    metrics = {(m["config"], m["type"]): m["value"] for r in index[0]["results"] for m in r["metrics"]}
    assert metrics[("gamma=4, temperature=0", "speedup")] == 2.0789
    assert metrics[("gamma=1, temperature=0", "acceptance_rate")] == 0.8123
    assert len(metrics) == 8  # 2 gammas x acceptance_rate, mean_accepted_tokens, speedup, predicted_speedup
    assert hardware == "cuda (NVIDIA H100 80GB HBM3), bfloat16, torch 2.13.0"
    assert hardware in card
    rows = table_rows(card)
    assert rows[0] == ["gamma", "temperature", "acceptance_rate", "mean_accepted_tokens", "speedup",
                       "predicted_speedup"]
    assert ["1", "0", "0.812", "1.70", "1.35x", "1.40x"] in rows
    assert ["4", "0", "0.776", "3.21", "2.08x", "2.22x"] in rows
    assert f"`{TARGET}`" in card and "draft_layers: [0, 1]" in card
    # usage: the best measured gamma (4) goes into the snippets
    assert "target.generate(**inputs, assistant_model=draft" in card
    assert 'from_pretrained("me/qwen-draft"' in card
    assert 'speculative_config={"method": "draft_model", "model": "me/qwen-draft", "num_speculative_tokens": 4}' in card
    spec = '{"method": "draft_model", "model": "me/qwen-draft", "num_speculative_tokens": 4}'
    assert f"vllm serve {TARGET} --speculative-config '{spec}'" in card
    n_params = sum(p.numel() for p in tiny_model("llama").parameters())
    assert f"llama, 2 layers, hidden size 32, {n_params / 1e3:.1f}K parameters" in card


def test_card_shows_categories_and_the_deployment_check(model_dir, tmp_path):
    model_dir = Path(shutil.copytree(model_dir, tmp_path / "out"))  # the fixture is shared: write a copy
    by_category = {"gsm8k": {"num_prompts": 5, "acceptance_rate": 0.9, "mean_accepted_tokens": 4.1, "speedup": 2.5},
                   "mt_bench": {"num_prompts": 8, "acceptance_rate": 0.6, "mean_accepted_tokens": 2.4, "speedup": 1.5}}
    results = [{**RESULTS[0], "by_category": by_category}]
    card = build_model_card(model_dir, target=TARGET, recipe_text=None, eval_results=results, hardware="h",
                            repo_id="me/d")
    assert "## Acceptance by prompt category" in card
    assert ["1", "0", "gsm8k", "5", "0.900", "4.10", "2.50x"] in table_rows(card)
    assert ["1", "0", "mt_bench", "8", "0.600", "2.40", "1.50x"] in table_rows(card)
    assert "Deployment check" in card and "Not recorded with this model" in card
    (model_dir / "train_results.json").write_text(json.dumps({"deploy_check": {"passed": True, "problems": {}}}))
    assert "`specdistill-check` passed at export" in build_model_card(
        model_dir, target=TARGET, recipe_text=None, eval_results=RESULTS, hardware="h", repo_id="me/d")
    failed = {"passed": False, "problems": {"dtype": "draft weights are stored in float32 but ..."}}
    (model_dir / "train_results.json").write_text(json.dumps({"deploy_check": failed}))
    card = build_model_card(model_dir, target=TARGET, recipe_text=None, eval_results=RESULTS, hardware="h",
                            repo_id="me/d")
    assert "found problems at export" in card and "- **dtype**: draft weights are stored in float32" in card
    assert "by prompt category" not in card  # no categories measured


def test_card_without_measurements_says_so_and_local_target_is_not_base_model(model_dir, tmp_path):
    card = build_model_card(model_dir, target=str(tmp_path), recipe_text=None, eval_results=[], hardware="",
                            repo_id="me/d")
    assert "base_model" not in front_matter(card) and "model-index" not in front_matter(card)
    assert "No measurements are available" in card
    assert "No recipe.yaml" in card
    assert "x |" not in card  # no speedup cell anywhere


def test_load_eval_results_from_acceptance_log_takes_last_step_or_the_one_asked(model_dir, tmp_path):
    results, hardware = load_eval_results(model_dir)
    assert {r["step"] for r in results} == {20} and len(results) == 2
    assert results[0]["acceptance_rate"] == pytest.approx(0.601)
    assert "not recorded" in hardware
    assert {r["step"] for r in load_eval_results(model_dir, step=10)[0]} == {10}
    with pytest.raises(ValueError, match="no rows for step 99; steps logged: 10, 20"):
        load_eval_results(model_dir, step=99)
    assert load_eval_results(tmp_path) == ([], "")


def test_acceptance_log_rows_follow_the_exported_checkpoint(model_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "acceptance.jsonl").write_text((model_dir / "acceptance.jsonl").read_text())
    (out / "train_results.json").write_text(json.dumps({"train_loss": 1.0, "best": {"checkpoint": "checkpoint-10",
                                                                                     "step": 10, "gamma": 4}}))
    assert {r["step"] for r in load_eval_results(out)[0]} == {10}
    assert {r["step"] for r in load_eval_results(out, step=20)[0]} == {20}  # an explicit step wins


def test_card_from_training_log_names_the_step(model_dir):
    results, hardware = load_eval_results(model_dir)
    card = build_model_card(model_dir, target=TARGET, recipe_text=RECIPE, eval_results=results, hardware=hardware,
                            repo_id="me/d")
    assert "at step 20" in card and ["4", "0", "0.604", "3.21", "2.08x", "2.22x"] in table_rows(card)


def test_card_names_a_local_target_relative_to_the_model_folder(run_dir, tmp_path):
    (tmp_path / "target").mkdir()
    card = build_model_card(run_dir, target=str(tmp_path / "target"), recipe_text=None, eval_results=RESULTS,
                            hardware="h", repo_id="me/d", prompts=str(run_dir / "prompts.jsonl"))
    assert "- **Target model:** `../target`" in card and 'from_pretrained("../target"' in card
    assert str(tmp_path) not in card
    assert front_matter(card)["model-index"][0]["results"][0]["dataset"]["name"] == "prompts.jsonl"


# ---- what is uploaded ----

def test_upload_plan_names_exactly_the_model_files(run_dir, eval_json):
    card = write_card(run_dir, repo_id="me/d", eval_json=eval_json)
    plan = upload_plan(run_dir, eval_json)
    assert plan.folder == run_dir and plan.files == sorted(SHIPPED | {"eval_kl.json"})
    assert card == run_dir / "README.md" and front_matter(card.read_text())["base_model"] == TARGET
    assert (run_dir / "eval_kl.json").read_bytes() == eval_json.read_bytes()  # the measurement goes with the model
    write_card(run_dir, repo_id="me/d")  # our own card is rewritten
    (run_dir / "README.md").write_text("# notes the user wrote\n")
    with pytest.raises(FileExistsError, match="README.md exists and was not written by specdistill"):
        write_card(run_dir, repo_id="me/d")
    assert (run_dir / "README.md").read_text() == "# notes the user wrote\n"


def test_dry_run_writes_the_card_and_uploads_nothing(run_dir):
    api = FakeApi()
    plan = push_to_hub(run_dir, repo_id="me/d", dry_run=True, api=api)
    assert plan.folder == run_dir and set(plan.files) == SHIPPED
    assert api.calls == []
    assert f"base_model: {TARGET}" in (run_dir / "README.md").read_text()  # target found in recipe.yaml


def test_upload_calls_create_repo_then_upload_folder(run_dir, eval_json):
    api = FakeApi()
    plan = push_to_hub(run_dir, repo_id="me/qwen-draft", private=True, eval_json=eval_json, api=api)
    assert [name for name, _ in api.calls] == ["create_repo", "upload_folder"]
    create, upload = api.calls[0][1], api.calls[1][1]
    assert create == {"repo_id": "me/qwen-draft", "private": True, "exist_ok": True, "repo_type": "model"}
    assert upload["repo_id"] == "me/qwen-draft" and upload["repo_type"] == "model"
    assert Path(upload["folder_path"]) == run_dir and upload["allow_patterns"] == plan.files
    assert set(upload["files"]) == SHIPPED | {"eval_kl.json"}  # no checkpoints/, runs/ or trainer state


def test_network_failure_raises_hub_error_without_chained_traceback(run_dir, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    api = FakeApi(httpx2.ConnectError(f"connect failed with token {SECRET}"), fail_on="upload_folder")
    with pytest.raises(HubError) as info:
        push_to_hub(run_dir, repo_id="me/d", api=api)
    assert str(info.value).startswith("could not reach the Hugging Face Hub to upload to me/d: no network connection")
    assert info.value.__cause__ is None and info.value.__suppress_context__  # the original (with token) is dropped
    assert [name for name, _ in api.calls] == ["create_repo", "upload_folder"]


@pytest.mark.parametrize("repo_id", ["noslash", "a/b/c", "/name", "me/bad name", "me/a--b"])
def test_bad_repo_id_is_a_clear_error(model_dir, repo_id):
    with pytest.raises(ValueError, match="repo id"):
        push_to_hub(model_dir, repo_id=repo_id, dry_run=True, api=FakeApi())


def test_missing_folder_or_weights_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        push_to_hub(tmp_path / "nope", repo_id="me/d", dry_run=True)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors weights"):
        push_to_hub(tmp_path, repo_id="me/d", dry_run=True)
    checkpoint = tmp_path / "run" / "checkpoint-4"  # a training checkpoint: weights, no config; nothing written
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text("{}")
    (checkpoint / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=f"{checkpoint} is a training checkpoint, not an exported model: "
                                                f"{tmp_path / 'run'} holds the run's export"):
        push_to_hub(checkpoint, repo_id="me/d", dry_run=True)
    assert not (checkpoint / "README.md").exists()


# ---- CLI: one-line errors, never the token ----

def http_error(status: int, server_message: str) -> HfHubHTTPError:
    response = httpx2.Response(status, request=httpx2.Request("POST", "https://huggingface.co/api/repos/create"))
    return HfHubHTTPError(f"{status} error (token {SECRET})", response=response, server_message=server_message)


NETWORK_ERRORS = [  # what huggingface_hub's client (httpx2) and the OS raise without a network
    httpx2.ConnectError("[Errno -2] Name or service not known"),
    httpx2.ReadTimeout("The read operation timed out"),
    OSError(101, "Network is unreachable"),
    TimeoutError("timed out"),
]


def run_cli(monkeypatch, capsys, api, argv):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setattr(hub, "HfApi", lambda: api)
    code = main(argv)
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    return code, out, err


@pytest.mark.parametrize("error", NETWORK_ERRORS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("fail_on", ["create_repo", "upload_folder"])
def test_cli_without_network_prints_one_line_and_exits_1(run_dir, monkeypatch, capsys, error, fail_on):
    code, out, err = run_cli(monkeypatch, capsys, FakeApi(error, fail_on), [str(run_dir), "--repo-id", "me/d"])
    assert code == 1 and out == ""
    action = "create" if fail_on == "create_repo" else "upload to"
    assert err == (f"error: could not reach the Hugging Face Hub to {action} me/d: no network connection "
                   "(set HF_HUB_OFFLINE=0 and check your connection or proxy)\n")


@pytest.mark.parametrize("error, expected", [
    (http_error(401, f"Invalid credentials {SECRET}"), "the Hub rejected the token (HTTP 401)"),
    (http_error(403, "forbidden"), "may not write to 'me' (HTTP 403)"),
    (http_error(500, f"internal error near hf_abcdefghij and {SECRET}"), "the Hub answered HTTP 500: internal error"),
    (OfflineModeIsEnabled("offline"), "HF_HUB_OFFLINE=1 is set"),
    (PermissionError(13, "Permission denied", "/x/model.safetensors"), "Permission denied: /x/model.safetensors"),
])
def test_cli_hub_refusals_are_one_clear_line_without_token(run_dir, monkeypatch, capsys, error, expected):
    code, out, err = run_cli(monkeypatch, capsys, FakeApi(error), [str(run_dir), "--repo-id", "me/d"])
    assert code == 1 and err.startswith("error: could not create me/d: ") and expected in err
    assert err.count("\n") == 1 and "hf_abcdefghij" not in err


def test_cli_real_hfapi_in_offline_mode_fails_cleanly(run_dir, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    code = main([str(run_dir), "--repo-id", "me/d"])
    out, err = capsys.readouterr()
    assert code == 1 and SECRET not in out + err
    assert err.startswith("error: could not create me/d: HF_HUB_OFFLINE=1 is set") and err.count("\n") == 1


@pytest.mark.parametrize("argv_tail, expected", [
    (["--repo-id", "noslash"], "error: repo id 'noslash' must look like 'user/name'"),
    (["--repo-id", "me/d", "--eval-json", "missing.json"], "error: eval JSON missing.json does not exist"),
])
def test_cli_input_errors_are_one_line(model_dir, monkeypatch, capsys, argv_tail, expected):
    code, out, err = run_cli(monkeypatch, capsys, FakeApi(), [str(model_dir), *argv_tail])
    assert code == 1 and err.startswith(expected) and err.count("\n") == 1


def test_cli_missing_folder(tmp_path, monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, FakeApi(), [str(tmp_path / "nope"), "--repo-id", "me/d"])
    assert code == 1 and err == f"error: model folder {tmp_path / 'nope'} does not exist\n"


def test_cli_dry_run_prints_folder_and_files(run_dir, monkeypatch, capsys):
    api = FakeApi()
    code, out, err = run_cli(monkeypatch, capsys, api, [str(run_dir), "--repo-id", "me/d", "--dry-run"])
    assert code == 0 and err == "" and api.calls == []
    assert out.splitlines()[0] == f"dry run: would upload {run_dir} (nothing uploaded); files:"
    listed = {line.split()[0]: int(line.split()[1]) for line in out.splitlines()[1:]}
    assert set(listed) == SHIPPED
    assert all(size == (run_dir / name).stat().st_size for name, size in listed.items())


def test_cli_staging_dir_is_still_accepted(run_dir, tmp_path, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, FakeApi(), [str(run_dir), "--repo-id", "me/d", "--dry-run",
                                                              "--staging-dir", str(tmp_path / "s")])
    assert code == 0 and err == "" and out.startswith("note: --staging-dir is no longer used")
    assert not (tmp_path / "s").exists()


def test_cli_upload_success(run_dir, monkeypatch, capsys):
    api = FakeApi()
    code, out, err = run_cli(monkeypatch, capsys, api, [str(run_dir), "--repo-id", "me/d", "--private"])
    assert code == 0 and err == "" and "https://huggingface.co/me/d" in out
    assert api.calls[0][1]["private"] is True and api.calls[1][0] == "upload_folder"


@pytest.mark.parametrize("kind", ["eagle3", "dflash", "parallel"])
def test_the_cards_specdistill_eval_line_runs_as_typed(kind):
    """The card's own measurement command, as bash hands it to specdistill-eval (PROMPTS filled in), is one that
    specdistill-eval's parser takes: --prompts included, a target folder with a space kept whole."""
    from kinds.dflash.card import dflash_usage_section
    from kinds.eagle3.card import head_usage_section
    from kinds.parallel_drafting import usage_section
    from specdistill.cli import eval as eval_cli

    target = "my models/target"
    section = {"eagle3": lambda: head_usage_section(target, "me/head", 3),
               "dflash": lambda: dflash_usage_section(target, "me/dflash", 3),
               "parallel": lambda: usage_section("pard", "one draft forward", target, "me/pard", 3)}[kind]()
    [line] = [line for line in section.splitlines() if line.startswith("specdistill-eval ")]
    [argv] = as_bash_runs_them(line.replace(" PROMPTS ", " prompts.jsonl "))
    args = eval_cli.parse_args(argv[1:])
    assert (args.target, args.prompts, args.gamma) == (target, "prompts.jsonl", [3])
