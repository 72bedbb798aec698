"""Recipe files: YAML -> `section.key=value` overrides -> the pydantic sections of distill/recipe/sections.py, and back.

`load_recipe(path, overrides, schema)` reads the file (a key given twice is refused with its line), applies the
overrides and builds the sections; every problem raises `RecipeError` naming the key, the file (or the command-line
override), the bad value and what is allowed, before any model is loaded. An unknown key names the closest valid one.

The schema is a Recipe class made by distill.recipe.sections.recipe_schema for the kinds of draft handed in;
specdistill.recipes holds the one of every registered kind (and regenerates the key reference in recipes/README.md:
`python -m specdistill.recipes`).
"""
from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import yaml

from decode.inputs.checks import read_text
from decode.inputs.command_line import home_expanded
from decode.inputs.writes import write_atomic
from distill.recipe.schema import OVERRIDE_SOURCE, RecipeError, key_error, short_type, unknown_key
from distill.recipe.sections import SECTIONS, Recipe
from distill.recipe.strict_yaml import DuplicateKeyError, key_lines, safe_load_strict
from distill.recipe.train_config import LEFT_TO_OTHERS, SET_BY_THE_RUN, TRAINING_ARGUMENTS_CHANGES, RunFolderKeys

# ---------------------------------------------------------------------------------------------------------------
# Loading: file -> dict -> overrides -> sections
# ---------------------------------------------------------------------------------------------------------------

def parse_override(text: str) -> tuple[list[str], Any]:
    """'train.learning_rate=1e-4' -> (['train', 'learning_rate'], 1e-4); the value is read as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or "." not in key or not all(key.split(".")):
        raise RecipeError(text, "an override must look like section.key=value, e.g. train.learning_rate=1e-4",
                          OVERRIDE_SOURCE)
    try:
        value = safe_load_strict(raw) if raw.strip() else None
    except (yaml.YAMLError, DuplicateKeyError) as err:
        problem = getattr(err, "problem", err)
        raise RecipeError(key, f"cannot read value {raw!r} as YAML ({problem})", OVERRIDE_SOURCE) from None
    return key.split("."), value


def _apply_override(raw: dict[str, dict], path: list[str], value: Any) -> None:
    """Set raw[path[0]][path[1]]... = value on a dict we own (never the caller's)."""
    section = path[0]
    if section not in SECTIONS:
        raise unknown_key(section, SECTIONS).located(OVERRIDE_SOURCE)
    if not isinstance(raw.get(section), dict):
        raw[section] = {}
    node = raw[section]
    for part in path[1:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value


def home_paths(values: Any) -> Any:
    """A section's values with `~` and `~/...` strings as paths in the home folder
    (decode.inputs.command_line.home_expanded): a recipe's YAML and a `key=~/...` override are never expanded by
    the shell."""
    if not isinstance(values, dict):
        return values
    return {key: home_expanded(value) if isinstance(value, str) else value for key, value in values.items()}


def _where(err: RecipeError, source: str, override_keys: typing.Collection[str]) -> str:
    """The command line when an override set the key at fault (or another key of its rule), else `source`."""
    keys = (err.key, *err.involves)
    overridden = any(k == o or k.startswith(o + ".") or o.startswith(k + ".") for k in keys for o in override_keys)
    return OVERRIDE_SOURCE if overridden else source


def build_recipe(raw: dict[str, Any], schema: type[Recipe], source: str = "<dict>",
                 override_keys: typing.Collection[str] = ()) -> Recipe:
    """A ``schema`` recipe from a {section: {key: value}} mapping; errors name `source` (or the override that set
    the key)."""
    section_types = schema.section_types()
    if not isinstance(raw, dict):
        raise RecipeError("<top level>", f"expected a mapping of sections {SECTIONS}, got {type(raw).__name__}",
                          source)
    raw = {name: home_paths(values) for name, values in raw.items()}
    for name in raw:
        if name not in section_types:
            raise unknown_key(str(name), SECTIONS).located(source)
    try:
        for name, cls in section_types.items():  # unknown keys first, in every section, then values
            values = raw.get(name) or {}
            if not isinstance(values, dict):
                raise RecipeError(name, f"expected a mapping of keys, got {values!r}")
            for key in values:
                if key not in cls.model_fields:
                    raise key_error(cls, key)
        return schema(**{name: cls(**(raw.get(name) or {})) for name, cls in section_types.items()})
    except RecipeError as err:
        raise err.located(_where(err, source, override_keys)) from None


def load_recipe(path: str | Path, overrides: typing.Sequence[str], schema: type[Recipe]) -> Recipe:
    """Read a recipe YAML file, apply `section.key=value` overrides and validate everything against ``schema``.

    Raises RecipeError (a ValueError) naming key, file and value; FileNotFoundError naming the path; FileProblem
    for a file that is not text.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"recipe file not found: {path}")
    text = read_text(path, "recipe")
    try:
        raw = safe_load_strict(text) or {}
    except DuplicateKeyError as err:
        raise RecipeError(str(err.key), str(err), f"{path}:{err.line}") from None
    except yaml.YAMLError as err:
        raise RecipeError("<yaml>", f"not valid YAML: {err}", str(path)) from None
    if not isinstance(raw, dict):
        raise RecipeError("<top level>", f"expected a mapping of sections {SECTIONS}", str(path))
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}  # overrides change our copy
    override_keys = []
    for override in overrides:
        key_path, value = parse_override(override)
        _apply_override(raw, key_path, value)
        override_keys.append(".".join(key_path[:2]))
    try:
        return build_recipe(raw, schema, str(path), override_keys)
    except RecipeError as err:
        if err.source != str(path):
            raise
        lines = key_lines(text)  # the key's line, else its section's: FILE:LINE
        parts = err.key.split(".")
        line = next((lines[k] for k in (".".join(parts[:n]) for n in range(len(parts), 0, -1)) if k in lines), None)
        raise err.located(f"{path}:{line}" if line else str(path)) from None


def with_overrides(recipe: Recipe, overrides: typing.Sequence[str]) -> Recipe:
    """A new Recipe with overrides applied; `recipe` itself is left untouched."""
    raw = recipe_to_dict(recipe)
    keys = []
    for text in overrides:
        key_path, value = parse_override(text)
        _apply_override(raw, key_path, value)
        keys.append(".".join(key_path[:2]))
    return build_recipe(raw, type(recipe), OVERRIDE_SOURCE, keys)


def recipe_to_dict(recipe: Recipe) -> dict[str, dict[str, Any]]:
    """A deep-copied plain-dict view of the recipe (YAML-safe). Of the train section it holds the keys of the
    README's train table and the TrainingArguments fields that differ from their defaults."""
    raw = recipe.model_dump()
    fields, shown = type(recipe.train).model_fields, {*RunFolderKeys.model_fields, *TRAINING_ARGUMENTS_CHANGES}
    raw["train"] = {key: value for key, value in raw["train"].items()
                    if key in shown or value != fields[key].get_default(call_default_factory=True)}
    return raw


def save_recipe(recipe: Recipe, path: str | Path) -> None:
    """Write the resolved recipe as YAML (loads back with load_recipe and the recipe's schema)."""
    write_atomic(path, yaml.safe_dump(recipe_to_dict(recipe), sort_keys=False))

# ---------------------------------------------------------------------------------------------------------------
# Reference table for recipes/README.md
# ---------------------------------------------------------------------------------------------------------------

def _row(section: str, name: str, info: Any) -> str:
    if info.is_required():
        shown = "(required)"
    else:
        default = info.get_default(call_default_factory=True)
        shown = "`" + yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip() + "`"
    help_text = " ".join((info.description or "").split())
    return f"| `{section}.{name}` | {short_type(info.annotation)} | {shown} | {help_text} |"


def _train_notes(cls: type) -> list[str]:
    """What the train table leaves out: the other TrainingArguments fields, and the ones a recipe may not set."""
    shown = {*RunFolderKeys.model_fields, *TRAINING_ARGUMENTS_CHANGES}
    others = [f"`{n}`" for n in cls.model_fields if n not in shown]
    fixed = [f"`{n}` = `{v!r}` ({why})" for n, (v, why) in SET_BY_THE_RUN.items()]
    elsewhere = {}
    for name, why in LEFT_TO_OTHERS.items():
        elsewhere.setdefault(why, []).append(f"`{name}`")
    return ["", f"Every other field of `transformers.TrainingArguments` is a `train:` key too, with transformers' "
            f"type, default and meaning ({len(others)}): " + ", ".join(others) + ".", "",
            "Set by the run (a recipe that sets one is refused): " + "; ".join(fixed) + ".", "",
            "Not recipe keys: " + "; ".join(f"{', '.join(names)}: {why}" for why, names in elsewhere.items()) + "."]


def reference_markdown(schema: type[Recipe]) -> str:
    """A markdown table of every recipe key with its type, default and help, generated from ``schema``."""
    lines = []
    for name, cls in schema.section_types().items():
        lines += [f"### `{name}`", "", " ".join((cls.__doc__ or "").split()), "", "| key | type | default | meaning |",
                  "|---|---|---|---|"]
        shown = {*RunFolderKeys.model_fields, *TRAINING_ARGUMENTS_CHANGES} if name == "train" else cls.model_fields
        lines += [_row(name, key, info) for key, info in cls.model_fields.items() if key in shown]
        lines += _train_notes(cls) if name == "train" else []
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"

