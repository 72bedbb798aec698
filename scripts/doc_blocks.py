"""The blocks the benchmark scripts write into pages (`--doc`): their markers, reading and writing them, and the
record (`--json` / `--from-json`) a block is written from. scripts/benchmark.py re-exports every name here.

    <!-- BEGIN name (scripts/script.py --doc) -->
    ... written by the script; tests/test_doc_numbers.py writes it again from the committed JSON and compares ...
    <!-- END name -->
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


def doc_markers(name: str, script: str | None = None) -> tuple[str, str]:
    """The BEGIN / END markers between which `scripts/<script>.py --doc` writes its block `name` into a page (a script
    with one block per page names it after itself: `script` defaults to `name`)."""
    return f"<!-- BEGIN {name} (scripts/{script or name}.py --doc) -->", f"<!-- END {name} -->"


DOC_BLOCK = re.compile(r"^<!-- BEGIN (\w+) \(scripts/(\w+)\.py --doc\) -->\n(.*?)^<!-- END \1 -->$",
                       re.DOTALL | re.MULTILINE)


def doc_blocks(page: str) -> dict[str, str]:
    """Every block in `page`: its name -> the text between its BEGIN line and its END line (both excluded)."""
    return {match[1]: match[3] for match in DOC_BLOCK.finditer(page)}


def doc_scripts(page: str) -> dict[str, str]:
    """Every block in `page`: its name -> the script that writes it (scripts/<script>.py)."""
    return {match[1]: match[2] for match in DOC_BLOCK.finditer(page)}


def check_doc(path: Path, name: str, script: str | None = None) -> str:
    """The page at `path` ("" for a new file); stop, before anything is measured, when it exists without the markers
    of block `name` (written by `script`, default `name`): writing there would replace a page's hand-written text with
    the tables."""
    begin, end = doc_markers(name, script)
    page = path.read_text(encoding="utf-8") if path.is_file() else ""
    if path.is_file() and not (begin in page and end in page.split(begin, 1)[1]):
        sys.exit(f"{script or name}: --doc {path} exists without the lines {begin} and {end}; put them where the "
                 "tables go (the rest of the page is kept) or name a new file")
    return page


def write_doc(path: Path, text: str, name: str, script: str | None = None) -> None:
    """`text` into `path` between the markers of block `name` (written by `script`, default `name`), the rest of the
    page kept, or as a new file."""
    page = check_doc(path, name, script)
    if page:
        begin, end = doc_markers(name, script)
        before, rest = page.split(begin, 1)
        text = before + begin + "\n" + text + end + rest.split(end, 1)[1]
    path.write_text(text, encoding="utf-8")


def record_options(parser: argparse.ArgumentParser, name: str, out: Path, committed: str) -> None:
    """The options of a benchmark whose page block is written from a record: --out (its runs), --json (the record,
    default --out/NAME.json), --doc (the page with NAME's markers) and --from-json (``committed``: the block again
    from a record, nothing measured)."""
    parser.add_argument("--out", type=Path, default=out, help="where the runs and, by default, the record go")
    parser.add_argument("--json", type=Path, default=None,
                        help=f"write the record the table is written from here (default: --out/{name}.json)")
    parser.add_argument("--doc", type=Path, default=None, help=f"a page with BEGIN / END {name} markers: the table "
                                                                "goes between them")
    parser.add_argument("--from-json", type=Path, default=None,
                        help=f"measure nothing: the table of this record ({committed})")


def record_of(args, measure, name: str) -> dict:
    """The record a page's block is written from: --from-json's, read back (nothing measured), else ``measure()``'s,
    written to --json (default --out/NAME.json) beside the runs it names."""
    if args.from_json:
        return json.loads(Path(args.from_json).read_text(encoding="utf-8"))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    record = measure()
    written = Path(args.json or Path(args.out) / f"{name}.json")
    written.parent.mkdir(parents=True, exist_ok=True)
    written.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def block_options(parser: argparse.ArgumentParser, name: str) -> None:
    """--json, --doc and --from-json of a benchmark whose page block `name` is written from one record."""
    parser.add_argument("--json", type=Path, default=None, help="write the record the block is written from here")
    parser.add_argument("--doc", type=Path, default=None, help=f"write the block between the page's {name} markers")
    parser.add_argument("--from-json", type=Path, default=None, help="measure nothing: the block of this record")


def record_block(args, measure, render, name: str) -> dict:
    """The options of `block_options` carried out: the page checked for its markers first, the record read back
    (--from-json) or ``measure()``d and kept (--json), the block ``render(record)`` printed and written (--doc)."""
    if args.doc:
        check_doc(args.doc, name)
    if args.from_json:
        record = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
    else:
        record = measure()
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    text = render(record)
    print(text)
    if args.doc:
        write_doc(args.doc, text, name)
    return record
