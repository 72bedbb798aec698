"""FSDP2 (`accelerate launch --config_file recipes/accelerate/fsdp.yaml`): the draft and the frozen target sharded
over 2 CPU processes (gloo), against one process with the whole batch.

Integration tests (marked) launch scripts/train.py through FSDP_ON_CPU below; the fast ones check the launch
settings that are refused and the pieces of distill/models/fsdp.py that need no process group.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from distill.models.distributed import UnsupportedModeError, check_device_mode
from distill.models.fsdp import LAYOUT, remember_layout
from distill.outputs.acceptance_log import read_records
from distill.outputs.checkpoints import KILL_ENV, PARTIAL_DIR
from distill.utils import plain_class

from helpers import (
    CHILD_ENV,
    ROOT,
    SMOOTH_LOSS,
    TINY_RECIPE,
    accelerate_command,
    accelerate_launch,
    assert_same_weights,
    run_process,
    run_train,
    torchrun,
)
from tiny import TINY_TEXT, tiny_model, tiny_tokenizer

FSDP_CONFIG = ROOT / "recipes" / "accelerate" / "fsdp.yaml"
VOCAB = 320
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant\n{% endif %}")

# accelerate applies its FSDP plugin only to GPU-type process groups: on CPU the test flags the gloo group as one
# (its device stays the CPU). On GPUs `accelerate launch --config_file recipes/accelerate/fsdp.yaml` needs none of
# this. The wrapper also checks that each process holds only its shards of the target once it is sharded.
FSDP_ON_CPU = textwrap.dedent("""
    import functools, sys
    from accelerate import PartialState
    from accelerate.utils import DistributedType
    PartialState(backend="gloo").distributed_type = DistributedType.MULTI_GPU
    import distill.recipe.train_config
    distill.recipe.train_config.TrainingArguments = functools.partial(
        distill.recipe.train_config.TrainingArguments, accelerator_config={"use_configured_state": True})
    from specdistill import pipeline
    from torch.distributed.tensor import DTensor
    shard = pipeline.shard_for_inference
    def checked(target, device):
        shard(target, device)
        params = list(target.parameters())
        assert all(isinstance(p, DTensor) for p in params), "a weight of the target is not sharded"
        assert sum(p.to_local().numel() for p in params) < 0.6 * sum(p.numel() for p in params)
        return target
    pipeline.shard_for_inference = checked
    from specdistill.cli import train
    train.cli()
""")

RUN = ("data.dataset={chat}", "data.format=chat", "data.max_length=48", "data.num_eval_prompts=2",
       "eval.gammas=[2]", "eval.max_new_tokens=8", "model.draft_config=null", "model.draft_layers=[1]",
       "train.max_steps=4", "train.logging_steps=1", "train.save_steps=2", "train.learning_rate=3e-3",
       "train.save_total_limit=null", "train.report_to=[]",
       "distill.chunk_size=8", SMOOTH_LOSS)  # several chunks per micro-batch, a different number on each rank


# ---------------------------------------------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """target/ (tiny Llama + tokenizer with a chat template), chat.jsonl (conversations of 1..4 code blocks: rows
    of different lengths, so a per-micro-batch mean would not match) and the FSDP launcher."""
    root = tmp_path_factory.mktemp("fsdp")
    tokenizer = tiny_tokenizer(VOCAB)
    tokenizer.chat_template = CHAT_TEMPLATE
    tiny_model("llama", vocab_size=VOCAB, hidden=64, layers=2).save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    (root / "code.txt").write_text(TINY_TEXT)
    blocks = TINY_TEXT.split("\n\n")[:4]
    rows = [{"messages": [{"role": "user", "content": f"show {i}"},
                          {"role": "assistant", "content": "\n".join(blocks[: 1 + i % 4])}]} for i in range(36)]
    (root / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "fsdp_on_cpu.py").write_text(FSDP_ON_CPU)
    return root


def run_args(workdir: Path, *extra: str) -> list[str]:
    return [a.format(chat=workdir / "chat.jsonl") for a in RUN] + list(extra)


def fsdp_command(workdir: Path, out: Path, *args: str) -> list[str]:
    return accelerate_command(workdir / "fsdp_on_cpu.py", TINY_RECIPE, f"model.target={workdir / 'target'}",
                              f"train.output_dir={out}", *args, config_file=FSDP_CONFIG)


FSDP_ENV = {"ACCELERATE_USE_CPU": "true", "PYTHONPATH": str(ROOT)}  # the launcher lives outside the repository


def fsdp_launch(workdir: Path, out: Path, *args: str, timeout: float = 240) -> Path:
    run_process(fsdp_command(workdir, out, *args), timeout=timeout, env=FSDP_ENV)
    return out


def logged_losses(checkpoint: Path) -> list[float]:
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    return [entry["loss"] for entry in history if "loss" in entry]


def stored_rows(folder: Path) -> list[dict]:
    """Every row of the shards a shard store (target responses, teacher cache) wrote into `folder`, in order."""
    import datasets

    shards = sorted(folder.rglob("data-*.arrow"))
    return [row for shard in shards for row in datasets.Dataset.from_file(str(shard))]


def acceptance(folder: Path) -> list[tuple]:
    return [(r["step"], r["acceptance_rate"], r["per_position_acceptance"]) for r in read_records(folder)]


def assert_exported_best(out: Path) -> None:
    """The exported draft is exactly the checkpoint its run picked (by measured speedup, so either one)."""
    best = json.loads((out / "train_results.json").read_text())["best"]
    assert_same_weights(out / best["checkpoint"] / "model.safetensors", out / "model.safetensors", rtol=0, atol=0)


@pytest.fixture(scope="module")
def reference(workdir) -> Path:
    """One process, the 6 rows of each optimizer step in one micro-batch."""
    return run_train(workdir, "reference", *run_args(workdir, "train.per_device_train_batch_size=6"))


@pytest.fixture(scope="module")
def fsdp_run(workdir) -> Path:
    """2 processes x 3 rows under FSDP2, uninterrupted."""
    return fsdp_launch(workdir, workdir / "fsdp", *run_args(workdir, "train.per_device_train_batch_size=3"))


# ---------------------------------------------------------------------------------------------------------------
# 2 processes under FSDP2 = 1 process with the whole batch
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.integration
def test_fsdp2_on_two_processes_matches_one_process(reference, fsdp_run):
    """The same losses, checkpoints, acceptance at each checkpoint (measured on whole copies gathered onto rank 0)
    and export; checkpoints hold the sharded training state (torch distributed checkpoint) next to whole weights."""
    assert logged_losses(fsdp_run / "checkpoint-4") == pytest.approx(logged_losses(reference / "checkpoint-4"),
                                                                     rel=2e-5)
    for name in ("checkpoint-2", "checkpoint-4"):
        assert_same_weights(reference / name / "model.safetensors", fsdp_run / name / "model.safetensors")
        assert any((fsdp_run / name / "pytorch_model_fsdp_0").glob("*.distcp"))  # the sharded draft
        assert any((fsdp_run / name / "optimizer_0").glob("*.distcp"))  # its sharded Adam states
    assert [step for step, *_ in acceptance(fsdp_run)] == [2, 4]
    assert acceptance(fsdp_run) == acceptance(reference)  # greedy acceptance: counts, exactly the same
    assert_exported_best(fsdp_run)


@pytest.mark.integration
def test_fsdp2_killed_while_saving_resumes_to_the_uninterrupted_run(workdir, fsdp_run):
    """kill -9 (rank 0, with checkpoint-4 written but not renamed), then resume under FSDP2 from the sharded
    checkpoint-2: the same weights, losses and acceptance log as the uninterrupted run."""
    out = workdir / "fsdp_killed"
    args = run_args(workdir, "train.per_device_train_batch_size=3")
    killed = subprocess.run(fsdp_command(workdir, out, *args), cwd=ROOT, capture_output=True, text=True, timeout=240,
                            env={**os.environ, **CHILD_ENV, **FSDP_ENV, KILL_ENV: "checkpoint-save:2"})
    assert killed.returncode != 0, killed.stderr[-3000:]
    assert not (out / "checkpoint-4").exists() and (out / PARTIAL_DIR / "checkpoint-4").is_dir()
    assert [r["step"] for r in read_records(out)] == [2]

    fsdp_launch(workdir, out, *args, "train.resume_from_checkpoint=true")
    for name in ("checkpoint-2", "checkpoint-4"):
        assert_same_weights(fsdp_run / name / "model.safetensors", out / name / "model.safetensors", rtol=0, atol=0)
    assert logged_losses(out / "checkpoint-4") == logged_losses(fsdp_run / "checkpoint-4")
    assert acceptance(out) == acceptance(fsdp_run)
    assert_exported_best(out)
    assert not (out / PARTIAL_DIR).exists() or not any((out / PARTIAL_DIR).iterdir())


# ---------------------------------------------------------------------------------------------------------------
# Training rows and drafts under FSDP2: as under one process / DDP
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.integration
def test_fsdp2_lora_draft_with_target_responses_and_teacher_cache_matches_one_process(workdir):
    """A LoRA draft trained on the dataset mixed with the target's responses, with the target's top-k cached: the
    main process generates both before the target is sharded; 2 processes x 3 rows = 1 process x 6 rows."""
    def extra(name: str) -> tuple[str, ...]:
        return ("lora.enabled=true", "lora.r=4", "data.target_weight=1", f"data.target_data_dir={workdir / name}_td",
                "data.target_max_new_tokens=8", f"distill.teacher_cache={workdir / name}_cache",
                f"distill.teacher_topk={VOCAB}")
    one = run_train(workdir, "lora_one", *run_args(workdir, "train.per_device_train_batch_size=6", *extra("one")))
    two = fsdp_launch(workdir, workdir / "lora_fsdp",
                      *run_args(workdir, "train.per_device_train_batch_size=3", *extra("two")))
    assert logged_losses(two / "checkpoint-4") == pytest.approx(logged_losses(one / "checkpoint-4"), rel=2e-5)
    for name in ("checkpoint-2", "checkpoint-4"):
        assert_same_weights(one / name / "adapter_model.safetensors", two / name / "adapter_model.safetensors")
    assert acceptance(two) == acceptance(one)
    # generated by each run's main process: the same responses; the same top-k (float16 log-probs of batches of
    # 3 rows there and 6 here: equal up to one float16 step)
    responses = [stored_rows(workdir / f"{name}_td") for name in ("two", "one")]
    assert responses[0] == responses[1] and len(responses[0]) > 0
    ours, theirs = (stored_rows(workdir / f"{name}_cache") for name in ("two", "one"))
    assert [r["topk_ids"] for r in ours] == [r["topk_ids"] for r in theirs] and len(ours) > len(responses[0])
    for mine, other in zip(ours, theirs):
        torch.testing.assert_close(torch.tensor(mine["topk_logprobs"]), torch.tensor(other["topk_logprobs"]),
                                   rtol=1e-3, atol=1e-3)
    assert not (two / "adapter_config.json").exists()  # the export is merged, as under DDP
    assert_same_weights(one / "model.safetensors", two / "model.safetensors")


@pytest.mark.integration
def test_fsdp2_on_policy_rows_match_ddp(workdir, tmp_path):
    """On-policy rows (each process samples its own, from a whole copy of the draft) give the same run as DDP."""
    args = run_args(workdir, "train.per_device_train_batch_size=3", "distill.on_policy_fraction=0.5",
                    "distill.on_policy_max_new_tokens=6", "data.num_eval_prompts=0")
    ddp = tmp_path / "ddp"
    accelerate_launch(ROOT / "scripts" / "train.py", TINY_RECIPE, f"model.target={workdir / 'target'}",
                      f"train.output_dir={ddp}", *args, timeout=240)
    fsdp = fsdp_launch(workdir, tmp_path / "fsdp", *args)
    history = [json.loads((f / "checkpoint-4" / "trainer_state.json").read_text())["log_history"]
               for f in (ddp, fsdp)]
    shares = [[e["on_policy"] for e in h if "on_policy" in e] for h in history]
    assert shares[0] == shares[1] and len(shares[0]) == 4 and 0 < sum(shares[0]) < 4
    assert logged_losses(fsdp / "checkpoint-4") == pytest.approx(logged_losses(ddp / "checkpoint-4"), rel=2e-5)
    assert_same_weights(ddp / "model.safetensors", fsdp / "model.safetensors")


# Any nn.Module (a hidden-state draft head, not a transformers model): sharded, run, copied whole on rank 0 and
# on every rank, each copy of its own class and equal to the module before sharding.
GENERIC_MODULE = textwrap.dedent("""
    import torch, torch.distributed as dist
    from torch import nn
    from distill.models.fsdp import is_sharded, local_copy, shard_for_inference, whole_copy

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
        def forward(self, x):
            return x + torch.tanh(self.fc(x))

    class Head(nn.Module):
        _no_split_modules = ["Block"]  # one FSDP unit per Block
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block(), Block()])
            self.norm, self.out = nn.LayerNorm(8), nn.Linear(8, 11, bias=False)
            self.register_buffer("scale", torch.tensor(2.0), persistent=False)  # in no state dict
        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.out(self.norm(x) * self.scale)

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    head, x = Head(), torch.randn(3, 8)
    expected = head(x).detach()
    shard_for_inference(head, torch.device("cpu"))
    assert is_sharded(head) and all(is_sharded(block) for block in head.blocks)
    with torch.no_grad():
        torch.testing.assert_close(head(x), expected)  # every rank runs the forward
    whole = whole_copy(head)
    if dist.get_rank() == 0:
        assert type(whole) is Head and not is_sharded(whole)
        torch.testing.assert_close(whole(x), expected)
    else:
        assert whole is None
    local = local_copy(head)
    assert type(local) is Head and not is_sharded(local)
    torch.testing.assert_close(local(x), expected)
    dist.destroy_process_group()
""")


@pytest.mark.integration
def test_the_fsdp_launch_line_on_cpu_processes_refuses_in_one_line_before_loading(workdir, tmp_path):
    """The launch line of the docs, as a user types it (no wrapper), on 2 CPU processes: accelerate does not shard the
    draft there, so the run stops before anything loads, with one line naming the launch that works."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(FSDP_CONFIG),
               "--num_processes", "2", str(ROOT / "scripts" / "train.py"), TINY_RECIPE,
               f"model.target={workdir / 'target'}", f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={out}"]
    done = subprocess.run(command, env={**os.environ, **CHILD_ENV, "ACCELERATE_USE_CPU": "true"}, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    ours = [line for line in done.stderr.splitlines() if "specdistill-train: error:" in line]
    assert ours and "FSDP2 needs GPUs: accelerate applies its FSDP plugin to GPU processes only" in ours[0], \
        done.stderr[-3000:]
    assert "ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2" in ours[0]
    assert "distill/" not in done.stderr  # no frame of ours: one line (the launcher's own report of the exit follows)
    assert not out.exists()  # nothing loaded, nothing written


@pytest.mark.integration
def test_any_module_is_sharded_and_copied_whole(tmp_path):
    script = tmp_path / "generic_module.py"
    script.write_text(GENERIC_MODULE)
    torchrun(script, timeout=120)


# ---------------------------------------------------------------------------------------------------------------
# Fast: the launch settings, the layout of whole copies
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("variable, value, setting", [
    ("FSDP_VERSION", "1", "fsdp_version: 2"),
    ("FSDP_STATE_DICT_TYPE", "FULL_STATE_DICT", "fsdp_state_dict_type: SHARDED_STATE_DICT"),
    ("FSDP_CPU_RAM_EFFICIENT_LOADING", "true", "fsdp_cpu_ram_efficient_loading: false"),
])
def test_fsdp_settings_other_than_the_shipped_ones_are_refused(monkeypatch, variable, value, setting):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    for name, shipped in (("FSDP_VERSION", "2"), ("FSDP_STATE_DICT_TYPE", "SHARDED_STATE_DICT"),
                          ("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")):
        monkeypatch.setenv(name, shipped)
    mode = types.SimpleNamespace(deepspeed_plugin=None, fsdp="")
    check_device_mode(mode)  # the shipped settings: accepted
    monkeypatch.setenv(variable, value)
    with pytest.raises(UnsupportedModeError, match=f"FSDP needs {setting}.*got {value}"):
        check_device_mode(mode)


def test_remembered_layout_has_meta_weights_and_real_buffers():
    model = tiny_model("llama", layers=1)
    remember_layout(model)
    layout = model.__dict__[LAYOUT]
    assert type(layout) is type(model) and LAYOUT not in dict(model.named_modules())
    assert all(p.is_meta for p in layout.parameters())
    assert all(not b.is_meta for b in layout.buffers())  # rotary frequencies: not in any state dict
    assert [n for n, _ in layout.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert not any(key.startswith(LAYOUT) for key in model.state_dict())  # the layout is not a submodule
    remember_layout(model, keep_weights=True)  # already kept: unchanged
    assert model.__dict__[LAYOUT] is layout


def test_plain_class_sees_through_fully_shard():
    from torch.distributed.fsdp import FSDPModule

    linear = torch.nn.Linear(2, 2)
    linear.__class__ = type("FSDPLinear", (FSDPModule, torch.nn.Linear), {})  # what fully_shard does
    assert plain_class(linear) is torch.nn.Linear
    assert plain_class(torch.nn.Linear(2, 2)) is torch.nn.Linear
