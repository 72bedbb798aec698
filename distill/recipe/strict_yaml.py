"""YAML reading that refuses a key given twice in one mapping (PyYAML keeps the last one silently), and reads
`1e-4` as a number (YAML 1.2; PyYAML's YAML 1.1 wants a dot and reads it as a string).

A recipe with `train:` twice would otherwise lose every key of the first `train:` section to the defaults.
"""
from __future__ import annotations

import re
from typing import Any

import yaml


class DuplicateKeyError(ValueError):
    """A mapping holds the same key twice; `line` (1-based) is where it appears the second time."""

    def __init__(self, key: Any, line: int, first_line: int):
        self.key, self.line, self.first_line = key, line, first_line
        super().__init__(f"key {key!r} appears twice (lines {first_line} and {line}); keep one of them")


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader whose mappings refuse duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise DuplicateKeyError(key, line, seen[key])
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$")  # 1e-4, 2.5E3 (YAML 1.2 floats)
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT_FLOAT, list("-+0123456789"))


def safe_load_strict(text: str) -> Any:
    """yaml.safe_load(text), raising DuplicateKeyError for a key given twice in one mapping."""
    return yaml.load(text, Loader=_StrictLoader)


def key_lines(text: str) -> dict[str, int]:
    """'section.key' (and deeper dotted paths) -> the 1-based line where the key is written, for messages."""
    lines: dict[str, int] = {}

    def walk(node: yaml.Node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    name = prefix + key.value
                    lines.setdefault(name, key.start_mark.line + 1)
                    walk(value, name + ".")
    walk(yaml.compose(text, Loader=_StrictLoader), "")
    return lines
