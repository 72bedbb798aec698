"""One source for every number: each table a script writes between a page's markers is written again here from the
committed JSON alone (the script's own --doc run, measuring nothing) and must equal the page's block to the character;
the README's headline table is such a block (scripts/readme_table.py), and so are the eval tables of the benchmark
pages (scripts/eval_tables.py, one block per table); the figures the README quotes in its sentences are checked
against the JSON they come from. An edited number in a copy of each page is caught."""
from __future__ import annotations

import importlib
import re
import shutil
from itertools import zip_longest
from pathlib import Path

import pytest

from scripts import eval_tables, readme_table
from scripts.benchmark import doc_blocks, doc_markers, doc_scripts

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# (page, block) -> the arguments of the block's script that write it from committed JSON alone (paths from the
# repository); a block is named after its script unless the script writes several (its markers name the script)
BLOCKS = {
    ("README.md", "readme_table"): [],
    ("docs/benchmarks/real_target.md", "plot_real_target"): [],
    ("docs/benchmarks/real_target.md", "bench_real_target"):
        ["--from-json", "docs/benchmarks/real_target/bench_real_target.json"],
    ("docs/benchmarks/heads.md", "bench_heads"): ["--from-json", "docs/benchmarks/heads/bench_heads.json"],
    ("docs/benchmarks/head_objectives.md", "bench_heads_objectives"):
        ["--from-json", "docs/benchmarks/head_objectives/bench_heads_objectives.json"],
    ("docs/benchmarks/head_objectives.md", "bench_heads_objectives_90min"):
        ["--from-json", "docs/benchmarks/head_objectives/bench_heads_objectives_90min.json"],
    ("docs/benchmarks/head_objectives.md", "bench_heads_objectives_eos"):
        ["--from-json", "docs/benchmarks/head_objectives/bench_heads_objectives_eos.json"],
    ("docs/benchmarks/decode.md", "bench_step_overhead"):
        ["--from-json", "docs/benchmarks/step_overhead/cpu_xeon_amx.json"],
    ("docs/benchmarks/decode.md", "bench_sampling"): ["--from-json", "docs/benchmarks/decode/sampling.json"],
    ("docs/benchmarks/decode.md", "bench_revisions"): ["--from-json", "docs/benchmarks/decode/revisions.json"],
    ("docs/benchmarks/teacher_cache.md", "bench_teacher_cache"):
        ["--from-json", "docs/benchmarks/teacher_cache/cpu.json"],
    ("docs/benchmarks/trainer_vs_gkd.md", "bench_trainer_forward_kl"):
        ["--from-json", "docs/benchmarks/trainer_vs_gkd/forward_kl.json"],
    ("docs/benchmarks/trainer_vs_gkd.md", "bench_trainer_jsd"):
        ["--from-json", "docs/benchmarks/trainer_vs_gkd/jsd.json"],
    ("docs/benchmarks/trainer_vs_gkd.md", "bench_trainer_summary"):
        ["--from-json", "docs/benchmarks/trainer_vs_gkd/forward_kl.json", "docs/benchmarks/trainer_vs_gkd/jsd.json"],
    ("docs/benchmarks/serving.md", "bench_serving"): ["--from-json", "docs/benchmarks/serving/bench_serving.json"],
    ("docs/benchmarks/serving.md", "bench_target_data"):
        ["--from-json", "docs/benchmarks/serving/target_data.json"],
    ("docs/benchmarks/responses.md", "bench_responses"):
        ["--from-json", "docs/benchmarks/responses/bench_responses.json"],
    ("docs/benchmarks/served.md", "bench_served"): ["--out", "docs/benchmarks/served"],  # its runs' JSON, reused
    **{(f"docs/benchmarks/{table.page}", name): [] for name, table in eval_tables.TABLES.items()},
}


SCRATCH_OUT = {"plot_real_target"}  # scripts that also draw: here into a scratch --out, not over the committed PNGs


def script_of(page: str, block: str) -> str:
    """The script that writes `block` of `page`, as its BEGIN line names it."""
    return doc_scripts((ROOT / page).read_text(encoding="utf-8"))[block]


def command(page: str, block: str) -> str:
    """What writes the block again, as typed from the repository root."""
    return " ".join([".venv/bin/python", f"scripts/{script_of(page, block)}.py", *BLOCKS[page, block], "--doc", page])


def first_difference(shown: str, expected: str) -> str | None:
    """None when the page's block is the JSON's, else its first differing line, both ways."""
    pairs = zip_longest(shown.split("\n"), expected.split("\n"), fillvalue="(no line)")
    for number, (a, b) in enumerate(pairs, 1):
        if a != b:
            return f"line {number} of the block: the page has\n  {a!r}\nits JSON gives\n  {b!r}"
    return None


RULE = re.compile(r"^\|[-:| ]+\|$")  # a markdown table's rule line, under its header


def body_rows(block: str) -> list[int]:
    """The indices of the block's table rows (under a header and its rule)."""
    lines = block.split("\n")
    return [i for i, line in enumerate(lines) if line.startswith("|") and not RULE.match(line)
            and not (i + 1 < len(lines) and RULE.match(lines[i + 1]))]


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def quoted_differences(readme: str) -> list[str]:
    """What the README quotes outside its table, against the JSON: the quickstart head's tau and speedup wherever
    "tau T, Sx" appears, the quickstart's minutes wherever "N.N min" does, and plain decoding's tokens/s over the
    table's runs."""
    figures, plain = readme_table.quickstart_figures(), readme_table.plain_tokens_per_s()
    minutes = readme_table.quickstart_minutes()
    quoted_figures = re.findall(r"tau \d+\.\d+, \d+\.\d+x", readme)
    quoted_plain = re.findall(r"plain decoding (\d+-\d+)\s+tokens/s", readme)
    wrong = [f"{quoted!r} ({readme_table.QUICKSTART[0]} gives {figures!r})"
             for quoted in quoted_figures if quoted != figures]
    wrong += [f"plain decoding {quoted} tokens/s (the table's JSON give {plain})"
              for quoted in quoted_plain if quoted != plain]
    quoted_minutes = re.findall(r"\d+\.\d+ min\b", readme)
    wrong += [f"{quoted!r} ({readme_table.QUICKSTART_RUN} gives {minutes!r})"
              for quoted in quoted_minutes if quoted != minutes]
    return wrong + [f"no {what} in the README" for what, found in (("'tau T, Sx'", quoted_figures),
                                                                   ("'plain decoding N-M tokens/s'", quoted_plain),
                                                                   ("'N.N min'", quoted_minutes))
                    if not found]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[tuple[str, str], str]:
    """Each block as its script writes it from the committed JSON: the script's --doc run on a page holding only its
    markers."""
    blocks = {}
    for (page, block), args in BLOCKS.items():
        script = script_of(page, block)
        scratch = tmp_path_factory.mktemp(block)
        begin, end = doc_markers(block, script)
        target = scratch / "page.md"
        target.write_text(f"{begin}\n{end}\n", encoding="utf-8")
        paths = [arg if arg.startswith("--") else str(ROOT / arg) for arg in args]
        out = ["--out", str(scratch / "plots")] if script in SCRATCH_OUT else []
        importlib.import_module(f"scripts.{script}").main([*paths, *out, "--doc", str(target)])
        blocks[page, block] = doc_blocks(target.read_text(encoding="utf-8"))[block]
    return blocks


def test_every_block_on_every_page_is_checked_here():
    found = {(str(page.relative_to(ROOT)), block) for page in PAGES for block in
             doc_blocks(page.read_text(encoding="utf-8"))}
    assert found == set(BLOCKS), "a page's block without its check here (or a check without its block)"


@pytest.mark.parametrize("page, name", list(BLOCKS), ids=[f"{p}:{s}" for p, s in BLOCKS])
def test_the_block_is_its_json(rendered, page, name):
    block = doc_blocks((ROOT / page).read_text(encoding="utf-8"))[name]
    difference = first_difference(block, rendered[page, name])
    assert difference is None, f"{page}, block {name} differs from its JSON at {difference}\n" \
                               f"write it again: {command(page, name)}"


def test_the_readme_quotes_the_json():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert quoted_differences(readme) == []
    assert readme.count(readme_table.quickstart_figures()) == 2  # the quickstart's paragraph and its command's comment
    assert readme.count(readme_table.quickstart_minutes()) == 2


def edit_a_number(block: str) -> str:
    """`block` with the last digit of the first decimal number of its first table row (after the row's label) moved
    by one."""
    lines = block.split("\n")
    first = body_rows(block)[0]
    _, label, rest = lines[first].split("|", 2)
    number = re.search(r"\d\.\d+", rest)
    digit = int(rest[number.end() - 1])
    lines[first] = f"|{label}|{rest[:number.end() - 1]}{(digit + 1) % 10}{rest[number.end():]}"
    return "\n".join(lines)


@pytest.mark.parametrize("page, name", list(BLOCKS), ids=[f"{p}:{s}" for p, s in BLOCKS])
def test_an_edited_number_in_a_copy_of_the_page_is_caught(rendered, tmp_path, page, name):
    copy = tmp_path / Path(page).name
    shutil.copy(ROOT / page, copy)
    block = doc_blocks(copy.read_text(encoding="utf-8"))[name]
    edited = edit_a_number(block)
    assert edited != block and len(edited) == len(block)
    copy.write_text(copy.read_text(encoding="utf-8").replace(block, edited), encoding="utf-8")
    shown = doc_blocks(copy.read_text(encoding="utf-8"))[name]
    assert first_difference(block, rendered[page, name]) is None
    assert first_difference(shown, rendered[page, name]) is not None


def test_an_edited_quoted_figure_in_a_copy_of_the_readme_is_caught(tmp_path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    figures = readme_table.quickstart_figures()  # "tau 1.31, 1.09x": its last digit moved by one
    wrong_tau = readme.replace(figures, f"{figures[:-2]}{(int(figures[-2]) + 1) % 10}x", 1)
    wrong_plain = re.sub(r"plain decoding (\d+)-", lambda m: f"plain decoding {int(m[1]) + 1}-", readme, count=1)
    minutes = readme_table.quickstart_minutes()  # "21.5 min": its tenths moved by one
    wrong_minutes = readme.replace(minutes, f"{minutes[:-5]}{(int(minutes[-5]) + 1) % 10} min", 1)
    for wrong in (wrong_tau, wrong_plain, wrong_minutes):
        assert wrong != readme
        (tmp_path / "README.md").write_text(wrong, encoding="utf-8")
        assert len(quoted_differences((tmp_path / "README.md").read_text(encoding="utf-8"))) == 1
