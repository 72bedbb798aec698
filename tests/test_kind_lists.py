"""Pages that list the kinds of draft name every kind of the registry (kinds.KINDS), so a new kind cannot be left out.

The convention a listing page follows: each registered kind is named in a code span, by its registry name alone
(`eagle3`), as a recipe selects it (`model.draft_kind: eagle3`) or as the eval JSON records it
(`"draft_kind": "eagle3"`). And wherever README.md, docs/ or recipes/ write `draft_kind: NAME`, NAME is a registered
kind (a renamed kind leaves no stale name behind).

The recipe key table of recipes/README.md is generated from the recipe schema (`python -m specdistill.recipes`) and
tested against it in tests/test_configs.py (test_readme_documents_every_key_with_its_default).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from kinds import KINDS

ROOT = Path(__file__).resolve().parents[1]
LISTING_PAGES = ("README.md", "docs/index.md", "docs/concepts/draft-kinds.md", "docs/guides/evaluate.md",
                 "docs/guides/train-head.md")
FENCED = re.compile(r"^\s*```.*?^\s*```[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`([^`]+)`")
NAMED = re.compile(r'^(?:model\.draft_kind:\s*|"draft_kind":\s*")?(\w+)"?$')
DRAFT_KIND_VALUE = re.compile(r"""\bdraft_kind["']?\s*[:=]\s*["']?(\w+)""")
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                "twelve")


def kinds_named(text: str) -> set[str]:
    """The names that the code spans of a Markdown page (its fenced blocks left out) give in one of the three forms."""
    prose = FENCED.sub("", text)
    spans = (" ".join(span.split()) for span in CODE_SPAN.findall(prose))
    return {match.group(1) for match in map(NAMED.match, spans) if match}


def test_the_convention_reads_each_form_and_nothing_else():
    text = ('a `standalone` draft, `model.draft_kind:\neagle3`, `"draft_kind": "prompt_lookup"`, `--draft pard`,\n'
            "```yaml\nx: `dflash`\n```\n`p_eagle.yaml`")
    assert kinds_named(text) == {"standalone", "eagle3", "prompt_lookup"}


@pytest.mark.parametrize("page", LISTING_PAGES)
def test_a_page_that_lists_the_kinds_names_every_kind(page):
    missing = [kind.name for kind in KINDS if kind.name not in kinds_named((ROOT / page).read_text(encoding="utf-8"))]
    assert not missing, (f"{page} lists the kinds of draft but does not name {missing} in a code span "
                         f"(`NAME`, `model.draft_kind: NAME` or `\"draft_kind\": \"NAME\"`): kinds.KINDS has them")


def test_every_draft_kind_written_in_the_docs_and_recipes_is_registered():
    names = {kind.name for kind in KINDS}
    places = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "recipes").rglob("*.md")),
              *sorted((ROOT / "recipes").rglob("*.yaml"))]
    unknown = [f"{place.relative_to(ROOT)}: draft_kind {value}" for place in places
               for value in DRAFT_KIND_VALUE.findall(place.read_text(encoding="utf-8")) if value not in names]
    assert not unknown, "draft kinds that kinds.KINDS does not hold:\n" + "\n".join(unknown)


def test_the_draft_kinds_page_counts_the_kinds():
    text = (ROOT / "docs" / "concepts" / "draft-kinds.md").read_text(encoding="utf-8")
    count = re.search(r"has (\w+) kinds of draft", text)
    assert count, "docs/concepts/draft-kinds.md no longer says how many kinds of draft there are"
    assert count.group(1) == NUMBER_WORDS[len(KINDS)], f"draft-kinds.md says {count.group(1)}; there are {len(KINDS)}"
