"""Recipe files: YAML -> `section.key=value` overrides -> the typed dataclasses of distill/config.py, and back.

`load_recipe(path, overrides)` reads the file (a key given twice is refused with its line), applies the overrides
and builds the dataclasses; every problem raises `RecipeError` naming the key, the file (or the command-line
override), the bad value and what is allowed, before any model is loaded. An unknown key names the closest valid one.

Regenerate the key reference in recipes/README.md with `python -m distill.recipe_loader`.
"""
from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path
from typing import Any

import yaml

from decode.checks import read_text
from distill.config import SECTION_TYPES, SECTIONS, Recipe, check_across_sections
from distill.recipe_fields import OVERRIDE_SOURCE, RecipeError, short_type
from distill.strict_yaml import DuplicateKeyError, safe_load_strict


# ---------------------------------------------------------------------------------------------------------------
# Loading: file -> dict -> overrides -> dataclasses
# ---------------------------------------------------------------------------------------------------------------

def _unknown_key(key: str, valid: typing.Iterable[str], source: str) -> RecipeError:
    valid = list(valid)
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], [v.rsplit(".", 1)[-1] for v in valid], n=1)
    prefix = key.rsplit(".", 1)[0] + "." if "." in key else ""
    hint = f"did you mean '{prefix}{close[0]}'?" if close else "valid keys: " + ", ".join(valid)
    return RecipeError(key, f"unknown key; {hint}", source)


def parse_override(text: str) -> tuple[list[str], Any]:
    """'train.learning_rate=1e-4' -> (['train', 'learning_rate'], 1e-4); the value is read as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or "." not in key or not all(key.split(".")):
        raise RecipeError(text, "an override must look like section.key=value, e.g. train.learning_rate=1e-4",
                          OVERRIDE_SOURCE)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as err:
        raise RecipeError(key, f"cannot read value {raw!r} as YAML ({err.problem})", OVERRIDE_SOURCE) from None
    return key.split("."), value


def _apply_override(raw: dict[str, dict], path: list[str], value: Any) -> None:
    """Set raw[path[0]][path[1]]... = value on a dict we own (never the caller's)."""
    section = path[0]
    if section not in SECTION_TYPES:
        raise _unknown_key(section, SECTIONS, OVERRIDE_SOURCE)
    names = [f.name for f in dataclasses.fields(SECTION_TYPES[section])]
    if path[1] not in names:
        raise _unknown_key(".".join(path[:2]), [f"{section}.{n}" for n in names], OVERRIDE_SOURCE)
    if not isinstance(raw.get(section), dict):
        raw[section] = {}
    node = raw[section]
    for part in path[1:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value


def build_recipe(raw: dict[str, Any], source: str = "<dict>", override_keys: typing.Collection[str] = ()) -> Recipe:
    """Recipe from a {section: {key: value}} mapping; errors name `source` (or the override that set the key)."""
    if not isinstance(raw, dict):
        raise RecipeError("<top level>", f"expected a mapping of sections {SECTIONS}, got {type(raw).__name__}",
                          source)
    sections = {}
    for name in raw:
        if name not in SECTION_TYPES:
            raise _unknown_key(str(name), SECTIONS, source)
    for name, cls in SECTION_TYPES.items():
        values = raw.get(name) or {}
        if not isinstance(values, dict):
            raise RecipeError(name, f"expected a mapping of keys, got {values!r}", source)
        names = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in names:
                raise _unknown_key(f"{name}.{key}", [f"{name}.{n}" for n in names], source)
        try:
            sections[name] = cls(**values)
        except RecipeError as err:
            key = f"{name}.{err.key}"
            where = OVERRIDE_SOURCE if any(key == k or key.startswith(k + ".") for k in override_keys) else source
            raise err.located(name, where) from None
    check_across_sections(sections, source, override_keys)
    return Recipe(**sections)


def load_recipe(path: str | Path, overrides: typing.Sequence[str] = ()) -> Recipe:
    """Read a recipe YAML file, apply `section.key=value` overrides and validate everything.

    Raises RecipeError (a ValueError) naming key, file and value; FileNotFoundError naming the path; FileProblem
    for a file that is not text.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"recipe file not found: {path}")
    try:
        raw = safe_load_strict(read_text(path, "recipe")) or {}
    except DuplicateKeyError as err:
        raise RecipeError(str(err.key), str(err), f"{path}:{err.line}") from None
    except yaml.YAMLError as err:
        raise RecipeError("<yaml>", f"not valid YAML: {err}", str(path)) from None
    if not isinstance(raw, dict):
        raise RecipeError("<top level>", f"expected a mapping of sections {SECTIONS}", str(path))
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    override_keys = []
    for text in overrides:
        key_path, value = parse_override(text)
        _apply_override(raw, key_path, value)
        override_keys.append(".".join(key_path[:2]))
    return build_recipe(raw, str(path), override_keys)


def with_overrides(recipe: Recipe, overrides: typing.Sequence[str]) -> Recipe:
    """A new Recipe with overrides applied; `recipe` itself is left untouched."""
    raw = recipe_to_dict(recipe)
    keys = []
    for text in overrides:
        key_path, value = parse_override(text)
        _apply_override(raw, key_path, value)
        keys.append(".".join(key_path[:2]))
    return build_recipe(raw, OVERRIDE_SOURCE, keys)


def recipe_to_dict(recipe: Recipe) -> dict[str, dict[str, Any]]:
    """A deep-copied plain-dict view of the recipe (YAML-safe)."""
    return dataclasses.asdict(recipe)


def save_recipe(recipe: Recipe, path: str | Path) -> None:
    """Write the resolved recipe as YAML (loads back with load_recipe)."""
    Path(path).write_text(yaml.safe_dump(recipe_to_dict(recipe), sort_keys=False))

# ---------------------------------------------------------------------------------------------------------------
# Reference table for recipes/README.md
# ---------------------------------------------------------------------------------------------------------------

def reference_markdown() -> str:
    """A markdown table of every recipe key with its type, default and help, generated from the dataclasses."""
    lines = []
    for name, cls in SECTION_TYPES.items():
        hints = typing.get_type_hints(cls)
        lines += [f"### `{name}`", "", (cls.__doc__ or "").strip(), "", "| key | type | default | meaning |",
                  "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            shown = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
            shown = "(required)" if default == "" else f"`{shown}`"
            lines.append(f"| `{name}.{f.name}` | {short_type(hints[f.name])} | {shown} | {f.metadata['help']} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
