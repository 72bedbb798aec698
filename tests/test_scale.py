"""Scaling the training: LoRA drafts (peft), mixed precision and gradient checkpointing keys, the accelerate launch
configs, and DeepSpeed ZeRO-3 with a sharded target.

Integration tests (marked) run specdistill.cli.train.main() in this process on tiny models saved to a temporary folder,
and one 2-process ZeRO-3 launch (gloo on CPU). The ZeRO-2 = DDP = one-process equivalence lives in
tests/test_trainer.py.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
import types
from pathlib import Path
from unittest import mock

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from transformers.models.llama import modeling_llama

from distill.models import load
from distill.models.distributed import UnsupportedModeError, check_device_mode, plain_copy, zero3_inference_config
from distill.models.load import ModelSetupError
from distill.models.lora import apply_lora, is_lora
from distill.publish.export import export_draft
from distill.recipe.sections import check_precision
from kinds import STANDALONE
from specdistill.cli import train as train_script
from specdistill.recipes import LoraConfig, RecipeError, TrainConfig, load_recipe

from helpers import ROOT, SMOOTH_LOSS, TINY_RECIPE, assert_same_weights, run_process, run_train, torchrun
from tiny import TINY_TEXT, tiny_model, tiny_tokenizer

ACCELERATE = ROOT / "recipes" / "accelerate"
VOCAB = 320
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
# short runs on the packed text, nothing measured
QUICK = ("data.num_eval_prompts=0", "train.max_steps=2", "train.logging_steps=1", "train.save_steps=2",
         "train.report_to=[]")


# ---------------------------------------------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """target/ (tiny Llama + tokenizer with a chat template), draft/ (a pre-trained 1-layer draft: layer 1 of the
    target, perturbed), code.txt and chat.jsonl."""
    root = tmp_path_factory.mktemp("scale")
    tokenizer = tiny_tokenizer(VOCAB)
    tokenizer.chat_template = CHAT_TEMPLATE
    target = tiny_model("llama", vocab_size=VOCAB, hidden=64, layers=2)
    target.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    draft = tiny_model("llama", seed=3, vocab_size=VOCAB, hidden=64, layers=1)
    draft.save_pretrained(root / "draft")
    tokenizer.save_pretrained(root / "draft")
    (root / "code.txt").write_text(TINY_TEXT)
    blocks = TINY_TEXT.split("\n\n")[:4]
    rows = [{"messages": [{"role": "user", "content": f"show {i}"},
                          {"role": "assistant", "content": "\n".join(blocks[: 1 + i % 4])}]} for i in range(36)]
    (root / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def run(workdir: Path, out: str, *overrides: str) -> Path:
    """specdistill.cli.train.main() on the tiny recipe with the pre-trained draft, in this process."""
    return run_train(workdir, out, "model.draft_config=null", f"model.draft={workdir / 'draft'}", *overrides)


def logged_losses(checkpoint: Path) -> list[float]:
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    return [entry["loss"] for entry in history if "loss" in entry]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------------------------------------------
# The lora section
# ---------------------------------------------------------------------------------------------------------------

def test_lora_defaults_and_recipe_keys(tmp_path):
    cfg = LoraConfig()
    assert (cfg.enabled, cfg.r, cfg.alpha, cfg.dropout) == (False, 16, 32.0, 0.0)
    assert cfg.target_modules == list(ATTENTION) and cfg.modules_to_save is None
    recipe = load_recipe(write(tmp_path, "model: {target: t, draft: d}\ndata: {dataset: x.txt}\n"
                                         "lora: {enabled: true, r: 8, alpha: 16, target_modules: all-linear}\n"),
                         ["lora.modules_to_save=[lm_head]"])
    assert recipe.lora == LoraConfig(enabled=True, r=8, alpha=16.0, target_modules="all-linear",
                                     modules_to_save=["lm_head"])


@pytest.mark.parametrize("override, key, allowed", [
    ("lora.r=0", "lora.r", "> 0"),
    ("lora.alpha=-1", "lora.alpha", "> 0"),
    ("lora.dropout=1.0", "lora.dropout", "[0, 1)"),
    ("lora.target_modules=all_linear", "lora.target_modules", "'all-linear'"),
    ("lora.target_modules=[]", "lora.target_modules", "non-empty list"),
    ("lora.modules_to_save=[]", "lora.modules_to_save", "a non-empty list of non-empty strings or null"),
    ("lora.alhpa=4", "lora.alhpa", "did you mean 'lora.alpha'"),
])
def test_bad_lora_keys_are_named(tmp_path, override, key, allowed):
    with pytest.raises(RecipeError) as err:
        load_recipe(write(tmp_path, "model: {target: t, draft: d}\ndata: {dataset: x.txt}\n"), [override])
    assert key in str(err.value) and allowed in str(err.value)


def test_lora_on_a_draft_from_scratch_is_refused_naming_the_file(tmp_path):
    path = write(tmp_path, "model: {target: t, draft_config: {num_hidden_layers: 1}}\ndata: {dataset: x.txt}\n"
                           "lora: {enabled: true}\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert (str(err.value).startswith(f"{path}:3: lora.enabled")
            and "model.draft or model.draft_layers" in str(err.value))


# ---------------------------------------------------------------------------------------------------------------
# LoRA on the draft: peft wrapping, merged copies
# ---------------------------------------------------------------------------------------------------------------

def test_only_the_adapters_train():
    draft = apply_lora(tiny_model("llama", layers=2).requires_grad_(True), LoraConfig(enabled=True, r=4))
    trainable = {name for name, p in draft.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name in trainable)
    assert {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in trainable} == set(ATTENTION)
    saved = apply_lora(tiny_model("llama", layers=1).requires_grad_(True),
                       LoraConfig(enabled=True, r=4, target_modules="all-linear", modules_to_save=["lm_head"]))
    names = {name for name, p in saved.named_parameters() if p.requires_grad}
    assert any("lm_head.modules_to_save" in name for name in names) and any("mlp.up_proj.lora_A" in n for n in names)
    assert not any("lm_head.lora" in name for name in names)  # all-linear leaves the output layer alone


def test_unknown_lora_module_names_the_key_and_the_choices():
    with pytest.raises(ModelSetupError, match=r"lora\.target_modules: 'qproj' .* did you mean 'q_proj'\?"):
        apply_lora(tiny_model("llama"), LoraConfig(enabled=True, target_modules=["qproj"]))
    with pytest.raises(ModelSetupError, match=r"lora\.target_modules: 'q_proj' names no linear layer .*c_attn"):
        apply_lora(tiny_model("gpt2"), LoraConfig(enabled=True))
    with pytest.raises(ModelSetupError, match=r"lora\.modules_to_save: 'lm_heads'"):
        apply_lora(tiny_model("llama"), LoraConfig(enabled=True, modules_to_save=["lm_heads"]))


def test_plain_copy_merges_the_adapters_and_leaves_the_draft_alone():
    draft = apply_lora(tiny_model("llama", layers=2), LoraConfig(enabled=True, r=4, alpha=8))
    with torch.no_grad():  # B = 0 at the start: give the adapters something to merge
        for name, param in draft.named_parameters():
            if ".lora_B." in name:
                param.normal_(std=0.5)
    ids = torch.tensor([[1, 5, 9, 7, 3, 8]])
    merged = plain_copy(draft.eval())
    assert type(merged) is modeling_llama.LlamaForCausalLM and not is_lora(merged) and is_lora(draft)
    torch.testing.assert_close(merged(ids).logits, draft(ids).logits, rtol=1e-4, atol=1e-4)
    with draft.disable_adapter():
        assert not torch.allclose(merged(ids).logits, draft(ids).logits, atol=1e-3)  # the adapters are in the copy
    assert any(".lora_A." in name for name, _ in draft.named_parameters())  # the original keeps its adapters


# ---------------------------------------------------------------------------------------------------------------
# Mixed precision and gradient checkpointing keys
# ---------------------------------------------------------------------------------------------------------------

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")


@cpu_only
def test_fp16_on_cpu_is_refused_naming_the_key():
    with pytest.raises(RecipeError, match=r"train\.fp16: got true on a CPU-only run.*silently train in float32"):
        check_precision(TrainConfig(fp16=True))


@cpu_only
def test_bf16_without_a_bf16_gpu_is_refused_naming_the_key():
    with pytest.raises(RecipeError, match=r"train\.bf16: got true without a bfloat16-capable GPU"):
        check_precision(TrainConfig(bf16=True))
    check_precision(TrainConfig())  # neither: fine everywhere


def test_forced_cpu_refuses_fp16_even_with_a_gpu(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    with pytest.raises(RecipeError, match=r"train\.fp16"):
        check_precision(TrainConfig(fp16=True))


@cpu_only
def test_cli_names_fp16_before_any_weights_load(monkeypatch, capsys, workdir):
    monkeypatch.setattr(load, "load_target", lambda *a: pytest.fail("weights were loaded"))
    monkeypatch.setattr(sys, "argv", ["specdistill-train", TINY_RECIPE, f"model.target={workdir / 'target'}",
                                      f"data.dataset={workdir / 'code.txt'}", "train.fp16=true"])
    with pytest.raises(SystemExit) as exit_info:
        train_script.cli()
    assert exit_info.value.code == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("specdistill-train: error: train.fp16: got true on a CPU-only run"), last


@pytest.mark.integration
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_gradient_checkpointing_recomputes_the_draft_and_changes_nothing(workdir, monkeypatch, lora):
    """One step each way: with checkpointing every draft layer runs twice per micro-batch (forward + recompute in
    the backward; counted at its MLP, inside the checkpointed layer), and the loss and updated weights are the same."""
    calls = []
    original = modeling_llama.LlamaMLP.forward

    def counting(self, *args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", counting)
    extra = ("lora.enabled=true", "lora.r=4") if lora else ()
    runs = {}
    for checkpointing in (False, True):
        calls.clear()
        out = run(workdir, f"gc_{lora}_{checkpointing}", *QUICK, "train.max_steps=1", "train.save_steps=1",
                  f"train.activation_checkpointing={str(checkpointing).lower()}", *extra)
        runs[checkpointing] = (len(calls), logged_losses(out / "checkpoint-1"), load_file(out / "model.safetensors"))
    (plain_calls, plain_loss, plain_weights), (gc_calls, gc_loss, gc_weights) = runs[False], runs[True]
    assert gc_calls == plain_calls + 1  # 1 micro-batch x 1 draft layer recomputed (the target is never)
    assert gc_loss == pytest.approx(plain_loss, rel=1e-6)
    for key in plain_weights:
        torch.testing.assert_close(gc_weights[key], plain_weights[key], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# LoRA end to end
# ---------------------------------------------------------------------------------------------------------------

LOAD_WITHOUT_PEFT = textwrap.dedent("""
    import sys
    sys.modules["peft"] = None  # any `import peft` now fails
    import torch
    from transformers import AutoModelForCausalLM
    draft = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
    target = AutoModelForCausalLM.from_pretrained(sys.argv[2]).eval()
    prompt = torch.tensor([[1, 50, 60, 70]])
    plain = target.generate(prompt, do_sample=False, max_new_tokens=12, pad_token_id=0)
    assisted = target.generate(prompt, assistant_model=draft, do_sample=False, max_new_tokens=12, pad_token_id=0)
    assert torch.equal(plain, assisted), (plain, assisted)
    assert "peft" not in {m.split(".")[0] for m, v in sys.modules.items() if v is not None}
    print(type(draft).__name__, draft.generation_config.num_assistant_tokens)
""")


@pytest.mark.integration
def test_lora_draft_trains_adapters_and_exports_a_plain_model(workdir, tmp_path):
    out = run(workdir, "lora", "lora.enabled=true", "lora.r=4", "lora.alpha=8", "train.max_steps=6",
              "train.save_steps=3", "train.learning_rate=1e-2", "train.report_to=[]", "data.num_eval_prompts=2",
              "eval.gammas=[2]", "eval.max_new_tokens=8")
    summary = json.loads((out / "train_results.json").read_text())["best"]
    records = [json.loads(line) for line in (out / "acceptance.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in records}) == [3, 6] and all(r["greedy_match"] == 1.0 for r in records)

    # checkpoints hold adapters only (what Trainer saves for a peft model)
    checkpoint = out / summary["checkpoint"]
    adapters = load_file(checkpoint / "adapter_model.safetensors")
    assert (checkpoint / "adapter_config.json").is_file() and not (checkpoint / "model.safetensors").exists()
    assert adapters and all(".lora_A." in k or ".lora_B." in k for k in adapters)

    # OUTPUT_DIR: a plain model; only the adapted linear layers differ from the draft we started from
    assert not (out / "adapter_config.json").exists() and not (out / "adapter_model.safetensors").exists()
    exported, base = load_file(out / "model.safetensors"), load_file(workdir / "draft" / "model.safetensors")
    assert set(exported) == set(base)
    changed = {k for k in base if not torch.equal(exported[k], base[k])}
    assert changed and all(k.split(".")[-2] in ATTENTION for k in changed), changed
    # ... and equal to the best checkpoint's adapters merged by peft itself: W + (alpha / r) B A
    from peft import PeftModel
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(workdir / "draft"), checkpoint)
    for key, value in reference.merge_and_unload().state_dict().items():
        torch.testing.assert_close(exported[key], value, rtol=1e-6, atol=1e-6)

    # loads and drafts for transformers' assisted generation with peft unimportable
    done = run_process([sys.executable, "-c", LOAD_WITHOUT_PEFT, str(out), str(workdir / "target")], timeout=120)
    assert done.stdout.split()[-2:] == ["LlamaForCausalLM", str(summary["gamma"])]


@pytest.mark.integration
def test_lora_run_resumes_from_its_adapter_checkpoint(workdir):
    common = (*QUICK, "train.max_steps=4", "train.save_steps=2", "train.save_total_limit=null", "lora.enabled=true",
              "lora.r=4", "train.learning_rate=1e-2", "train.lr_scheduler_type=cosine")
    whole = run(workdir, "lora_whole", *common)
    resumed = workdir / "lora_resumed"
    resumed.mkdir()
    shutil.copytree(whole / "checkpoint-2", resumed / "checkpoint-2")  # interrupted after step 2
    run(workdir, "lora_resumed", *common, "train.resume_from_checkpoint=true")
    assert logged_losses(resumed / "checkpoint-4") == pytest.approx(logged_losses(whole / "checkpoint-4"), rel=1e-5)
    assert_same_weights(whole / "model.safetensors", resumed / "model.safetensors")


def test_export_of_a_final_lora_draft_is_merged(tmp_path):
    draft = apply_lora(tiny_model("llama", vocab_size=VOCAB, layers=1), LoraConfig(enabled=True, r=2))
    summary = export_draft(tmp_path, None, draft, tiny_tokenizer(VOCAB), default_gamma=3, kind=STANDALONE)
    assert summary == {"checkpoint": "final", "step": None, "gamma": 3}
    assert not (tmp_path / "adapter_config.json").exists() and is_lora(draft)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(exported) is modeling_llama.LlamaForCausalLM
    assert exported.generation_config.num_assistant_tokens == 3


# ---------------------------------------------------------------------------------------------------------------
# accelerate launch configs
# ---------------------------------------------------------------------------------------------------------------

# file -> (distributed_type, zero_stage, offload device for optimizer and params)
LAUNCH_CONFIGS = {
    "ddp.yaml": ("MULTI_GPU", None, None),
    "single_process.yaml": ("NO", None, None),
    "deepspeed_zero2.yaml": ("DEEPSPEED", 2, "none"),
    "deepspeed_zero3.yaml": ("DEEPSPEED", 3, "none"),
    "deepspeed_zero3_offload.yaml": ("DEEPSPEED", 3, "cpu"),
    "fsdp.yaml": ("FSDP", None, None),
}


def test_every_accelerate_config_is_listed_here():
    assert sorted(p.name for p in ACCELERATE.glob("*.yaml")) == sorted(LAUNCH_CONFIGS)


@pytest.mark.parametrize("name", sorted(LAUNCH_CONFIGS))
def test_accelerate_config_keys_and_header(name):
    distributed_type, stage, offload = LAUNCH_CONFIGS[name]
    path = ACCELERATE / name
    text = path.read_text()
    assert text.startswith("#") and f"accelerate launch --config_file recipes/accelerate/{name} scripts/train.py" \
        in text
    config = yaml.safe_load(text)
    assert config["distributed_type"] == distributed_type and config["num_machines"] == 1
    assert config["mixed_precision"] == "no"  # precision is the recipe's (train.bf16 / train.fp16)
    deepspeed = config.get("deepspeed_config", {})
    assert deepspeed.get("zero_stage") == stage
    if stage is not None:
        assert deepspeed["offload_optimizer_device"] == offload
        assert deepspeed["offload_param_device"] == (offload if stage == 3 else "none")
    if stage == 3:
        assert deepspeed["zero3_init_flag"] is True and deepspeed["zero3_save_16bit_model"] is True
    if distributed_type == "FSDP":
        fsdp = config["fsdp_config"]
        assert fsdp["fsdp_version"] == 2 and fsdp["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
        assert fsdp["fsdp_cpu_ram_efficient_loading"] is False


@pytest.mark.parametrize("name", sorted(LAUNCH_CONFIGS))
def test_accelerate_config_as_launched_meets_check_device_mode(name):
    """Parse the file the way `accelerate launch` does, give this process the environment it would get, and ask
    check_device_mode: every shipped mode is accepted."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    args, defaults, _ = _validate_launch_command(
        launch_command_parser().parse_args(["--config_file", str(ACCELERATE / name), "scripts/train.py"]))
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
        _, env = prepare_deepspeed_cmd_env(args)
    elif args.multi_gpu or args.use_fsdp:
        env = prepare_multi_gpu_env(args)
    else:
        env = {}
    env = {k: v for k, v in env.items() if k.startswith(("ACCELERATE_USE_", "ACCELERATE_DEEPSPEED_", "FSDP_"))}
    with mock.patch.dict(os.environ, env):
        plugin = DeepSpeedPlugin() if env.get("ACCELERATE_USE_DEEPSPEED") == "true" else None
        mode = types.SimpleNamespace(deepspeed_plugin=plugin, fsdp="")
        check_device_mode(mode)
        assert (plugin.zero_stage if plugin else None) == LAUNCH_CONFIGS[name][1]


def test_zero3_without_whole_weights_in_checkpoints_is_refused(monkeypatch):
    from accelerate.utils import DeepSpeedPlugin
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", "false")
    with pytest.raises(UnsupportedModeError, match="zero3_save_16bit_model: true"):
        check_device_mode(types.SimpleNamespace(deepspeed_plugin=DeepSpeedPlugin(), fsdp=""))


# ---------------------------------------------------------------------------------------------------------------
# DeepSpeed ZeRO-3: the target sharded for inference
# ---------------------------------------------------------------------------------------------------------------

def test_zero3_inference_config_drops_training_state_and_fills_autos():
    train_config = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_clipping": 1.0,
                    "optimizer": {"type": "AdamW"}, "scheduler": {"type": "WarmupLR"}, "bf16": {"enabled": "auto"},
                    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                          "offload_param": {"device": "cpu"}, "reduce_bucket_size": "auto",
                                          "stage3_param_persistence_threshold": 7}}
    before = json.dumps(train_config, sort_keys=True)
    config = zero3_inference_config(train_config, hidden_size=64, dtype=torch.bfloat16)
    assert json.dumps(train_config, sort_keys=True) == before  # the training config is not changed
    assert "optimizer" not in config and "scheduler" not in config and "train_batch_size" not in config
    assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}
    zero = config["zero_optimization"]
    assert "offload_optimizer" not in zero and zero["offload_param"] == {"device": "cpu"}
    assert zero["reduce_bucket_size"] == 64 * 64 and zero["stage3_prefetch_bucket_size"] == int(0.9 * 64 * 64)
    assert zero["stage3_param_persistence_threshold"] == 7  # set by the user: kept


# DeepSpeed on CPU needs gloo named before TrainingArguments (shared/ENVIRONMENT.md); on GPUs
# `accelerate launch --config_file recipes/accelerate/deepspeed_zero3.yaml` needs none of this.
ZERO3_ON_CPU = textwrap.dedent("""
    import functools, os, sys
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    from accelerate import PartialState
    PartialState(backend="gloo")
    import distill.recipe.train_config
    zero = {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}
    config = {"zero_optimization": zero, "train_micro_batch_size_per_gpu": "auto",
              "gradient_accumulation_steps": "auto", "train_batch_size": "auto", "gradient_clipping": "auto"}
    distill.recipe.train_config.TrainingArguments = functools.partial(
        distill.recipe.train_config.TrainingArguments, accelerator_config={"use_configured_state": True},
        deepspeed=config)
    from specdistill.cli import train
    from distill.models import load
    loaded = load.load_target
    def checked(cfg):  # every process holds only its partition of the target
        target = loaded(cfg)
        assert load.is_partitioned(target), "the target is not partitioned"
        whole = sum(p.ds_numel for p in target.parameters())
        assert sum(p.ds_tensor.numel() for p in target.parameters()) < 0.6 * whole
        return target
    load.load_target = checked
    train.cli(sys.argv[1:])  # as scripts/train.py: a finished process leaves before the teardown (launch.py)
""")

ZERO3_RUN = ("data.dataset={chat}", "data.format=chat", "data.max_length=48", "data.num_eval_prompts=2",
             "eval.gammas=[2]", "eval.max_new_tokens=8", "model.draft=null", "model.draft_config=null",
             "model.draft_layers=[1]",
             "train.max_steps=4", "train.logging_steps=1", "train.save_steps=3", "train.learning_rate=3e-3",
             "train.report_to=[]", SMOOTH_LOSS)


@pytest.mark.integration
def test_zero3_on_two_processes_matches_one_process(workdir, tmp_path):
    """2 processes x 3 rows under ZeRO-3 (draft and target sharded) = 1 process x 6 rows: the same losses, the same
    checkpoints, the same acceptance at each checkpoint (measured on gathered copies), the same export; the last
    step is saved (the export reads whole weights from it)."""
    args = [a.format(chat=workdir / "chat.jsonl") for a in ZERO3_RUN]
    reference = run(workdir, "zero3_reference", *args, "train.per_device_train_batch_size=6")
    launcher = tmp_path / "zero3_on_cpu.py"
    launcher.write_text(ZERO3_ON_CPU)
    out = tmp_path / "zero3"
    torchrun(launcher, TINY_RECIPE, f"model.target={workdir / 'target'}", f"train.output_dir={out}", *args,
             "train.per_device_train_batch_size=3", timeout=240)

    assert logged_losses(out / "checkpoint-4") == pytest.approx(logged_losses(reference / "checkpoint-4"), rel=2e-5)

    for name in ("checkpoint-3", "checkpoint-4"):
        assert_same_weights(reference / name / "model.safetensors", out / name / "model.safetensors")

    def acceptance(folder: Path) -> list[tuple]:
        lines = (folder / "acceptance.jsonl").read_text().splitlines()
        return [(r["step"], r["acceptance_rate"], r["per_position_acceptance"]) for r in map(json.loads, lines)]

    assert [step for step, *_ in acceptance(out)] == [3, 4]
    assert acceptance(out) == acceptance(reference)
    # the best checkpoint is chosen by measured (wall-clock) speedup, so each run may pick either one: the export
    # must be exactly the one its own run picked
    best = json.loads((out / "train_results.json").read_text())["best"]
    assert best["checkpoint"] in ("checkpoint-3", "checkpoint-4")
    assert_same_weights(out / best["checkpoint"] / "model.safetensors", out / "model.safetensors")
