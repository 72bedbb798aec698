"""The thin layer recipes put over pydantic: the base of every section and its one-line errors.

Every recipe section is a pydantic model (`Section`): an unknown key is refused with the closest valid one
(`extra="forbid"` + difflib), values are taken as YAML gives them (`strict`: no string becomes a number, no number
a bool; an integer is taken for a float), and NaN and infinities are refused for every number, nested mappings
included (`allow_inf_nan=False`). A pydantic ValidationError becomes one RecipeError,
`section.key: got VALUE; allowed: WHAT`, which distill.recipe.loader locates in the file or on the command line.
Rules between keys raise through `require` (a pydantic custom error that carries the key it names).
"""
from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import annotated_types as at
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError

OVERRIDE_SOURCE = "command-line override"
RULE = "recipe_rule"  # the pydantic error type of `require`


class RecipeError(ValueError):
    """A recipe key is unknown, has the wrong type or is out of range. The message names source, key and value;
    `involves` lists the other keys of a rule between keys (an override of any of them is named as the source)."""

    def __init__(self, key: str, problem: str, source: str | None = None, involves: Sequence[str] = ()):
        self.key, self.problem, self.source, self.involves = key, problem, source, tuple(involves)
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{key}: {problem}")

    def located(self, source: str) -> RecipeError:
        """The same error with its source (a file, file:line or the command-line override) attached."""
        return RecipeError(self.key, self.problem, source, self.involves)


def require(ok: bool, key: str, value: Any, allowed: str, involves: Sequence[str] = ()) -> None:
    """Inside a validator: refuse `value` of `key` ('section.key') unless `ok`; `involves` names the other keys of
    the rule."""
    if not ok:
        raise rule_error(key, f"got {value!r}; allowed: {allowed}", involves)


def rule_error(key: str, problem: str, involves: Sequence[str] = ()) -> PydanticCustomError:
    """The error a validator raises for a rule between keys; section_error turns it into RecipeError(key, problem)."""
    return PydanticCustomError(RULE, "{key}: {problem}", {"key": key, "problem": problem, "involves": tuple(involves)})


class Section(BaseModel):
    """A recipe section: its keys are the fields; constructing one raises RecipeError (never ValidationError)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    section: ClassVar[str] = ""  # the YAML name of the section: 'model', 'train', ...
    refused: ClassVar[dict[str, str]] = {}  # names the section refuses on purpose -> why
    former_names: ClassVar[dict[str, str]] = {}  # an old key -> the key that replaced it

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as err:
            raise section_error(type(self), values, err) from None


# ---------------------------------------------------------------------------------------------------------------
# ValidationError -> RecipeError
# ---------------------------------------------------------------------------------------------------------------

def unknown_key(key: str, valid: typing.Iterable[str], former: dict[str, str] | None = None) -> RecipeError:
    """'key: unknown key; did you mean ...?' for a dotted key (`valid`: the dotted keys it could have been)."""
    valid = list(valid)
    prefix, name = (key.rsplit(".", 1)[0] + ".", key.rsplit(".", 1)[1]) if "." in key else ("", key)
    if former and name in former:
        return RecipeError(key, f"unknown key; did you mean '{prefix}{former[name]}'? (it replaced {name})")
    close = difflib.get_close_matches(name, [v.rsplit(".", 1)[-1] for v in valid], n=1)
    hint = f"did you mean '{prefix}{close[0]}'?" if close else "valid keys: " + ", ".join(valid)
    return RecipeError(key, f"unknown key; {hint}")


def key_error(cls: type[Section], name: Any) -> RecipeError:
    """Why `name` is no key of the section: refused on purpose, renamed, or a typo of the closest valid key."""
    key = f"{cls.section}.{name}"
    if name in cls.refused:
        return RecipeError(key, cls.refused[name])
    return unknown_key(key, [f"{cls.section}.{n}" for n in cls.model_fields], cls.former_names)


def section_error(cls: type[Section], values: dict[str, Any], err: ValidationError) -> RecipeError:
    """The first problem of a section's ValidationError as one RecipeError naming 'section.key'."""
    errors = err.errors(include_url=False)
    first = next((e for e in errors if e["type"] == "finite_number"), errors[0])  # NaN: named wherever it is
    if first["type"] == RULE:
        ctx = first["ctx"]
        return RecipeError(ctx["key"], ctx["problem"], involves=ctx["involves"])
    name = str(first["loc"][0]) if first["loc"] else ""
    key = f"{cls.section}.{name}"
    if first["type"] == "extra_forbidden":
        return key_error(cls, name)
    if name not in cls.model_fields:  # a problem of the whole section
        return RecipeError(cls.section, first["msg"])
    info = cls.model_fields[name]
    allowed = describe(info.annotation, info.metadata)
    if first["type"] == "missing":
        what = (info.description or "").removesuffix(".").removesuffix(" (required)")
        return RecipeError(key, f"missing; a required key: {allowed}" + (f" ({what})" if what else ""))
    value = values.get(name)
    inner, at_path = _inner_path(value, first["loc"][1:])
    if first["type"] == "finite_number":
        if inner:
            return RecipeError(f"{key}.{inner}", f"got {first['input']!r}; allowed: a finite number (not NaN or "
                                                "infinity)")
        return RecipeError(key, f"got {first['input']!r}{at_path}; allowed: a finite number (not NaN or infinity)")
    mine = [e for e in errors if e["loc"][:1] == first["loc"][:1]]
    wrong_type = all(e["type"].endswith("_type") or e["type"] == "none_required" or
                     (e["type"] == "literal_error" and not isinstance(e["input"], (str, int))) for e in mine)
    shown = repr(value) if not at_path else f"{first['input']!r}{at_path}"
    if wrong_type and not at_path:
        shown += f" ({type(value).__name__})"
    if value == "" and first["type"] == "string_too_short":  # a recipe's placeholder for the command line
        shown += f" (the recipe leaves it to the command line: add {key}=...)"
    return RecipeError(key, f"got {shown}; allowed: {allowed}{_did_you_mean(first)}")


def _inner_path(value: Any, loc: tuple) -> tuple[str, str]:
    """('rope_theta', '') for a key inside a mapping value, ('', ' at [1]') for an item of a list; pydantic's
    type tags in `loc` (the names of union members) are skipped."""
    keys, where = [], ""
    for part in loc:
        if isinstance(value, dict) and part in value:
            keys.append(str(part))
            value = value[part]
        elif isinstance(value, list) and isinstance(part, int) and part < len(value):
            where += f"[{part}]"
            value = value[part]
    return ".".join(keys), f" at {where}" if where else ""


def _did_you_mean(error: dict[str, Any]) -> str:
    """'; did you mean 'cosine'?' for a string close to one of a Literal's values."""
    if error["type"] != "literal_error" or not isinstance(error["input"], str):
        return ""
    choices = [c.strip("'") for c in error["ctx"]["expected"].replace(" or ", ", ").split(", ")]
    close = difflib.get_close_matches(error["input"], choices, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


# ---------------------------------------------------------------------------------------------------------------
# How a type reads: in an error ('a number in [0, 1]') and in the README ('float')
# ---------------------------------------------------------------------------------------------------------------

NOUNS = {bool: ("true/false", "true/false values"), int: ("an integer", "integers"),
         float: ("a finite number", "finite numbers"), str: ("a string", "strings")}
LONG_CHOICES = 12  # a Literal with more values is shown as its first ones and a count


def _split(hint: Any, metadata: Sequence[Any]) -> tuple[Any, list[Any]]:
    """(type, constraints) of a hint that may be Annotated[type, constraints...]."""
    if typing.get_origin(hint) is typing.Annotated:
        base, *extra = typing.get_args(hint)
        return base, [*extra, *metadata]
    return hint, list(metadata)


def _bounds(metadata: Sequence[Any]) -> str:
    """' > 0', ' in [0, 1)', '' from annotated_types constraints."""
    low = next(((m.gt, "(") for m in metadata if isinstance(m, at.Gt)), None) or \
        next(((m.ge, "[") for m in metadata if isinstance(m, at.Ge)), None)
    high = next(((m.lt, ")") for m in metadata if isinstance(m, at.Lt)), None) or \
        next(((m.le, "]") for m in metadata if isinstance(m, at.Le)), None)
    if low and high:
        return f" in {low[1]}{low[0]}, {high[0]}{high[1]}"
    if low:
        return f" {'>' if low[1] == '(' else '>='} {low[0]}"
    if high:
        return f" {'<' if high[1] == ')' else '<='} {high[0]}"
    return ""


def describe(hint: Any, metadata: Sequence[Any] = (), plural: bool = False) -> str:
    """'a number in [0, 1]', "one of 'a', 'b'", 'a list of integers > 0 or 'auto'', 'an integer or null'."""
    hint, metadata = _split(hint, metadata)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        values = [str(a).lower() if isinstance(a, bool) else repr(a) for a in args]  # true as YAML writes it
        more = f", ... ({len(args)} in all)" if len(args) > LONG_CHOICES else ""
        return " or ".join(values) if plural or len(args) == 1 else f"one of {', '.join(values[:LONG_CHOICES])}{more}"
    if origin in (typing.Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        parts = [describe(a, metadata if len(kept) == 1 else (), plural) for a in kept]  # Field(None, gt=0)
        parts += ["null"] if type(None) in args else []
        return " or ".join(parts)
    if origin is list:
        items = describe(args[0], (), plural=True) if args else "values"
        least = next((m.min_length for m in metadata if isinstance(m, at.MinLen)), 0)
        return {0: "a list of ", 1: "a non-empty list of "}.get(least, f"a list of at least {least} ") + items
    if origin is dict or hint is dict:
        return "mappings" if plural else "a mapping"
    if hint is Any:
        return "any values" if plural else "any value"
    if hint in NOUNS:
        noun = NOUNS[hint][1] if plural else NOUNS[hint][0]
        if hint is str and any(isinstance(m, at.MinLen) for m in metadata):
            noun = "non-empty " + noun if plural else "a non-empty string"
        return noun + _bounds(metadata)
    return getattr(hint, "__name__", str(hint))


def short_type(hint: Any) -> str:
    """'int', 'list[int] | null', "'auto' | 'text'": how a type reads in the README table."""
    hint, _ = _split(hint, ())
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        values = [str(a).lower() if isinstance(a, bool) else repr(a) for a in args]
        return " \\| ".join(values) if len(args) <= LONG_CHOICES else "str (a name)"
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join("null" if a is type(None) else short_type(a) for a in args)
    if origin is list:
        return f"list[{short_type(args[0])}]" if args else "list"
    if origin is dict or hint is dict:
        return "mapping"
    return getattr(hint, "__name__", str(hint))
