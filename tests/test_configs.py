"""Recipes: every shipped one loads with the command its header gives; bad keys, types and ranges are named."""
from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest
import yaml

from distill.recipe.loader import parse_override, recipe_to_dict, save_recipe, with_overrides
from distill.recipe.train_config import (
    LEFT_TO_OTHERS,
    SET_BY_THE_RUN,
    TRAINING_ARGUMENTS_CHANGES,
    RunFolderKeys,
    installed_names,
    training_arguments,
)
from specdistill.recipes import (
    OVERRIDE_SOURCE,
    SECTION_TYPES,
    DistillConfig,
    Recipe,
    RecipeError,
    TrainConfig,
    load_recipe,
    reference_markdown,
)

ROOT = Path(__file__).resolve().parents[1]
# every training recipe, in sub-folders too (recipes/accelerate/ holds accelerate launch configs, not recipes)
RECIPES = sorted(p for p in (ROOT / "recipes").rglob("*.yaml") if "accelerate" not in p.relative_to(ROOT).parts)
README = ROOT / "recipes" / "README.md"
BEGIN, END = "<!-- BEGIN RECIPE KEYS (python -m specdistill.recipes) -->", "<!-- END RECIPE KEYS -->"


def header_command(path: Path) -> list[str]:
    """The arguments after scripts/train.py in the recipe's opening comment (lines ending in \\ continue)."""
    comments = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        comments.append(line.lstrip("#").strip())
    text = "\n".join(comments).replace("\\\n", " ")
    for line in text.splitlines():
        if "scripts/train.py" in line:
            words = shlex.split(line)
            return words[words.index("scripts/train.py") + 1:]
    raise AssertionError(f"{path.name} does not open with a comment giving the command that runs it")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


MINIMAL = "model:\n  target: t\n  draft: d\ndata:\n  dataset: data.txt\n"


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_shipped_recipe_loads_with_its_header_command(path):
    args = header_command(path)
    assert args[0] == str(path.relative_to(ROOT))
    recipe = load_recipe(path, args[1:])
    assert isinstance(recipe, Recipe)
    assert recipe.model.target and recipe.data.dataset
    # the resolved recipe round-trips through YAML (its values: which of them a draft kind supplied is not part of
    # the dump, where every value is explicit)
    assert recipe_to_dict(load_recipe_from_dict(recipe)) == recipe_to_dict(recipe)


def load_recipe_from_dict(recipe: Recipe) -> Recipe:
    from specdistill.recipes import build_recipe
    return build_recipe(yaml.safe_load(yaml.safe_dump(recipe_to_dict(recipe))))


def test_accelerate_configs_are_yaml_with_a_command():
    for name in ("ddp.yaml", "single_process.yaml"):
        path = ROOT / "recipes" / "accelerate" / name
        assert "accelerate launch --config_file recipes/accelerate/" + name in path.read_text()
        assert yaml.safe_load(path.read_text())["num_machines"] == 1


def test_defaults_live_in_the_dataclasses(tmp_path):
    recipe = load_recipe(write(tmp_path, MINIMAL))
    assert recipe.distill == DistillConfig()
    assert recipe.train.report_to == ["tensorboard"] and recipe.eval.gammas == [1, 2, 4]
    assert recipe.eval.temperatures == [0.0] and recipe.hub.push_to_hub is False
    # mutable defaults are not shared between instances
    assert TrainConfig().report_to is not TrainConfig().report_to


def test_unknown_key_names_key_file_and_closest_valid_key(tmp_path):
    path = write(tmp_path, MINIMAL + "train:\n  learning_rat: 0.1\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    message = str(err.value)
    assert "train.learning_rat" in message and str(path) in message and "train.learning_rate" in message


def test_unknown_section_is_named_with_a_suggestion(tmp_path):
    with pytest.raises(RecipeError, match=r"distil.*did you mean 'distill'"):
        load_recipe(write(tmp_path, MINIMAL + "distil:\n  loss: tv\n"))


@pytest.mark.parametrize("line, key, allowed", [
    ("train:\n  max_steps: ten\n", "train.max_steps", "an integer"),
    ("train:\n  bf16: 'yes'\n", "train.bf16", "true/false"),
    ("eval:\n  gammas: 4\n", "eval.gammas", "a non-empty list of integers > 0 or 'auto'"),
    ("model:\n  target: t\n  draft: d\n  target_dtype: fp8\n", "model.target_dtype", "'bfloat16'"),
])
def test_wrong_type_names_key_file_value_and_allowed(tmp_path, line, key, allowed):
    text = line + "data:\n  dataset: x.txt\n" if line.startswith("model") else MINIMAL + line
    path = write(tmp_path, text)
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    message = str(err.value)
    assert key in message and str(path) in message and allowed in message and "got" in message


@pytest.mark.parametrize("override, key, allowed", [
    ("train.learning_rate=-1", "train.learning_rate", "> 0"),
    ("distill.beta=1.5", "distill.beta", "[0, 1]"),
    ("distill.loss=kl", "distill.loss", "forward_kl"),
    ("eval.gammas=[0, 2]", "eval.gammas", "> 0"),
    ("train.warmup_steps=-0.5", "train.warmup_steps", ">= 0"),
    ("lora.dropout=1.0", "lora.dropout", "[0, 1)"),
    ("data.max_length=1", "data.max_length", ">= 2"),
    ("model.draft_layers=[0, 2]", "model.draft", "exactly one of"),
    ("hub.push_to_hub=true", "hub.repo_id", "hub repository id"),
])
def test_out_of_range_is_named_as_an_override(tmp_path, override, key, allowed):
    with pytest.raises(RecipeError) as err:
        load_recipe(write(tmp_path, MINIMAL), [override])
    assert key in str(err.value) and allowed in str(err.value)


def test_out_of_range_in_file_names_the_file(tmp_path):
    path = write(tmp_path, MINIMAL + "distill:\n  temperature: 0\n")
    expected = f"{path}:7: distill.temperature: got 0; allowed: a finite number > 0"
    with pytest.raises(RecipeError, match=re.escape(expected)):
        load_recipe(path)


def test_a_placeholder_left_empty_says_to_give_it_on_the_command_line():
    """The shipped recipes leave model.target (and data.dataset) as "" for the command line: run without it, the
    line names the file's line and the override to add."""
    recipe = Path(__file__).parents[1] / "recipes" / "smollm2" / "eagle3.yaml"
    with pytest.raises(RecipeError, match=re.escape(f"{recipe}:") + r"\d+: " + re.escape(
            "model.target: got '' (the recipe leaves it to the command line: add model.target=...); allowed: a "
            "non-empty string")):
        load_recipe(recipe)


def test_override_error_names_the_command_line(tmp_path):
    with pytest.raises(RecipeError) as err:
        load_recipe(write(tmp_path, MINIMAL), ["train.learning_rate=-1"])
    assert str(err.value).startswith(OVERRIDE_SOURCE)


def test_overrides_parse_values_as_yaml(tmp_path):
    recipe = load_recipe(write(tmp_path, MINIMAL), [
        "train.learning_rate=1e-4", "train.max_steps=7", "eval.gammas=[2, 3]", "train.bf16=true",
        "model.draft=null", "model.draft_config.num_hidden_layers=1", "train.report_to=[]", "hub.repo_id=a/b"])
    assert recipe.train.learning_rate == pytest.approx(1e-4) and isinstance(recipe.train.learning_rate, float)
    assert recipe.train.max_steps == 7 and recipe.eval.gammas == [2, 3] and recipe.train.bf16 is True
    assert recipe.model.draft is None and recipe.model.draft_config == {"num_hidden_layers": 1}
    assert recipe.train.report_to == [] and recipe.hub.repo_id == "a/b"


def test_a_home_folder_path_is_expanded_where_the_shell_left_it(tmp_path, monkeypatch):
    """`~/...` in the YAML and in a `key=~/...` override (bash leaves a ~ after `model.target=` as it is) is the home
    folder's path; a ~ elsewhere in a string, and `~user`, stay as written."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    text = "model:\n  target: ~/models/target\n  draft: d\ndata:\n  dataset: ~/a.txt\n  split: b~c\n"
    recipe = load_recipe(write(tmp_path, text), ["train.output_dir=~/runs/x", "hub.repo_id=me/x~y",
                                                 "model.tokenizer=~other/tok"])
    home = tmp_path / "home"
    assert recipe.model.target == f"{home}/models/target" and recipe.train.output_dir == f"{home}/runs/x"
    assert recipe.data.dataset == f"{home}/a.txt" and recipe.data.split == "b~c"
    assert recipe.hub.repo_id == "me/x~y" and recipe.model.tokenizer == "~other/tok"


def test_a_flag_given_as_flag_equals_home_path_is_expanded(tmp_path, monkeypatch):
    """`--target=~/x` (bash expands no ~ after `--flag=`) and a quoted '~/x': every command's parser reads the home
    folder's path, for string and Path flags alike."""
    from specdistill.cli import eval as eval_cli

    monkeypatch.setenv("HOME", str(tmp_path))
    args = eval_cli.parse_args(["--target=~/t", "--draft", "~/d", "--prompts", "~/p.jsonl", "--output=~/e.json"])
    assert (args.target, args.draft, args.prompts) == (f"{tmp_path}/t", f"{tmp_path}/d", f"{tmp_path}/p.jsonl")
    assert args.output == tmp_path / "e.json"


def test_override_into_an_empty_section(tmp_path):
    assert load_recipe(write(tmp_path, MINIMAL + "train:\n"), ["train.max_steps=3"]).train.max_steps == 3


def test_yaml_1e_minus_4_without_dot_is_read_as_a_number(tmp_path):
    recipe = load_recipe(write(tmp_path, MINIMAL + "train:\n  learning_rate: 1e-4\n"))
    assert recipe.train.learning_rate == pytest.approx(1e-4)


@pytest.mark.parametrize("bad", ["train.learning_rate", "learning_rate=1", "train..x=1"])
def test_malformed_override(bad):
    with pytest.raises(RecipeError, match="section.key=value"):
        parse_override(bad)


def test_unknown_override_key_suggests(tmp_path):
    with pytest.raises(RecipeError, match=r"train\.lerning_rate.*did you mean 'train\.learning_rate'"):
        load_recipe(write(tmp_path, MINIMAL), ["train.lerning_rate=1"])


def test_with_overrides_never_mutates_the_callers_recipe(tmp_path):
    recipe = load_recipe(
        write(tmp_path, "model:\n  target: t\n  draft_config: {num_hidden_layers: 2}\ndata:\n  dataset: x.txt\n"))
    before = recipe_to_dict(recipe)
    changed = with_overrides(recipe, ["model.draft_config.num_hidden_layers=1", "eval.gammas=[3]"])
    assert changed.model.draft_config == {"num_hidden_layers": 1} and changed.eval.gammas == [3]
    assert recipe_to_dict(recipe) == before


def test_missing_required_keys_are_named(tmp_path):
    with pytest.raises(RecipeError, match=r"model\.target"):
        load_recipe(write(tmp_path, "model:\n  draft: d\ndata:\n  dataset: x.txt\n"))
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_recipe(tmp_path / "nope.yaml")


def test_saved_recipe_loads_back(tmp_path):
    recipe = load_recipe(write(tmp_path, MINIMAL), ["train.learning_rate=1e-4"])
    save_recipe(recipe, tmp_path / "resolved.yaml")
    assert load_recipe(tmp_path / "resolved.yaml") == recipe


def test_readme_documents_every_key_with_its_default():
    text = README.read_text()
    assert BEGIN in text and END in text, "recipes/README.md lacks the generated key table markers"
    table = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert table == reference_markdown().strip(), "recipes/README.md is stale: paste `python -m specdistill.recipes`"


# ---------------------------------------------------------------------------------------------------------------
# train: is TrainingArguments' own fields
# ---------------------------------------------------------------------------------------------------------------

def test_no_training_arguments_field_is_declared_twice():
    """Every TrainingArguments field is a train key, set by the run, or left to another section; ours add none."""
    from transformers import TrainingArguments

    theirs = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
    ours = set(RunFolderKeys.__annotations__) - {"section", "refused", "former_names"}
    assert ours == {"overwrite_output_dir", "preemption_grace_s"} and not ours & theirs
    renamed = {installed: key for key, installed in installed_names().items() if installed != key}  # before 5.23
    under_our_names = {renamed.get(name, name) for name in theirs}
    assert set(TRAINING_ARGUMENTS_CHANGES) <= under_our_names
    assert set(SET_BY_THE_RUN) <= theirs and set(LEFT_TO_OTHERS) <= theirs
    assert set(TrainConfig.model_fields) | set(SET_BY_THE_RUN) | set(LEFT_TO_OTHERS) == \
        under_our_names | ours | set(LEFT_TO_OTHERS)
    # other sections share two names with other meanings: eval.seed (sampling), hub.push_to_hub (the export, which
    # is why train.push_to_hub is refused)
    shared = {section: set(cls.model_fields) & theirs for section, cls in SECTION_TYPES.items() if section != "train"}
    assert {k: v for k, v in shared.items() if v} == {"eval": {"seed"}, "hub": {"push_to_hub"}}


def test_any_training_arguments_field_reaches_the_trainer(tmp_path):
    recipe = load_recipe(write(tmp_path, MINIMAL), ["train.adam_beta2=0.95", "train.lr_scheduler_type=linear",
                                                    "train.torch_empty_cache_steps=3"])
    args = training_arguments(recipe.train)
    assert args.adam_beta2 == 0.95 and args.lr_scheduler_type == "linear" and args.torch_empty_cache_steps == 3
    # our defaults where they differ from transformers', and the fields the run sets
    assert args.optim == "adamw_torch" and args.learning_rate == 1e-4 and args.warmup_steps == 0.03
    assert args.eval_strategy == "no" and args.remove_unused_columns is False and args.save_strategy == "steps"
    assert recipe_to_dict(recipe)["train"]["adam_beta2"] == 0.95 and "adam_beta1" not in recipe_to_dict(recipe)["train"]


@pytest.mark.parametrize("override, machine_has_accelerator, pinned", [
    (None, False, False),   # left out on a CPU-only machine: off (pinning would only warn)
    (None, True, True),     # left out where torch sees an accelerator: on, transformers' default
    ("train.dataloader_pin_memory=true", False, True),   # a recipe's value is kept on any machine
    ("train.dataloader_pin_memory=false", True, False),
])
def test_pin_memory_follows_the_machine_unless_the_recipe_says(tmp_path, monkeypatch, override, machine_has_accelerator,
                                                              pinned):
    import distill.recipe.train_config as train_config

    monkeypatch.setattr(train_config, "accelerator_present", lambda: machine_has_accelerator)
    recipe = load_recipe(write(tmp_path, MINIMAL), [override] if override else [])
    assert training_arguments(recipe.train).dataloader_pin_memory is pinned


@pytest.mark.parametrize("override, expected", [
    ("train.eval_strategy=steps", "train.eval_strategy: set by the run to 'no'"),
    ("train.deepspeed=ds.json", "train.deepspeed: not a recipe key: device modes come from the accelerate config"),
    ("train.push_to_hub=true", "train.push_to_hub: not a recipe key: the hub: section"),
    ("train.gradient_checkpointing=true", "renamed it train.activation_checkpointing"),
    ("train.warmup_ratio=0.1", "train.warmup_ratio: unknown key; did you mean 'train.warmup_steps'?"),
    ("train.adam_beta3=0.9", "train.adam_beta3: unknown key; did you mean 'train.adam_beta"),
    ("train.optim=adamw_torh", "train.optim: got 'adamw_torh'; allowed: one of 'adamw_torch'"),
    ("train.lr_scheduler_type=cosin", "did you mean 'cosine'?"),
    ("train.adam_epsilon=.nan", "train.adam_epsilon: got nan; allowed: a finite number (not NaN or infinity)"),
    ("train.resume_from_checkpoint=false", "train.resume_from_checkpoint: got False; allowed: a string or true or "
                                           "null"),
])
def test_train_keys_are_checked_by_the_schema(tmp_path, override, expected):
    with pytest.raises(RecipeError) as err:
        load_recipe(write(tmp_path, MINIMAL), [override])
    assert str(err.value).startswith(OVERRIDE_SOURCE) and expected in str(err.value), str(err.value)


def test_a_file_error_names_the_line_of_the_key(tmp_path):
    path = write(tmp_path, MINIMAL + "train:\n  seed: 1\n  learning_rate: -1\n")
    with pytest.raises(RecipeError, match=re.escape(f"{path}:8: train.learning_rate: got -1; allowed:")):
        load_recipe(path)
    path = write(tmp_path, MINIMAL + "train:\n  learnin_rate: 1\n")
    with pytest.raises(RecipeError, match=re.escape(f"{path}:7: train.learnin_rate: unknown key; did you mean")):
        load_recipe(path)


def test_sections_built_in_code_raise_recipe_errors():
    with pytest.raises(RecipeError, match=r"^distill\.beta: got 2; allowed: a finite number in \[0, 1\]$"):
        DistillConfig(beta=2)
    with pytest.raises(RecipeError, match=r"train\.learning_rat: unknown key; did you mean 'train\.learning_rate'"):
        TrainConfig(learning_rat=1)


def test_eval_settings_reach_the_decoder_through_one_translation():
    """EvalConfig.decoder_settings is what the checkpoint measurements and the export's vLLM run use: every setting
    arrives, and vLLM gets the integer gammas only."""
    from specdistill.recipes import EvalConfig

    cfg = EvalConfig(gammas=[2, "auto", 5], temperatures=[0.0, 1.0], max_new_tokens=17, top_k=9, top_p=0.5, seed=3,
                     repeats=2, compile=True)
    settings = cfg.decoder_settings(1.0)
    assert (settings.gammas, settings.temperature, settings.max_new_tokens, settings.top_k, settings.top_p,
            settings.seed, settings.repeats, settings.compile) == ([2, "auto", 5], 1.0, 17, 9, 0.5, 3, 2, True)
    assert cfg.decoder_settings(0.0, fixed_gammas_only=True).gammas == cfg.fixed_gammas == [2, 5]


def test_a_draft_kind_supplies_its_defaults_where_the_recipe_sets_nothing(tmp_path):
    """model.draft_kind eagle3: unset keys take the kind's defaults (kinds/eagle3, and are reported), set keys keep
    the recipe's value, and a standalone recipe gets nothing from the head's defaults."""
    from kinds import kind_named

    KIND_DEFAULTS = {"eagle3": kind_named("eagle3").defaults}

    bare = tmp_path / "head.yaml"
    bare.write_text("model:\n  target: t\n  draft_kind: eagle3\ndata:\n  dataset: d\n")
    assert load_recipe(str(bare), []).kind_defaults == KIND_DEFAULTS["eagle3"]
    assert load_recipe(str(bare), []).data.loss_tokens == "all"  # a head trains on every token of its rows
    assert load_recipe(str(bare), []).model.head_fc_init == "last_aux"
    assert load_recipe(str(bare), []).model.head_attn_init == "target"
    recipe = load_recipe(str(bare), ["distill.ttt_steps=2", "train.warmup_steps=0.1", "data.loss_tokens=assistant",
                                     "model.head_fc_init=random", "model.head_attn_init=random"])
    assert recipe.kind_defaults == {"distill.ttt_decay": 0.8}
    assert (recipe.model.head_fc_init, recipe.model.head_attn_init) == ("random", "random")
    assert (recipe.distill.ttt_steps, recipe.train.warmup_steps) == (2, 0.1)  # the recipe's own values win
    assert (recipe.distill.ttt_decay, recipe.data.loss_tokens) == (0.8, "assistant")
    saved = tmp_path / "recipe.yaml"  # what a run folder keeps: the supplied values, which load back as set
    save_recipe(recipe, saved)
    again = load_recipe(str(saved), [])
    assert again.kind_defaults == {} and (again.distill.ttt_decay, again.train.warmup_steps) == (0.8, 0.1)
    assert again.data.loss_tokens == "assistant"
    standalone = load_recipe(str(ROOT / "recipes" / "tiny_distill.yaml"), ["model.target=t", "data.dataset=d"])
    assert standalone.kind_defaults == {} and standalone.distill.ttt_steps == 1
    assert standalone.data.loss_tokens == "assistant"


@dataclasses.dataclass
class TrainingArgumentsBefore523:
    """The fields of a TrainingArguments from before transformers 5.23 that this test needs (5.17 on a GPU image)."""
    output_dir: str | None = None
    learning_rate: float = 5e-5
    max_steps: int = -1
    resume_from_checkpoint: str | None = None
    gradient_checkpointing: bool = dataclasses.field(default=False, metadata={"help": "Use gradient checkpointing."})
    gradient_checkpointing_kwargs: dict | None = None


def test_a_renamed_training_argument_keeps_our_name_on_an_older_transformers():
    """train.activation_checkpointing is a key on every transformers release, and reaches an older TrainingArguments
    as gradient_checkpointing (transformers 5.17 had no activation_checkpointing: every head recipe crashed)."""
    from pydantic import create_model

    from distill.recipe.train_config import as_installed, schema_fields

    names = installed_names(TrainingArgumentsBefore523)
    assert names == {"activation_checkpointing": "gradient_checkpointing",
                     "activation_checkpointing_kwargs": "gradient_checkpointing_kwargs"}
    fields = schema_fields(TrainingArgumentsBefore523)
    assert {"activation_checkpointing", "activation_checkpointing_kwargs", "learning_rate"} <= set(fields)
    assert not {"gradient_checkpointing", "gradient_checkpointing_kwargs"} & set(fields)
    assert "Recompute draft activations" in fields["activation_checkpointing"][1].description  # ours merged in
    Old = create_model("OldTrainConfig", __base__=RunFolderKeys, **fields)
    values = Old(activation_checkpointing=True).model_dump(exclude={"overwrite_output_dir", "preemption_grace_s",
                                                                    "resume_from_checkpoint"})
    passed = as_installed(values, names)
    assert passed["gradient_checkpointing"] is True and "activation_checkpointing" not in passed
    assert TrainingArgumentsBefore523(**passed).gradient_checkpointing is True
    # the installed transformers (5.23+ here): our name is its own field, passed unchanged
    assert installed_names()["activation_checkpointing"] in {"activation_checkpointing", "gradient_checkpointing"}
    assert as_installed({"activation_checkpointing": True, "seed": 1}) == \
        {installed_names()["activation_checkpointing"]: True, "seed": 1}
