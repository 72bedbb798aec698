"""The recipe schema of every registered kind of draft, and reading recipe files with it.

distill/recipe/ holds the shared keys and the rules; each kind brings its own keys (kinds/<kind>/options.py). Here
the registry (kinds.KINDS) is handed to distill.recipe.sections.recipe_schema once, so `Recipe`, `ModelConfig` and
`DistillConfig` below take every kind's keys, and a standalone draft is what a recipe that names no kind trains.

    recipe = load_recipe("recipes/quickstart.yaml", ["train.max_steps=10"])
    recipe.model.kind          # the kind the recipe names, handed down from here as a value

Regenerate the key reference in recipes/README.md with `python -m specdistill.recipes`.
"""
from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

from distill.recipe import loader
from distill.recipe.sections import (
    OVERRIDE_SOURCE,
    SECTIONS,
    DataConfig,
    EvalConfig,
    HubConfig,
    LoraConfig,
    RecipeError,
    Section,
    TrainConfig,
    recipe_schema,
)
from kinds import KINDS, STANDALONE

Recipe = recipe_schema(KINDS, default=STANDALONE)
SECTION_TYPES: dict[str, type[Section]] = Recipe.section_types()
ModelConfig = SECTION_TYPES["model"]
DistillConfig = SECTION_TYPES["distill"]

__all__ = ["OVERRIDE_SOURCE", "SECTIONS", "SECTION_TYPES", "DataConfig", "DistillConfig", "EvalConfig", "HubConfig",
           "LoraConfig", "ModelConfig", "Recipe", "RecipeError", "TrainConfig", "build_recipe", "load_recipe",
           "reference_markdown"]


def load_recipe(path: str | Path, overrides: typing.Sequence[str] = ()) -> Recipe:
    """Read a recipe YAML file, apply `section.key=value` overrides, validate (distill.recipe.loader.load_recipe)."""
    return loader.load_recipe(path, overrides, Recipe)


def build_recipe(raw: dict[str, Any], source: str = "<dict>", override_keys: typing.Collection[str] = ()) -> Recipe:
    """A recipe from a {section: {key: value}} mapping (distill.recipe.loader.build_recipe)."""
    return loader.build_recipe(raw, Recipe, source, override_keys)


def reference_markdown() -> str:
    """The key reference of recipes/README.md: every key of every kind."""
    return loader.reference_markdown(Recipe)


if __name__ == "__main__":
    print(reference_markdown(), end="")
