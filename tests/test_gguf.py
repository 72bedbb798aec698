"""GGUF files wherever a model path is taken (decode/inputs/gguf.py): converted once into a plain folder that gives the
same logits as transformers' own GGUF loading, reused afterwards, and one clear line for a bad file.

The tiny GGUF is written here with the `gguf` package the way llama.cpp's converter writes a Llama (Q/K rows
permuted for its rope layout, a byte-level BPE vocabulary with its merges), so the round trip is exact.
"""
import errno
import hashlib
import json
import shutil
import socket
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

from decode.inputs import gguf as gguf_cache
from decode.inputs.gguf import DONE_FILE, SOURCE_FILE, cache_root, smollm2_gguf
from decode.inputs.loading import LoadError, load_causal_lm, load_tokenizer, resolve_model_path
from distill.models.load import with_model_folders
from distill.run.preflight import check_run
from distill.utils import ModelSetupError
from specdistill.cli import check as check_cli
from specdistill.cli import eval as eval_cli
from specdistill.cli import train as train_cli
from specdistill.recipes import load_recipe

from helpers import accelerate_launch
from tiny import TINY_TEXT, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPE = str(ROOT / "recipes" / "tiny_distill.yaml")
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")
HEADS, KV_HEADS = 4, 2
# our names -> llama.cpp's (convert_hf_to_gguf.py, gguf-py/gguf/tensor_mapping.py)
GLOBAL_TENSORS = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                  "lm_head.weight": "output.weight"}
LAYER_TENSORS = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}


def llama_cpp_permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K row order: each head's rotary halves interleaved (transformers' loader undoes it)."""
    return (weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def write_tiny_gguf(path: Path, architecture: str = "llama", seed: int = 0, tied: bool = False) -> torch.nn.Module:
    """A tiny random Llama with tiny_tokenizer's vocabulary written as an F32 GGUF at ``path`` (``tied``: no
    output.weight, the embedding reads the logits out, as SmolLM2's); returns the model."""
    tokenizer = tiny_tokenizer()
    config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         intermediate_size=128, vocab_size=len(tokenizer), max_position_embeddings=256,
                         rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=tied,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for weight in model.parameters():
            weight.normal_(0.0, 0.3)  # random, not the init's near-uniform logits: greedy choices well apart
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny llama")
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_block_count(2)
    writer.add_feed_forward_length(128)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(64 // HEADS)
    writer.add_vocab_size(len(tokenizer))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    bpe = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    tokens = [token for token, _ in sorted(bpe["vocab"].items(), key=lambda item: item[1])]
    tokens[0] = "<|endoftext|>"  # as in byte-level GGUFs: transformers' loader appends this token when it is missing
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if i < 4 else gguf.TokenType.NORMAL for i in range(len(tokens))])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in bpe["merges"]])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, weight in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        weight = weight.numpy()
        if name in GLOBAL_TENSORS:
            writer.add_tensor(GLOBAL_TENSORS[name], weight)
            continue
        _, _, layer, *module, _ = name.split(".")  # model.layers.<i>.<module>.weight
        module = ".".join(module)
        if module in ("self_attn.q_proj", "self_attn.k_proj"):
            weight = llama_cpp_permute(weight, HEADS if module == "self_attn.q_proj" else KV_HEADS)
        writer.add_tensor(f"blk.{layer}.{LAYER_TENSORS[module]}.weight", np.ascontiguousarray(weight))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    """(models/tiny.gguf, the model written into it)."""
    folder = tmp_path_factory.mktemp("models")
    model = write_tiny_gguf(folder / "tiny.gguf")
    return folder / "tiny.gguf", model


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """A fresh cache per test, and no hash remembered from an earlier test (as in a new process)."""
    monkeypatch.setenv("SPECDISTILL_CACHE", str(tmp_path / "cache"))
    gguf_cache.file_sha256.cache_clear()
    return tmp_path / "cache" / "gguf"


def gguf_model(file: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32).eval()


def greedy(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int = 8) -> list[int]:
    out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


# ---------------------------------------------------------------------------------------------------------------
# The conversion
# ---------------------------------------------------------------------------------------------------------------

def test_converted_folder_computes_what_the_gguf_does(tiny, cache, capsys):
    file, written = tiny
    folder = Path(resolve_model_path(str(file)))
    assert folder == cache / hashlib.sha256(file.read_bytes()).hexdigest() == cache_root() / folder.name
    err = capsys.readouterr().err
    assert f"converting tiny.gguf once into {folder}" in err

    plain = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    reference = gguf_model(file)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = torch.tensor([tokenizer("def add(a, b):\n    return")["input_ids"]])
    with torch.no_grad():
        logits = plain(ids).logits
        assert torch.equal(logits, reference(ids).logits)
        assert torch.equal(logits, written(ids).logits)  # llama.cpp's Q/K permutation undone exactly
    ours = greedy(plain, ids)
    assert ours == greedy(reference, ids) and len(ours) == 8

    reference_tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    assert tokenizer(TINY_TEXT[:200])["input_ids"] == reference_tokenizer(TINY_TEXT[:200])["input_ids"]
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<s>", "</s>", "<|endoftext|>")
    assert len(tokenizer) == written.config.vocab_size == 320
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    assert plain.generation_config.eos_token_id == 2
    source = json.loads((folder / SOURCE_FILE).read_text())
    assert {key: source[key] for key in ("file", "sha256", "size")} == {
        "file": "tiny.gguf", "sha256": folder.name, "size": file.stat().st_size}
    assert sorted(p.name for p in cache.iterdir()) == [folder.name]  # no temporary folder left


def test_tied_embeddings_stay_tied(tmp_path):
    written = write_tiny_gguf(tmp_path / "tied.gguf", seed=1, tied=True)
    plain = AutoModelForCausalLM.from_pretrained(resolve_model_path(tmp_path / "tied.gguf"), dtype=torch.float32)
    assert plain.config.tie_word_embeddings
    assert plain.get_output_embeddings().weight.data_ptr() == plain.get_input_embeddings().weight.data_ptr()
    ids = torch.tensor([[5, 17, 42, 9, 300]])
    with torch.no_grad():
        assert torch.equal(plain.eval()(ids).logits, written(ids).logits)


def test_a_second_call_reuses_the_folder(tiny, cache, tmp_path, monkeypatch, capsys):
    file, _ = tiny
    folder = Path(resolve_model_path(file))
    marker = (folder / DONE_FILE).stat().st_mtime_ns
    capsys.readouterr()

    def refuse(*_args):
        raise AssertionError("converted again")
    monkeypatch.setattr(gguf_cache, "write_plain_folder", refuse)
    gguf_cache.file_sha256.cache_clear()  # as a new process: the file is hashed again, the folder found
    assert resolve_model_path(str(file)) == str(folder)
    copy = tmp_path / "renamed.gguf"
    shutil.copyfile(file, copy)
    assert resolve_model_path(str(copy)) == str(folder)  # the key is the content, not the name
    assert (folder / DONE_FILE).stat().st_mtime_ns == marker
    assert capsys.readouterr().err == ""  # nothing printed when reusing


def test_other_paths_are_returned_unchanged(tmp_path):
    for path in ("org/model", str(tmp_path), "prompt-lookup", str(tmp_path / "model.safetensors")):
        assert resolve_model_path(path) == path
    assert not (tmp_path / "cache").exists()


# ---------------------------------------------------------------------------------------------------------------
# Bad files: one line naming the file, nothing left in the cache
# ---------------------------------------------------------------------------------------------------------------

def bad_files(folder: Path, good: Path) -> dict[str, tuple[Path, str]]:
    data = good.read_bytes()
    files = {"not a GGUF": ("text.gguf", b"hello, I am text\n" * 4, "is not a GGUF file (it starts with b'hell'"),
             "truncated": ("truncated.gguf", data[: len(data) // 2], "is truncated"),
             "truncated header": ("header.gguf", data[:100], "is truncated"),
             "empty": ("empty.gguf", b"", "is not a GGUF file (it is empty")}
    made = {}
    for case, (name, content, message) in files.items():
        (folder / name).write_bytes(content)
        made[case] = (folder / name, message)
    write_tiny_gguf(folder / "bogus.gguf", architecture="bogusarch")
    made["unsupported architecture"] = (folder / "bogus.gguf", "architecture 'bogusarch' cannot be loaded")
    return made


def test_bad_files_are_one_line_and_leave_nothing(tiny, cache, tmp_path):
    for case, (file, message) in bad_files(tmp_path, tiny[0]).items():
        with pytest.raises(LoadError) as error:
            resolve_model_path(str(file), "--target")
        text = str(error.value)
        assert text.startswith(f"--target: {file}") and message in text and "\n" not in text, (case, text)
        assert not cache.exists() or not any(cache.iterdir()), case
    with pytest.raises(LoadError, match=r"missing\.gguf: no such GGUF file"):
        resolve_model_path(str(tmp_path / "missing.gguf"))


def test_a_failure_or_a_kill_mid_way_leaves_no_entry(tiny, cache, monkeypatch):
    file, _ = tiny

    def fail_half_way(_file, out):
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        raise gguf_cache.GGUFProblem("disk full")
    with monkeypatch.context() as patched:
        patched.setattr(gguf_cache, "write_plain_folder", fail_half_way)
        with pytest.raises(LoadError, match="disk full"):
            resolve_model_path(file)
    assert list(cache.iterdir()) == []

    digest = gguf_cache.file_sha256(str(file), file.stat().st_size, file.stat().st_mtime_ns)
    killed = cache / f"{gguf_cache.PARTIAL_PREFIX}{digest}-{socket.gethostname()}-999999999"  # no such process
    killed.mkdir()
    (cache / digest).mkdir()  # a folder without its marker: not taken for a finished one
    folder = Path(resolve_model_path(file))
    assert (folder / DONE_FILE).is_file() and (folder / "model.safetensors").is_file()
    assert sorted(p.name for p in cache.iterdir()) == [digest]


def test_a_cache_that_cannot_be_written_is_one_line_naming_it(tiny, tmp_path, monkeypatch):
    """$SPECDISTILL_CACHE under a file (a read-only home answers alike), and a disk that fills while the folder is
    written: one line naming the cache folder and what to set; nothing left behind."""
    file, _ = tiny
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    monkeypatch.setenv("SPECDISTILL_CACHE", str(blocked))
    with pytest.raises(LoadError) as error:
        resolve_model_path(file)
    assert str(error.value) == (f"cannot write the converted folder of {file.name} in {blocked / 'gguf'} (Not a "
                                "directory): set SPECDISTILL_CACHE to a writable folder with room for a float32 copy "
                                "of the model")

    monkeypatch.setenv("SPECDISTILL_CACHE", str(tmp_path / "cache"))

    def disk_full(_file, out):
        out.mkdir(parents=True)
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(gguf_cache, "write_plain_folder", disk_full)
    with pytest.raises(LoadError, match=r"\(No space left on device\): set SPECDISTILL_CACHE to a writable folder"):
        resolve_model_path(file)
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []


# ---------------------------------------------------------------------------------------------------------------
# Wherever a model path is taken
# ---------------------------------------------------------------------------------------------------------------

def test_loaders_take_a_gguf(tiny):
    file, written = tiny
    model = load_causal_lm(str(file), torch.device("cpu"), torch.float32)
    ids = torch.tensor([[5, 17, 42, 9]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, written(ids).logits)
    assert Path(model.name_or_path) == cache_root() / Path(model.name_or_path).name  # the folder vLLM can serve
    assert load_tokenizer(str(file)).chat_template == CHAT_TEMPLATE


def test_specdistill_eval_with_a_gguf_target_and_draft(tiny, tmp_path, capsys):
    file, _ = tiny
    (tmp_path / "prompts.txt").write_text("def add(a, b):\nclass Point:\n")
    report = eval_cli.main(["--target", str(file), "--draft", str(file), "--prompts", str(tmp_path / "prompts.txt"),
                            "--gamma", "3", "--max-new-tokens", "8", "--device", "cpu", "--quiet"])
    assert report["target"] == report["draft"] == str(file)  # named as given
    [result] = report["results"]
    assert result["num_prompts"] == 2 and result["new_tokens"] == 16
    assert result["greedy_match"] == 1.0 and result["acceptance_rate"] == 1.0  # the draft is the target
    assert len(list(cache_root().iterdir())) == 1


def test_specdistill_eval_names_a_bad_gguf(tmp_path, monkeypatch, capsys):
    (tmp_path / "prompts.txt").write_text("hello\n")
    (tmp_path / "model.gguf").write_text("not a model")
    monkeypatch.setattr("sys.argv", ["specdistill-eval", "--target", str(tmp_path / "model.gguf"), "--draft",
                                     "prompt-lookup", "--prompts", str(tmp_path / "prompts.txt")])
    with pytest.raises(SystemExit) as exit_info:
        eval_cli.cli()
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"error: --target: {tmp_path / 'model.gguf'} is not a GGUF file (it starts with b'not '; "
                   "a GGUF starts with b'GGUF')")


def test_specdistill_check_with_a_gguf_target(tiny, capsys):
    file, _ = tiny
    code = check_cli.main(["--target", str(file), "--draft", str(file)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "ok   tokenizer" in out and "ok   vocab" in out
    assert str(cache_root()) in out  # the serving commands name the converted folder


def test_a_recipe_with_a_gguf_target_gets_through_the_check_step(tiny, tmp_path):
    file, _ = tiny
    (tmp_path / "code.txt").write_text(TINY_TEXT)
    recipe = load_recipe(TINY_RECIPE, [f"model.target={file}", f"data.dataset={tmp_path / 'code.txt'}",
                                       f"train.output_dir={tmp_path / 'out'}"])
    checked = check_run(recipe, TINY_RECIPE)
    folder = str(cache_root() / hashlib.sha256(file.read_bytes()).hexdigest())
    assert checked.recipe.model.target == folder and recipe.model.target == str(file)  # the caller's is untouched
    assert checked.recipe.train == recipe.train and checked.recipe.model.draft_config == {"num_hidden_layers": 1}
    assert len(checked.tokenizer) == 320 and len(checked.data.train) > 0


def test_a_run_from_a_gguf_target_trains_and_exports(tiny, tmp_path):
    """Check, load, tokenise, distil, measure, export: every step after the check reads the converted folder."""
    file, _ = tiny
    (tmp_path / "code.txt").write_text(TINY_TEXT)
    out = tmp_path / "out"
    summary = train_cli.main([TINY_RECIPE, f"model.target={file}", f"data.dataset={tmp_path / 'code.txt'}",
                              f"train.output_dir={out}", "train.max_steps=4"])
    assert summary["checkpoint"] == "checkpoint-4" and summary["step"] == 4
    folder = str(cache_root() / hashlib.sha256(file.read_bytes()).hexdigest())
    assert f"target: {folder}\n" in (out / "recipe.yaml").read_text()  # what the run used
    exported = json.loads((out / "config.json").read_text())
    assert (exported["vocab_size"], exported["num_hidden_layers"]) == (320, 1) and "quantization_config" not in exported


@pytest.mark.integration
def test_two_processes_convert_once(tiny, tmp_path):
    """Under DDP the main process converts while the other waits, then finds the folder in the cache."""
    file, _ = tiny
    (tmp_path / "code.txt").write_text(TINY_TEXT)
    done = accelerate_launch(ROOT / "scripts" / "train.py", TINY_RECIPE, f"model.target={file}",
                             f"data.dataset={tmp_path / 'code.txt'}", f"train.output_dir={tmp_path / 'out'}",
                             "train.max_steps=2", "train.save_steps=2", timeout=300)
    assert done.stderr.count("converting tiny.gguf once into") == 1, done.stderr[-2000:]
    assert (tmp_path / "out" / "train_results.json").is_file()
    assert [p.name for p in cache_root().iterdir()] == [hashlib.sha256(file.read_bytes()).hexdigest()]


def test_a_recipe_with_a_bad_gguf_names_the_key(tmp_path):
    (tmp_path / "draft.gguf").write_bytes(b"")
    recipe = load_recipe(TINY_RECIPE, ["model.target=org/target", f"model.draft={tmp_path / 'draft.gguf'}",
                                       "model.draft_config=null", "data.dataset=x.txt"])
    with pytest.raises(ModelSetupError, match=r"^model\.draft: .*draft\.gguf is not a GGUF file \(it is empty"):
        with_model_folders(recipe.model)


# ---------------------------------------------------------------------------------------------------------------
# The real model
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.integration
def test_smollm2_gguf_converts_to_the_same_greedy_answer(capsys):
    file = smollm2_gguf()  # installed by `make install` (GGUFProblem, not a skip, when it is missing)
    folder = Path(resolve_model_path(str(file)))
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config  # vLLM reads it as a plain float32 Llama
    assert (config["architectures"], config["model_type"], config["dtype"]) == (["LlamaForCausalLM"], "llama",
                                                                                "float32")
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert config["tie_word_embeddings"] is True

    tokenizer = AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = ids["input_ids"]
    assert tokenizer.decode(ids[0]).startswith("<|im_start|>")  # the ChatML template came along
    plain = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ours = greedy(plain, ids)
    del plain
    assert ours == greedy(gguf_model(file), ids)
    assert "Paris" in tokenizer.decode(ours)
