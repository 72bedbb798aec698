"""Sweeps of bad numbers over the four commands (issue 20, part 5); files: tests/test_bad_inputs_files.py.

Every numeric field of every recipe section (introspected from specdistill.recipes.SECTION_TYPES; train: every
TrainingArguments field a recipe may set), given as a key=value
override and in a recipe file, and every number flag of specdistill-eval, -push and -check (introspected from the
parsers the commands build), gets NaN, infinities and a number beyond float range. Each case: exit 1, exactly one
error line naming the key or flag, no traceback, no model weights loaded (the tripwire of tests/test_bad_inputs.py).
A numeric key or flag added later is swept with no change here. The umbrella `specdistill JOB` (specdistill.cli.main)
answers every number flag, and a recipe number, with the alias's line, named `specdistill JOB`.
"""
from __future__ import annotations

import argparse
import logging
import typing
from pathlib import Path
from typing import Any, Literal
from unittest import mock

import pytest
import yaml
from test_bad_inputs import RECIPE, no_weights, one_error_line, w  # noqa: F401 - fixtures used by name

from decode.inputs import command_line
from specdistill.cli import check as check_deploy
from specdistill.cli import eval as eval_acceptance
from specdistill.cli import main as umbrella
from specdistill.cli import push as push_to_hub
from specdistill.cli import train as train_script
from specdistill.recipes import SECTION_TYPES

COMMANDS = {"specdistill-train": train_script, "specdistill-eval": eval_acceptance,
            "specdistill-push": push_to_hub, "specdistill-check": check_deploy}


def run_command(prog: str, argv: list[str], monkeypatch, capsys) -> str:
    """The one error line of a command run on argv (exit 1, no traceback: tests/test_bad_inputs.py)."""
    line = one_error_line(COMMANDS[prog].cli, prog, argv, monkeypatch, capsys)
    logging.getLogger().handlers.clear()  # train's basicConfig: the next case's capsys gets a fresh handler
    return line


def run_through_umbrella(prog: str, argv: list[str], monkeypatch, capsys) -> str:
    """The one error line of `specdistill JOB argv` (JOB: prog's), written with prog's name as the alias writes it."""
    job = prog.removeprefix("specdistill-")
    line = one_error_line(umbrella.cli, "specdistill", [job, *argv], monkeypatch, capsys)
    logging.getLogger().handlers.clear()
    assert prog not in line, line  # the job names itself `specdistill JOB`
    return line.replace(f"specdistill {job}", prog)


# ---------------------------------------------------------------------------------------------------------------
# Numbers in recipes: every numeric field of every section
# ---------------------------------------------------------------------------------------------------------------

def holds(hint: Any, kinds: tuple[type, ...]) -> bool:
    """Whether a field's type hint admits a value of one of `kinds`, alone, in a union or as a list item."""
    if typing.get_origin(hint) is Literal:
        return False
    return hint in kinds or any(holds(arg, kinds) for arg in typing.get_args(hint))


def is_list(hint: Any) -> bool:
    return typing.get_origin(hint) is list or any(typing.get_origin(a) is list for a in typing.get_args(hint))


def recipe_fields() -> dict[str, Any]:
    """'section.key' -> type hint of every field of every recipe section (train: TrainingArguments' fields)."""
    return {f"{section}.{name}": info.annotation
            for section, cls in SECTION_TYPES.items() for name, info in cls.model_fields.items()}


NUMERIC_KEYS = {key: hint for key, hint in recipe_fields().items() if holds(hint, (int, float))}
NON_FINITE = (".nan", ".inf", "-.inf", "nan", "-inf", "1e999")  # YAML's NaN/infinities, and strings float() takes
TRAIN_BASE = ["model.target={w}/target", "data.dataset={w}/code.txt", "train.output_dir={w}/sweep_out"]


def expected_texts(key: str, hint: Any) -> list[str]:
    """A float field refuses the value as not finite; an int-only field as not of its type."""
    return [key, "finite number"] if holds(hint, (float,)) else [key, "allowed"]


def test_the_sweep_sees_the_numeric_fields():
    """Introspection finds numbers in every section that has them, lists and optionals included."""
    for key in ("train.learning_rate", "eval.temperatures", "data.target_top_p", "lora.alpha", "train.max_steps",
                "distill.beta", "eval.gammas", "data.max_samples"):
        assert key in NUMERIC_KEYS, key
    assert "model.target" not in NUMERIC_KEYS and "train.bf16" not in NUMERIC_KEYS
    assert len(NUMERIC_KEYS) >= 40


@pytest.mark.parametrize("key, value", [(k, v) for k in NUMERIC_KEYS for v in NON_FINITE])
def test_override_number_not_finite(key, value, w, no_weights, monkeypatch, capsys):
    shown = f"[{value}]" if is_list(NUMERIC_KEYS[key]) else value
    argv = [RECIPE, *(a.format(w=w) for a in TRAIN_BASE), f"{key}={shown}"]
    line = run_command("specdistill-train", argv, monkeypatch, capsys)
    assert "command-line override" in line, line
    for text in expected_texts(key, NUMERIC_KEYS[key]):
        assert text in line, (text, line)


def sweep_recipe(w: Path, tmp_path: Path, section: str, values: dict[str, Any]) -> Path:
    """The tiny recipe with its required keys filled in and `values` set in `section`, written to a file."""
    raw = yaml.safe_load(Path(RECIPE).read_text())
    raw["model"]["target"], raw["data"]["dataset"] = str(w / "target"), str(w / "code.txt")
    raw["train"]["output_dir"] = str(tmp_path / "out")
    raw.setdefault(section, {}).update(values)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize("key, number", [(k, n) for k in NUMERIC_KEYS for n in (float("nan"), float("-inf"))])
def test_recipe_file_number_not_finite(key, number, w, no_weights, tmp_path, monkeypatch, capsys):
    section, name = key.split(".")
    path = sweep_recipe(w, tmp_path, section, {name: [number] if is_list(NUMERIC_KEYS[key]) else number})
    line = run_command("specdistill-train", [str(path)], monkeypatch, capsys)
    for text in [str(path), *expected_texts(key, NUMERIC_KEYS[key])]:
        assert text in line, (text, line)


def test_override_number_not_finite_through_the_umbrella(w, no_weights, monkeypatch, capsys):
    argv = [RECIPE, *(a.format(w=w) for a in TRAIN_BASE), "train.learning_rate=.nan"]
    line = run_through_umbrella("specdistill-train", argv, monkeypatch, capsys)
    assert line == run_command("specdistill-train", argv, monkeypatch, capsys)


@pytest.mark.parametrize("override, named", [
    ("distill.loss={tv: .nan, ce: 0.5}", "distill.loss.tv: got nan"),
    ("distill.loss={tv: {start: 0, end: .inf}}", "distill.loss.tv.end: got inf"),
    ("train.lr_scheduler_kwargs={power: -.inf}", "train.lr_scheduler_kwargs.power: got -inf"),
])
def test_number_inside_a_mapping_not_finite(override, named, w, no_weights, monkeypatch, capsys):
    """Mappings of numbers (a loss combination, transformers' kwargs) are swept inside too."""
    line = run_command("specdistill-train", [RECIPE, *(a.format(w=w) for a in TRAIN_BASE), override], monkeypatch,
                       capsys)
    assert "command-line override" in line and named in line, line


def test_nested_number_not_finite(w, no_weights, tmp_path, monkeypatch, capsys):
    """A number inside a mapping key (model.draft_config goes to the draft's transformers config) is checked too."""
    argv = [RECIPE, *(a.format(w=w) for a in TRAIN_BASE), "model.draft_config.rope_theta=.inf"]
    line = run_command("specdistill-train", argv, monkeypatch, capsys)
    assert "model.draft_config.rope_theta: got inf" in line and "finite number" in line, line
    path = sweep_recipe(w, tmp_path, "model", {"draft_config": {"num_hidden_layers": 1, "rms_norm_eps": float("nan")}})
    line = run_command("specdistill-train", [str(path)], monkeypatch, capsys)
    assert str(path) in line and "model.draft_config.rms_norm_eps: got nan" in line, line


# ---------------------------------------------------------------------------------------------------------------
# Numbers on command lines: every number flag of every parser
# ---------------------------------------------------------------------------------------------------------------

class _Captured(Exception):
    pass


def command_parser(module) -> argparse.ArgumentParser:
    """The parser a command builds, caught as its parse_args is called (nothing else of the command runs)."""
    def capture(parser, *args, **kwargs):
        raise _Captured(parser)
    with mock.patch.object(argparse.ArgumentParser, "parse_args", capture):
        try:
            module.parse_args([])
        except _Captured as caught:
            return caught.args[0]
    raise AssertionError(f"{module.__name__}.parse_args built no argparse parser")


PARSED = {prog: module for prog, module in COMMANDS.items() if prog != "specdistill-train"}  # train: recipe + key=value
STRING_TYPES = (None, str, Path)


def value_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments that take a value (flags and positionals), --help and on/off switches left out."""
    return [a for a in parser._actions if a.nargs != 0 and not isinstance(a, argparse._HelpAction)]


def action_name(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else action.dest


def numeric_flags() -> list[tuple[str, str, Any]]:
    """(command, flag, type) of every value-taking argument whose type is not a string or a path."""
    found = []
    for prog, module in PARSED.items():
        for action in value_actions(command_parser(module)):
            if action.type not in STRING_TYPES:
                assert action.option_strings, f"{prog}: numeric positional {action.dest}: extend the sweep"
                found.append((prog, action_name(action), action.type))
    return found


NUMERIC_FLAGS = numeric_flags()
VALID_ARGV = {
    "specdistill-eval": ["--target", "{w}/target", "--draft", "{w}/draft", "--prompts", "{w}/prompts.txt",
                         "--max-new-tokens", "4", "--quiet"],
    "specdistill-push": ["{w}/export", "--repo-id", "me/draft", "--dry-run"],
    "specdistill-check": ["--target", "{w}/target", "--draft", "{w}/export"],
}
BAD_NUMBERS = ("nan", "NaN", "inf", "-inf", "Infinity", "1e999", "-1e999")


def test_the_sweep_sees_the_number_flags():
    flags = {(prog, flag) for prog, flag, _ in NUMERIC_FLAGS}
    for expected in [("specdistill-eval", "--temperature"), ("specdistill-eval", "--top-p"),
                     ("specdistill-eval", "--gamma"), ("specdistill-eval", "--top-k"), ("specdistill-push", "--step")]:
        assert expected in flags, expected


@pytest.mark.parametrize("prog, flag, kind, value",
                         [(p, f, t, v) for p, f, t in NUMERIC_FLAGS for v in BAD_NUMBERS],
                         ids=lambda x: getattr(x, "__name__", str(x)))
def test_flag_number_not_finite(prog, flag, kind, value, w, no_weights, monkeypatch, capsys):
    argv = [a.format(w=w) for a in VALID_ARGV[prog]] + [f"{flag}={value}"]
    line = run_command(prog, argv, monkeypatch, capsys)
    assert line.startswith(f"{prog}: error: argument {flag}"), line
    if kind is float:
        assert f"expected a finite number, got {value!r}" in line, line


@pytest.mark.parametrize("prog, flag, kind", NUMERIC_FLAGS, ids=lambda x: getattr(x, "__name__", str(x)))
def test_flag_number_not_finite_through_the_umbrella(prog, flag, kind, w, no_weights, monkeypatch, capsys):
    argv = [a.format(w=w) for a in VALID_ARGV[prog]] + [f"{flag}=nan"]
    line = run_through_umbrella(prog, argv, monkeypatch, capsys)
    assert line == run_command(prog, argv, monkeypatch, capsys)


def test_finite_float_is_the_float_of_every_parser():
    """type=float is read by decode.inputs.command_line.finite_float in every command's parser (one place)."""
    for module in PARSED.values():
        assert command_parser(module)._registry_get("type", float) is command_line.finite_float
    assert command_line.finite_float("1e-3") == 1e-3 and command_line.finite_float("-2") == -2.0
