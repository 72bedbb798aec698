"""The typed-field machinery of recipes: RecipeError, `option(default, help)`, and the type/range checks every
recipe section runs in its `__post_init__` (lossless coercion, messages naming the key, the value and what is allowed).

Every number of every section, in a file or an override, also passes here: NaN and infinities are refused for
every field (nested values of a mapping such as model.draft_config included), since no recipe key means anything
with them.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import field
from typing import Any, Literal

OVERRIDE_SOURCE = "command-line override"



class RecipeError(ValueError):
    """A recipe key is unknown, has the wrong type or is out of range. The message names key, source and value."""

    def __init__(self, key: str, problem: str, source: str | None = None):
        self.key, self.problem, self.source = key, problem, source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{key}: {problem}")

    def located(self, section: str, source: str) -> "RecipeError":
        """The same error with the key prefixed by its section and the source (file or override) attached."""
        key = self.key if self.key.startswith(f"{section}.") else f"{section}.{self.key}"
        return RecipeError(key, self.problem, source)


def option(default: Any, help: str) -> Any:
    """A dataclass field with a default (copied for lists and dicts) and a one-line help for the README."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


# ---------------------------------------------------------------------------------------------------------------
# Type and range checks used by every section's __post_init__
# ---------------------------------------------------------------------------------------------------------------

def _describe(hint: Any) -> str:
    """'an int', 'one of ...', 'a list of int or null': how a type hint reads in an error message."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _describe(a) for a in args)
    if origin is list:
        plural = {int: "integers", float: "numbers", str: "strings", bool: "true/false values"}

        def many(item: Any) -> str:  # list[int | Literal['auto']] reads "a list of integers or 'auto'"
            if typing.get_origin(item) in (typing.Union, types.UnionType):
                return " or ".join(many(a) for a in typing.get_args(item))
            if typing.get_origin(item) is Literal:
                return " or ".join(repr(a) for a in typing.get_args(item))
            return plural.get(item, _describe(item))
        return f"a list of {many(args[0])}" if args else "a list"
    if origin is dict:
        return "a mapping"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


def short_type(hint: Any) -> str:
    """'int', 'list[int] | null', "'auto' | 'text'": how a type hint reads in the README table."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return " \\| ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join("null" if a is type(None) else short_type(a) for a in args)
    if origin is list:
        return f"list[{short_type(args[0])}]"
    if origin is dict:
        return "mapping"
    return getattr(hint, "__name__", str(hint))


def _coerce(value: Any, hint: Any) -> tuple[bool, Any]:
    """(ok, value) where value is converted only where it is lossless: int -> float, '1e-4' -> float."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True, value
    if origin is Literal:
        return value in args, value
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            ok, converted = (value is None, None) if arg is type(None) else _coerce(value, arg)
            if ok:
                return True, converted
        return False, value
    if origin is list:
        if not isinstance(value, list):
            return False, value
        items = [_coerce(v, args[0]) if args else (True, v) for v in value]
        return all(ok for ok, _ in items), [v for _, v in items]
    if origin is dict:
        return isinstance(value, dict), value
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
            try:
                return True, float(value)
            except ValueError:
                return False, value
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        try:
            return is_number, float(value) if is_number else value
        except OverflowError:  # an integer beyond float range
            return False, value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is str:
        return isinstance(value, str), value
    return isinstance(value, hint), value


def non_finite(value: Any, where: str = "") -> tuple[str, float] | None:
    """(where, number) of the first NaN or infinity in a value, looking inside lists and mappings; else None.
    `where` is '' for the value itself, '[i]' for a list item, '.key' for a mapping's key."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = non_finite(item, f"{where}.{key}" if isinstance(value, dict) else f"{where}[{key}]")
        if found is not None:
            return found
    return None


def check_types(instance: Any) -> None:
    """Check (and losslessly convert) every field of a dataclass instance against its type hint, and refuse NaN
    and infinities anywhere in it."""
    hints = typing.get_type_hints(type(instance))
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        ok, converted = _coerce(value, hints[f.name])
        if not ok:
            raise RecipeError(f.name, f"got {value!r} ({type(value).__name__}); allowed: {_describe(hints[f.name])}")
        found = non_finite(converted)
        if found is not None:
            where, number = found
            key, at = (f.name + where, "") if where.startswith(".") else (f.name, f" at {where}" if where else "")
            raise RecipeError(key, f"got {number!r}{at}; allowed: a finite number (not NaN or infinity)")
        object.__setattr__(instance, f.name, converted)


def require(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise RecipeError for `key` unless `ok`."""
    if not ok:
        raise RecipeError(key, f"got {value!r}; allowed: {allowed}")
