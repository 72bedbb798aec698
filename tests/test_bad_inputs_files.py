"""Sweeps of files that are not text over the four commands (issue 20, part 5); numbers:
tests/test_bad_inputs_sweep.py.

Every file a command reads gets bytes that are not text (random binary, UTF-16 with and without a BOM, a PNG). Each
case: exit 1, exactly one error line naming the file, no traceback, and no model weights loaded (the tripwire of
tests/test_bad_inputs.py), except the late cases, whose file is only read once the models are loaded. A string key
or flag added later fails test_every_path_key_and_flag_is_classified until it is sorted into PATH_KEYS / FLAG_KINDS
(and, when the command reads it, given a FILE_CASES entry). Last, decode.inputs.checks.text_problem itself and a scan
that no other code of the commands opens text files.
"""
from __future__ import annotations

import ast
import json
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_bad_inputs import RECIPE, no_weights, w  # noqa: F401 - fixtures (no_weights: getfixturevalue)
from test_bad_inputs_sweep import (
    PARSED,
    STRING_TYPES,
    VALID_ARGV,
    action_name,
    command_parser,
    holds,
    recipe_fields,
    run_command,
    value_actions,
)
from transformers import AutoTokenizer

from decode.inputs import checks

from helpers import run_train
from tiny import TINY_TEXT, tiny_model

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------------------------
# Files: what every path key and flag is, and a case for each file a command reads
# ---------------------------------------------------------------------------------------------------------------

# Recipe keys that hold strings: "read" (a file or folder the run reads) or "name" (no file of ours is read).
PATH_KEYS = {
    "model.target": "read", "model.draft": "read", "model.tokenizer": "read", "data.dataset": "read",
    "data.eval_prompts": "read", "data.target_data_dir": "read", "distill.teacher_cache": "read",
    "distill.hidden_state_cache": "read",
    "train.output_dir": "read", "train.resume_from_checkpoint": "read",
    "model.draft_config": "name", "model.attn_implementation": "name", "data.dataset_config": "name",
    "data.split": "name", "data.synthesize_categories": "name", "data.text_field": "name",
    "data.messages_field": "name", "distill.loss": "name",
    "train.report_to": "name",
    "lora.target_modules": "name", "lora.modules_to_save": "name", "hub.repo_id": "name",
    "eval.vllm_python": "name",  # an interpreter we run (decode.serving), never read as text
    # TrainingArguments' other string fields: names, or JSON given inline (lr_scheduler_kwargs), never a file path
    **{f"train.{name}": "name" for name in (
        "activation_checkpointing_kwargs", "dataloader_multiprocessing_context", "ddp_backend", "debug",
        "include_for_metrics", "include_num_input_tokens_seen", "label_names", "length_column_name",
        "liger_kernel_config", "log_level", "log_level_replica", "lr_scheduler_kwargs", "metric_for_best_model",
        "optim_args", "optim_target_modules", "project", "run_name", "torch_compile_backend", "torch_compile_mode",
        "trackio_bucket_id", "trackio_space_id", "trackio_static_space_id", "train_sampling_strategy")},
}
# Flags that take a string: "read", "written" (tests/test_bad_inputs.py checks those) or "name".
FLAG_KINDS = {
    "specdistill-eval": {"--target": "read", "--draft": "read", "--prompts": "read", "--output": "written",
                         "--save-outputs": "written", "--prompts-split": "name", "--prompts-config": "name",
                         "--prompt-field": "name", "--messages-field": "name", "--category-field": "name",
                         "--chat-template": "name", "--device": "name", "--dtype": "name", "--engine": "name",
                         "--cpu-linear": "name", "--draft-vocab": "name", "--vllm-draft-sampling": "name",
                         "--vllm-dtype": "name", "--vllm-python": "name"},  # an interpreter we run
    "specdistill-push": {"output_dir": "read", "--eval-json": "read", "--repo-id": "name", "--target": "name",
                         "--staging-dir": "name"},  # --staging-dir: accepted, never used
    "specdistill-check": {"--target": "read", "--draft": "read", "--json": "written", "--vllm-dtype": "name",
                          "--vllm-python": "name"},
}


@dataclass(frozen=True)
class FileCase:
    """A command whose input `what` (a flag or recipe key) makes it read `file` (under the case's folder)."""

    prog: str
    what: str
    file: str
    argv: tuple[str, ...]
    late: bool = False  # read after the models load (no weight tripwire)


def train_case(what: str, file: str, *overrides: str, recipe: str = RECIPE, late: bool = False) -> FileCase:
    base = ["model.target={w}/target", "data.dataset={w}/code.txt", "train.output_dir={w}/fresh_out"]
    return FileCase("specdistill-train", what, file, (recipe, *base, *overrides), late)


def eval_case(what: str, file: str, *changes: str) -> FileCase:
    args = dict(zip(VALID_ARGV["specdistill-eval"][0:6:2], VALID_ARGV["specdistill-eval"][1:6:2]))
    args.update(zip(changes[0::2], changes[1::2]))
    return FileCase("specdistill-eval", what, file,
                    (*[x for pair in args.items() for x in pair], "--max-new-tokens", "4", "--quiet"))


FILE_CASES = [
    # specdistill-train: the recipe, the data, the prompts, the model folders, a previous run's files
    train_case("recipe", "recipe.yaml", recipe="{w}/recipe.yaml"),
    train_case("data.dataset", "code.txt"),
    train_case("data.dataset", "rows.jsonl", "data.dataset={w}/rows.jsonl"),
    train_case("data.dataset", "rows.json", "data.dataset={w}/rows.json"),
    train_case("data.dataset", "corpus/b.txt", "data.dataset={w}/corpus"),
    train_case("data.eval_prompts", "prompts.txt", "data.eval_prompts={w}/prompts.txt"),
    train_case("data.eval_prompts", "prompts.jsonl", "data.eval_prompts={w}/prompts.jsonl"),
    train_case("model.target", "target/config.json"),
    train_case("model.target", "target/tokenizer.json"),
    train_case("model.target", "target/tokenizer_config.json"),
    train_case("model.target", "target/generation_config.json"),
    train_case("model.draft", "draft/config.json", "model.draft_config=null", "model.draft={w}/draft"),
    train_case("model.tokenizer", "tokenizer/tokenizer.json", "model.tokenizer={w}/tokenizer"),
    train_case("train.resume_from_checkpoint", "run/checkpoint-4/trainer_state.json",
               "train.resume_from_checkpoint={w}/run/checkpoint-4"),
    train_case("train.resume_from_checkpoint", "run/checkpoint-4/config.json",
               "train.resume_from_checkpoint={w}/run/checkpoint-4"),
    train_case("train.output_dir", "run/checkpoint-4/trainer_state.json", "train.output_dir={w}/run",
               "train.resume_from_checkpoint=true"),
    train_case("train.output_dir", "done/train_results.json", "train.output_dir={w}/done",
               "train.resume_from_checkpoint=true"),
    train_case("distill.teacher_cache", "cache/teacher_cache.json", "distill.teacher_cache={w}/cache",
               "train.max_steps=1", late=True),
    train_case("distill.hidden_state_cache", "hidden/hidden_cache.json", "distill.hidden_state_cache={w}/hidden",
               "model.target={w}/deep_target", "train.max_steps=1", recipe=str(ROOT / "recipes" / "tiny_eagle3.yaml"),
               late=True),  # a head reads 3 layers: the 4-layer target
    train_case("data.target_data_dir", "responses/target_data.json", "data.target_weight=1.0",
               "data.target_data_dir={w}/responses", "data.target_max_new_tokens=2", "train.max_steps=1", late=True),
    # specdistill-eval: prompt files (read by us, or by datasets after a check), the two model folders
    eval_case("--prompts", "prompts.txt"),
    eval_case("--prompts", "prompts.jsonl", "--prompts", "{w}/prompts.jsonl"),
    eval_case("--prompts", "prompts.json", "--prompts", "{w}/prompts.json"),
    eval_case("--prompts", "prompts.csv", "--prompts", "{w}/prompts.csv"),
    eval_case("--prompts", "prompt_rows/b.jsonl", "--prompts", "{w}/prompt_rows"),
    eval_case("--target", "target/config.json"),
    eval_case("--target", "target/tokenizer.json"),
    eval_case("--draft", "draft/config.json"),
    eval_case("--draft", "draft/generation_config.json"),
    # specdistill-push: the exported folder's logs, recipe, config and card, and --eval-json
    *[FileCase("specdistill-push", "output_dir", f"export/{name}", ("{w}/export", "--repo-id", "me/d", "--dry-run"))
      for name in ("acceptance.jsonl", "recipe.yaml", "train_results.json", "config.json", "README.md")],
    FileCase("specdistill-push", "--eval-json", "eval.json",
             ("{w}/export", "--repo-id", "me/d", "--dry-run", "--eval-json", "{w}/eval.json")),
    # specdistill-check: the JSON files of both folders
    *[FileCase("specdistill-check", flag, f"{folder}/{name}", ("--target", "{w}/target", "--draft", "{w}/export"))
      for flag, folder in (("--target", "target"), ("--draft", "export"))
      for name in ("config.json", "tokenizer.json", "tokenizer_config.json")],
    FileCase("specdistill-check", "--draft", "export/generation_config.json",
             ("--target", "{w}/target", "--draft", "{w}/export")),
]

TEXT = "def add(a, b):\nclass Point:\n"
NOT_TEXT = {  # name -> the bytes that replace the file (given the file's own text)
    "binary": lambda text: random.Random(20).randbytes(2048),
    "utf-16": lambda text: text.encode("utf-16"),  # with a BOM, as Windows editors save "Unicode"
    "utf-16-le": lambda text: text.encode("utf-16-le"),  # no BOM: NUL bytes between ASCII letters
    "png": lambda text: b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(64)),
}


def test_every_path_key_and_flag_is_classified():
    """A string key or flag added later must be sorted here, and every input that is read has a file case."""
    string_keys = {k for k, hint in recipe_fields().items() if holds(hint, (str, dict))}
    assert string_keys == set(PATH_KEYS), string_keys ^ set(PATH_KEYS)
    for prog, module in PARSED.items():
        flags = {action_name(a) for a in value_actions(command_parser(module)) if a.type in STRING_TYPES}
        assert flags == set(FLAG_KINDS[prog]), (prog, flags ^ set(FLAG_KINDS[prog]))
    read = {("specdistill-train", k) for k, kind in PATH_KEYS.items() if kind == "read"}
    read |= {(p, f) for p, kinds in FLAG_KINDS.items() for f, kind in kinds.items() if kind == "read"}
    assert read <= {(case.prog, case.what) for case in FILE_CASES}, read - {(c.prog, c.what) for c in FILE_CASES}


@pytest.fixture(scope="module")
def sources(w: Path) -> Path:
    """What the file cases read, valid: test_bad_inputs' workdir plus data, prompts, runs and caches."""
    root = w / "sweep_sources"
    root.mkdir()
    for name in ("target", "draft", "export", "code.txt", "prompts.txt"):
        copy = shutil.copytree if (w / name).is_dir() else shutil.copyfile
        copy(w / name, root / name)
    shutil.copyfile(RECIPE, root / "recipe.yaml")
    shutil.copytree(w / "target", root / "deep_target")  # its tokenizer, with 4 layers (an EAGLE-3 head reads 3)
    tiny_model("llama", vocab_size=len(AutoTokenizer.from_pretrained(w / "target")), hidden=32,
               layers=4).save_pretrained(root / "deep_target")
    shutil.copytree(w / "draft", root / "tokenizer")
    lines = TINY_TEXT.splitlines()
    (root / "rows.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    (root / "rows.json").write_text(json.dumps([{"text": t} for t in lines]))
    (root / "corpus").mkdir()
    (root / "corpus" / "a.txt").write_text(TINY_TEXT)
    (root / "corpus" / "b.txt").write_text(TINY_TEXT)
    (root / "prompts.jsonl").write_text('{"prompt": "def add(a, b):"}\n{"prompt": "class Point:"}\n')
    (root / "prompts.json").write_text('[{"prompt": "def add(a, b):"}, {"prompt": "class Point:"}]')
    (root / "prompts.csv").write_text("prompt\ndef add(a b)\nclass Point\n")
    (root / "prompt_rows").mkdir()  # a local dataset folder of data files
    for name in ("a.jsonl", "b.jsonl"):
        shutil.copyfile(root / "prompts.jsonl", root / "prompt_rows" / name)
    for run, step in (("run", 2), ("done", 24)):  # a run stopped at step 4 of 24, and one that finished
        checkpoint = root / run / f"checkpoint-{step if run == 'done' else 4}"
        shutil.copytree(w / "draft", checkpoint)
        (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": step if run == "done" else 4,
                                                                   "max_steps": 24}))
        (root / run / "recipe.yaml").write_text("")
    (root / "done" / "train_results.json").write_text(json.dumps({"best": {"step": 24}}))
    (root / "export" / "train_results.json").write_text(json.dumps({"best": {"step": 4}}))
    (root / "eval.json").write_text(json.dumps({"target": "t", "results": []}))
    for folder, name in (("cache", "teacher_cache.json"), ("responses", "target_data.json"),
                         ("hidden", "hidden_cache.json")):
        (root / folder).mkdir()
        (root / folder / name).write_text("{}")
    return root


@pytest.mark.parametrize("payload", list(NOT_TEXT))
@pytest.mark.parametrize("case", FILE_CASES, ids=lambda c: f"{c.prog.split('-')[1]}:{c.what}:{c.file}")
def test_file_not_text(case, payload, sources, tmp_path, request, monkeypatch, capsys):
    if not case.late:
        request.getfixturevalue("no_weights")
    used = set(re.findall(r"\{w\}/([^/\s]+)", " ".join(case.argv))) | {case.file.split("/")[0]}
    for name in used & {p.name for p in sources.iterdir()}:
        copy = shutil.copytree if (sources / name).is_dir() else shutil.copyfile
        copy(sources / name, tmp_path / name)
    bad = tmp_path / case.file
    bad.write_bytes(NOT_TEXT[payload](bad.read_text() if bad.is_file() else TEXT))
    line = run_command(case.prog, [a.format(w=tmp_path) for a in case.argv], monkeypatch, capsys)
    assert f"{bad} is not UTF-8 text (" in line, line


@pytest.mark.integration
def test_resume_reads_a_non_text_acceptance_log_as_one_line(w, tmp_path, monkeypatch, capsys):
    """specdistill-train reads OUTPUT_DIR/acceptance.jsonl when it resumes, once the models are loaded (a real
    4-step run makes the checkpoint): a log that is not text is one line naming it."""
    short = ["train.save_steps=4", "eval.gammas=[1]", "eval.max_new_tokens=4"]
    out = run_train(w, "resume_bad_log", "train.max_steps=4", *short)
    log = out / "acceptance.jsonl"
    assert log.read_text().strip()  # the checkpoint was measured
    log.write_bytes(NOT_TEXT["png"](""))
    argv = [RECIPE, f"model.target={w / 'target'}", f"data.dataset={w / 'code.txt'}", f"train.output_dir={out}",
            "train.max_steps=8", "train.resume_from_checkpoint=true", *short]
    line = run_command("specdistill-train", argv, monkeypatch, capsys)
    assert f"{log} is not UTF-8 text (" in line, line


def test_binary_safetensors_header_is_one_line(sources, tmp_path, monkeypatch, capsys):
    """specdistill-check reads safetensors headers itself: a binary file is named, not a JSON traceback."""
    shutil.copytree(sources / "export", tmp_path / "export")
    weights = tmp_path / "export" / "model.safetensors"
    weights.write_bytes((64).to_bytes(8, "little") + NOT_TEXT["binary"](""))
    line = run_command("specdistill-check", ["--target", str(sources / "target"), "--draft", str(tmp_path / "export")],
                       monkeypatch, capsys)
    assert f"{weights} is not a readable safetensors file" in line, line


# ---------------------------------------------------------------------------------------------------------------
# The one place: decode.inputs.checks.text_problem, and no other reader of text files in the commands' code
# ---------------------------------------------------------------------------------------------------------------

def test_text_problem_positions_across_chunks(tmp_path, monkeypatch):
    """Chunked reading: a character cut by a chunk boundary is fine; the first bad byte is named exactly."""
    monkeypatch.setattr(checks, "TEXT_CHUNK_BYTES", 4)
    path = tmp_path / "t.txt"
    path.write_bytes("abcé∑ok\n".encode())  # é and ∑ straddle the 4-byte chunks
    assert checks.text_problem(path) is None
    path.write_bytes(b"abcdef\xffgh")
    assert checks.text_problem(path) == "byte 6: invalid start byte"
    path.write_bytes("abé".encode() + b"\xc3")  # ends in the middle of a character
    assert checks.text_problem(path) == "it ends inside a character: unexpected end of data"
    path.write_bytes(b"abcdefg\x00h")
    assert checks.text_problem(path) == "a NUL byte at byte 7: binary data or UTF-16"
    path.write_bytes("x".encode("utf-16"))
    assert checks.text_problem(path) == "it starts with a UTF-16 byte-order mark; save it as UTF-8"


# Files of the commands' code that may open text themselves: the one place, and the streaming .txt reader (its
# file passed check_text_file in distill.data.rows.load_rows first).
# decode/serving/vllm_worker.py runs in vLLM's venv with the stdlib only and reads the request file we wrote.
TEXT_READERS_ALLOWED = {"decode/inputs/checks.py", "distill/data/text_files.py", "decode/serving/vllm_worker.py"}
NOT_COMMAND_CODE = ("scripts/bench", "scripts/plot_", "scripts/quickstart", "scripts/chaos_resume",
                    "scripts/benchmark.py", "scripts/doc_blocks.py")


def text_reads(path: Path) -> list[int]:
    """Lines of `path` that read a file as text: .read_text(...), or open(...) without a binary mode."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        method = isinstance(node.func, ast.Attribute)
        name = node.func.attr if method else getattr(node.func, "id", "")
        if method and name == "read_text":
            found.append(node.lineno)
        elif name == "open" and not (method and getattr(node.func.value, "id", "") == "os"):
            mode_arg = node.args[0:1] if method else node.args[1:2]  # Path.open(mode), open(path, mode)
            modes = [a.value for a in mode_arg if isinstance(a, ast.Constant)]
            modes += [k.value.value for k in node.keywords if k.arg == "mode" and isinstance(k.value, ast.Constant)]
            if not any(set(str(m)) & set("bwax") for m in modes):
                found.append(node.lineno)
    return found


def test_text_files_are_read_in_one_place():
    offenders = []
    for path in sorted([*ROOT.glob("decode/**/*.py"), *ROOT.glob("distill/**/*.py"), *ROOT.glob("scripts/*.py")]):
        relative = path.relative_to(ROOT).as_posix()
        if relative in TEXT_READERS_ALLOWED or relative.startswith(NOT_COMMAND_CODE):
            continue
        offenders += [f"{relative}:{line}" for line in text_reads(path)]
    assert not offenders, ("read text through decode.inputs.checks.read_text (one line naming a non-text file): "
                           f"{offenders}")
