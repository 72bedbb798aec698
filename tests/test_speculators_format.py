"""The speculators format in and out (decode.deploy.speculators), against the speculators package and vLLM in the
vLLM interpreter (integration; skipped without it: `make serving` installs both).

In: an EAGLE-3 head written by speculators' own classes (tests/speculators_fixture.py: its layers.0.* names, its own
embedding, norm_before_residual true) is recognised by `specdistill eval`, decoded losslessly, passes `specdistill
check`, and `--engine both` counts the same accepted tokens as vLLM step by step. Out: our export's config.json loads
with speculators' SpeculatorModelConfig, and vLLM given the export alone (`LLM(model=EXPORT)`, what `vllm serve EXPORT`
builds) serves the target with the head drafting the export's gamma, its greedy output the target's and its
spec-decode counters (tau, acceptance per position) those of our decoder on the export.
"""
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from decode.deploy.speculators import proposed_tokens, speculators_type, verifier_of
from decode.inputs.command_line import PARITY_TOLERANCE
from decode.inputs.loading import LoadError
from decode.serving.counters import SpecCounters
from decode.serving.vllm_engine import ServingError, find_vllm_python
from decode.serving.vllm_worker import IN_PROCESS_ENV
from kinds import kind_named, kind_of_source
from kinds.eagle3.model import Eagle3Head, head_config, read_config
from specdistill.cli import check as check_cli
from specdistill.cli import eval as eval_acceptance

from tiny import TINY_TEXT, save_and_load, tiny_model, tiny_tokenizer

pytestmark = pytest.mark.integration
HERE = Path(__file__).resolve().parent
GAMMA, MAX_NEW_TOKENS = 3, 24


def vllm_python():
    try:
        python = find_vllm_python()
    except ServingError as err:
        return pytest.skip(f"no vLLM interpreter ({err})", allow_module_level=True)
    found = subprocess.run([str(python), "-c", "import speculators"], capture_output=True)
    if found.returncode:
        pytest.skip("speculators is not installed in the vLLM interpreter (`make serving`)", allow_module_level=True)
    return python


PYTHON = vllm_python()


@pytest.fixture(autouse=True)
def engines_in_process(monkeypatch):
    monkeypatch.setenv(IN_PROCESS_ENV, "1")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny Llama target of 4 layers (head_dim 32: vLLM's CPU attention has no smaller kernel), its prompts, and an
    EAGLE-3 head trained on it (test_head_decode.train_head) in the two ways a speculators head may differ from ours:
    norm_before_residual and an embedding of its own (the target's with noise as large as its weights: read with the
    target's instead, the head drafts other tokens). Its draft vocabulary: the 128 tokens the target predicts most."""
    from test_head_decode import train_head

    root = tmp_path_factory.mktemp("speculators-pair")
    tok = tiny_tokenizer()
    target = save_and_load(tiny_model("llama", seed=0, vocab_size=len(tok), hidden=128, layers=4), root / "target", tok)
    lines = [line for line in TINY_TEXT.splitlines() if line.strip()][:4]
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in lines))
    with torch.no_grad():
        x = torch.randint(3, len(tok), (64, 24), generator=torch.Generator().manual_seed(5))
        counts = torch.bincount(target(x).logits.argmax(-1).flatten(), minlength=len(tok))
        weight = target.get_input_embeddings().weight
        own = weight + torch.randn(weight.shape, generator=torch.Generator().manual_seed(1)) * weight.std()
    torch.manual_seed(0)
    head = Eagle3Head(head_config(target.config, aux_layers=[0, 1, 3], draft_vocab_size=128))
    head.set_vocab(counts.argsort(descending=True)[:128].sort().values)
    head.config.norm_before_residual = True
    head.bind_embeddings(torch.nn.Embedding.from_pretrained(own.contiguous()))
    train_head(target, head, steps=300)
    return {"root": root, "target": target, "tokenizer": tok, "head": head, "embedding": own.contiguous()}


def speculators_written(pair, name: str) -> Path:
    """The pair's head written by speculators (tests/speculators_fixture.py) with its own embedding."""
    root, head = pair["root"], pair["head"]
    save_file({**head.state_for_export(), "embed_tokens.weight": pair["embedding"]}, str(root / f"{name}.safetensors"))
    config = head.config
    layer = {key: getattr(config, key) for key in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                    "num_key_value_heads", "head_dim", "rms_norm_eps",
                                                    "max_position_embeddings", "vocab_size")}
    settings = {"layer": layer, "draft_vocab_size": config.draft_vocab_size, "gamma": GAMMA,
                "aux_layers": head.aux_layers, "norm_before_residual": True}
    (root / f"{name}.json").write_text(json.dumps(settings))
    out = root / name
    subprocess.run([str(PYTHON), str(HERE / "speculators_fixture.py"), str(root / "target"),
                    str(root / f"{name}.safetensors"), str(root / f"{name}.json"), str(out)], check=True)
    pair["tokenizer"].save_pretrained(out)
    return out


def run_both(pair, draft: Path) -> dict:
    root = pair["root"]
    return eval_acceptance.main(["--target", str(root / "target"), "--draft", str(draft), "--prompts",
                                 str(root / "prompts.jsonl"), "--gamma", str(GAMMA), "--max-new-tokens",
                                 str(MAX_NEW_TOKENS), "--engine", "both", "--vllm-python", str(PYTHON), "--quiet"])


def test_a_head_speculators_wrote_is_read_as_vllm_reads_it(pair):
    folder = speculators_written(pair, "spec_head")
    config = json.loads((folder / "config.json").read_text())
    assert speculators_type(config) == "eagle3" and "midlayer" not in json.dumps(config)  # speculators' own layout
    assert kind_of_source(str(folder)).name == "eagle3"
    ours = read_config(folder)
    assert ours["norm_before_residual"] is True and ours["draft_vocab_size"] == 128
    assert ours["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 3]
    head = Eagle3Head.from_pretrained(folder, pair["target"].get_input_embeddings())
    assert torch.equal(head.bound_embeddings.weight, pair["embedding"])  # the folder's own embedding, as vLLM reads it
    assert torch.equal(head.fc.weight, pair["head"].fc.weight)  # layers.0.* read as midlayer.*
    assert torch.equal(head.midlayer.self_attn.q_proj.weight, pair["head"].midlayer.self_attn.q_proj.weight)


def test_specdistill_check_passes_a_speculators_head(pair, capsys):
    folder = pair["root"] / "spec_head"
    if not folder.is_dir():
        folder = speculators_written(pair, "spec_head")
    code = check_cli.main(["--target", str(pair["root"] / "target"), "--draft", str(folder)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "vllm serve" in out


def hub_cache(root: Path, repo_id: str, folder: Path) -> Path:
    """The Hub's cache layout (models--OWNER--NAME/refs/main, snapshots/REV/) holding ``folder``'s files, as a
    download of ``repo_id`` leaves it; returns the cache root (for HF_HUB_CACHE)."""
    cache = root / "hub"
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text("0" * 40)
    shutil.copytree(folder, repo / "snapshots" / ("0" * 40), dirs_exist_ok=True)
    return cache


def test_a_published_head_by_hub_id_is_scored_like_its_folder(pair, monkeypatch, capsys):
    """`--draft OWNER/NAME` of a speculators head (the Hub's cache, offline): the same kind, checks and tau as the
    folder; a hub id that is neither cached nor reachable is one line naming it."""
    folder = pair["root"] / "spec_head"
    if not folder.is_dir():
        folder = speculators_written(pair, "spec_head")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache(pair["root"], "RedHatAI/tiny-speculator.eagle3", folder)))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", os.environ["HF_HUB_CACHE"])
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    root = pair["root"]
    args = ["--target", str(root / "target"), "--prompts", str(root / "prompts.jsonl"), "--gamma", str(GAMMA),
            "--max-new-tokens", str(MAX_NEW_TOKENS), "--quiet"]
    by_id = eval_acceptance.main([*args, "--draft", "RedHatAI/tiny-speculator.eagle3"])
    by_folder = eval_acceptance.main([*args, "--draft", str(folder)])
    assert by_id["draft_kind"] == by_folder["draft_kind"] == "eagle3"
    assert by_id["draft"] == "RedHatAI/tiny-speculator.eagle3"
    assert by_id["results"][0]["stats"] == by_folder["results"][0]["stats"]
    capsys.readouterr()
    assert check_cli.main(["--target", str(root / "target"), "--draft", "RedHatAI/tiny-speculator.eagle3"]) == 0
    with pytest.raises(LoadError, match="RedHatAI/missing.*not a local folder, and not found on the Hub"):
        eval_acceptance.main([*args, "--draft", "RedHatAI/missing"])


def test_vllm_and_we_count_the_same_steps_on_a_speculators_head(pair, monkeypatch):
    """norm_before_residual true and the folder's own embedding: a reader that ignored either would draft other
    tokens than vLLM, and the step-by-step counters would differ."""
    folder = pair["root"] / "spec_head"
    if not folder.is_dir():
        folder = speculators_written(pair, "spec_head")
    report = run_both(pair, folder)
    [ours], [vllm], [row] = report["results"], report["vllm_results"], report["parity"]
    assert vllm["greedy_match"] == 1.0 and ours["greedy_match"] == 1.0  # lossless in both engines
    assert report["target_match_vllm"] == 1.0
    assert ours["mean_accepted_tokens"] > 1.2  # drafts accepted, at more than one position
    assert ours["per_position_acceptance"][1] > 0
    assert abs(row["ratio"] - 1) <= PARITY_TOLERANCE, row
    assert SpecCounters.from_spec_stats(ours["stats"]) == SpecCounters.from_dict(vllm["stats"])


def export(pair, name: str, verifier: Path, head: Eagle3Head | None = None) -> Path:
    from distill.publish.export import write_served_folder

    out = pair["root"] / name
    out.mkdir()
    write_served_folder(out, head or pair["head"], pair["tokenizer"], GAMMA, kind_named("eagle3"),
                        verifier=str(verifier))
    return out


LOAD_CONFIG = """
import json, sys
from speculators import SpeculatorModelConfig
config = SpeculatorModelConfig.from_pretrained(sys.argv[1])
print(json.dumps({"class": type(config).__name__, "verifier": config.speculators_config.verifier.name_or_path,
                  "tokens": config.speculators_config.proposal_methods[0].speculative_tokens,
                  "draft_vocab_size": config.draft_vocab_size, "layers": config.eagle_aux_hidden_state_layer_ids,
                  "norm_before_residual": config.norm_before_residual}))
"""


def test_our_export_loads_with_speculators_config_classes(pair):
    folder = export(pair, "export_for_speculators", pair["root"] / "target")
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]  # still vLLM's and SGLang's eagle3 layout
    assert speculators_type(config) == "eagle3" and proposed_tokens(config) == GAMMA
    assert verifier_of(config) == str(pair["root"] / "target")
    loaded = subprocess.run([str(PYTHON), "-c", LOAD_CONFIG, str(folder)], capture_output=True, text=True, check=True)
    seen = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert seen == {"class": "Eagle3SpeculatorConfig", "verifier": str(pair["root"] / "target"), "tokens": GAMMA,
                    "draft_vocab_size": 128, "layers": [0, 1, 3], "norm_before_residual": True}
    assert kind_of_source(str(folder)).name == "eagle3"  # and we read it back as our own


SERVE_ALONE = """
import json, os, sys
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process, as IN_PROCESS_ENV runs it
sys.path.insert(0, sys.argv[3])
from vllm import LLM, SamplingParams, TokensPrompt
from vllm_worker import read_counters
if __name__ == "__main__":
    model, prompts = sys.argv[1], json.loads(sys.argv[2])
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=256, seed=0, disable_log_stats=False,
              distributed_executor_backend="uni")
    spec = llm.llm_engine.vllm_config.speculative_config
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                        SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True), use_tqdm=False)
    print("RESULT " + json.dumps({"method": spec and spec.method, "tokens": spec and spec.num_speculative_tokens,
                      "parallel": bool(spec and getattr(spec, "parallel_drafting", False)),
                      "outputs": [list(o.outputs[0].token_ids) for o in outs],
                      "counters": read_counters(llm.get_metrics())}))
"""


def served_alone(pair, folder: Path) -> tuple[dict, list[list[int]], SpecCounters]:
    """vLLM given ``folder`` alone (what `vllm serve FOLDER` builds, its engine in this one process: ~20 s less a
    start on 2 cores; test_the_serve_commands_check_prints_work_as_typed runs the served layout), greedy, 16 tokens
    of two prompts: what it resolved the speculative config to, its outputs and spec-decode counters; our decoder's
    plain outputs; and our decoder's counters for the same export read back by its kind, at the gamma vLLM drafts,
    counted as vLLM counts (from the prefill token on, every step drafting gamma tokens, also past the end)."""
    from decode import autoregressive_generate, speculative_generate

    tok, target = pair["tokenizer"], pair["target"]
    prompts = [tok(line)["input_ids"] for line in ("def add(a, b):", "class Point:")]
    worker_dir = Path(__file__).resolve().parents[1] / "decode" / "serving"
    served = subprocess.run([str(PYTHON), "-c", SERVE_ALONE, str(folder), json.dumps(prompts), str(worker_dir)],
                            capture_output=True, text=True, timeout=600)
    assert served.returncode == 0, served.stderr[-3000:]
    seen = json.loads(next(line for line in served.stdout.splitlines() if line.startswith("RESULT "))[7:])
    plain = [autoregressive_generate(target, torch.tensor([p]), max_new_tokens=16).new_tokens for p in prompts]
    kind = kind_of_source(str(folder))
    draft = kind.load(str(folder), target, torch.device("cpu"), torch.float32)
    ours = SpecCounters()
    for p, own in zip(prompts, plain):  # from vLLM's prefill token on, as --engine both does (decode.serving.parity)
        out = speculative_generate(target, draft, torch.tensor([p + own[:1]]), max_new_tokens=15, kind=kind,
                                   gamma=seen["tokens"], draft_past_end=True)
        assert out.new_tokens == own[1:]
        ours = ours + SpecCounters.from_spec_stats(out.stats)
    return seen, plain, ours


def test_vllm_serves_our_export_alone(pair):
    """What `vllm serve EXPORT` builds: the engine args resolve the export to its verifier with the head as the
    speculative model, gamma from the export; the greedy output is the target's own (our decoder's plain one)."""
    folder = pair["root"] / "export_for_speculators"
    if not folder.is_dir():
        folder = export(pair, "export_for_speculators", pair["root"] / "target")
    seen, plain, ours = served_alone(pair, folder)
    assert seen["method"] == "eagle3" and seen["tokens"] == GAMMA and not seen["parallel"]
    assert seen["outputs"] == plain
    served = SpecCounters.from_dict(seen["counters"])
    assert served.num_drafts > 0 and served.num_accepted_tokens > 0
    assert served == ours  # tau, acceptance and acceptance per position equal, step by step


def test_vllm_serves_a_two_layer_head_with_our_counters(pair):
    """model.head_layers 2: vLLM's llama_eagle3 builds layer 1 as a Llama decoder layer on H (the residual added
    before its input norm) from our export's layers.1.*; a reader that differed anywhere in the second layer would
    draft other tokens, and the step-by-step counters would differ."""
    from test_head_decode import train_head

    target = pair["target"]
    torch.manual_seed(1)
    head = Eagle3Head(head_config(target.config, aux_layers=[0, 1, 3], draft_vocab_size=128, num_layers=2))
    head.set_vocab(pair["head"].target_ids)
    head.bind_embeddings(target.get_input_embeddings())
    train_head(target, head, steps=300)
    folder = export(pair, "export_two_layers", pair["root"] / "target", head)
    config = json.loads((folder / "config.json").read_text())
    assert config["num_hidden_layers"] == config["transformer_layer_config"]["num_hidden_layers"] == 2
    seen, plain, ours = served_alone(pair, folder)
    assert seen["method"] == "eagle3" and seen["outputs"] == plain
    served = SpecCounters.from_dict(seen["counters"])
    assert served.num_accepted_tokens > 0
    assert served == ours  # tau, acceptance and acceptance per position equal, step by step


def printed_vllm_serve_lines(text: str) -> list[list[str]]:
    """The `vllm serve ...` commands in `specdistill check`'s output, each as the shell would split it (backslash
    continuations joined, comments dropped)."""
    joined = text.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip().startswith("vllm serve")]


def test_the_serve_commands_check_prints_work_as_typed(pair, capsys):
    """Each `vllm serve` line `specdistill check` prints for an export, run as typed by the `vllm` command of the
    serving venv (only a free --port added): the server answers a completion with the head drafting."""
    from decode.serving.http_server import vllm_server

    folder = pair["root"] / "export_for_speculators"
    if not folder.is_dir():
        folder = export(pair, "export_for_speculators", pair["root"] / "target")
    capsys.readouterr()
    assert check_cli.main(["--target", str(pair["root"] / "target"), "--draft", str(folder)]) == 0
    commands = printed_vllm_serve_lines(capsys.readouterr().out)
    assert [c[2] for c in commands] == [str(folder), str(pair["root"] / "target")], commands
    prompt = pair["tokenizer"]("def add(a, b):")["input_ids"]
    for argv in commands:
        with vllm_server(PYTHON, argv[2], argv[3:], port=None, log=pair["root"] / "typed.log") as server:
            assert len(server.complete(prompt, 16, ignore_eos=True)) == 16
            assert server.spec_counters()["num_drafts"] > 0, argv


LOAD_ANY = """
import json, sys
from speculators import SpeculatorModelConfig
config = SpeculatorModelConfig.from_pretrained(sys.argv[1])
print(json.dumps({"class": type(config).__name__, "type": config.speculators_model_type,
                  "tokens": config.speculators_config.proposal_methods[0].speculative_tokens,
                  "mask_token_id": getattr(config, "mask_token_id", None),
                  "layers": getattr(config, "aux_hidden_state_layer_ids", None)
                  or getattr(config, "eagle_aux_hidden_state_layer_ids", None)}))
"""


@pytest.mark.parametrize("kind_name", ["p_eagle", "dflash"])
def test_parallel_and_block_exports_load_with_speculators_config_classes(pair, kind_name):
    """A P-EAGLE head as peagle (its mask token), a DFlash draft as dflash (its target layers counted as speculators
    counts them, one more than dflash_config's, which vLLM subtracts back); each served by vLLM from the export
    alone."""
    from test_p_eagle import new_head

    from distill.publish.export import write_served_folder
    from kinds.dflash.model import DFlashDraft, dflash_config_for

    target = pair["target"]
    if kind_name == "p_eagle":
        draft = new_head(target, token=3, gamma=GAMMA, aux_layers=[0, 1, 3])
        expected = {"class": "PEagleSpeculatorConfig", "type": "peagle", "mask_token_id": 3, "layers": [0, 1, 3]}
    else:
        draft = DFlashDraft(dflash_config_for(target.config, mask_token_id=3, block_size=4)).bind_target(target)
        layers = [i + 1 for i in draft.config.dflash_config["target_layer_ids"]]
        expected = {"class": "DFlashSpeculatorConfig", "type": "dflash", "mask_token_id": 3, "layers": layers}
    out = pair["root"] / f"export_{kind_name}"
    out.mkdir()
    verifier = str(pair["root"] / "target")
    write_served_folder(out, draft, pair["tokenizer"], GAMMA, kind_named(kind_name), verifier=verifier)
    loaded = subprocess.run([str(PYTHON), "-c", LOAD_ANY, str(out)], capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert json.loads(loaded.stdout.strip().splitlines()[-1]) == {**expected, "tokens": GAMMA}
    assert kind_of_source(str(out)).name == kind_name  # and we still read it as our own

    # served alone (`vllm serve EXPORT`): peagle as eagle3 with parallel drafting, dflash as dflash (a block, drafted
    # in parallel too), the export's gamma;
    # greedy output the target's, and vLLM's counters (tau, acceptance per position) those of our decoder on the export
    seen, plain, ours = served_alone(pair, out)
    assert (seen["method"], seen["parallel"]) == ("eagle3" if kind_name == "p_eagle" else "dflash", True)
    assert seen["tokens"] == GAMMA and seen["outputs"] == plain
    served = SpecCounters.from_dict(seen["counters"])
    assert served.num_drafts > 0 and served == ours
