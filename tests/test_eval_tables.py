"""scripts/eval_tables.py: a page other than a table's own gets only the tables whose markers it holds, a table's own
page must hold every one of its markers before anything is written, and the cells read as the pages show them (an
exact zero as 0, a sampled run's greedy match empty, numbers right-aligned). The blocks on the pages themselves are
checked against their JSON by tests/test_doc_numbers.py."""
from __future__ import annotations

import pytest

from scripts import eval_tables
from scripts.benchmark import doc_blocks, doc_markers, doc_scripts


def markers(name: str) -> str:
    begin, end = doc_markers(name, eval_tables.SCRIPT)
    return f"{begin}\nold\n{end}\n"


def test_a_scratch_page_gets_the_tables_whose_markers_it_holds(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"# Page\n\n{markers('real_target_lookup')}\nkept\n\n{markers('heads_dflash')}", encoding="utf-8")
    written = eval_tables.main(["--doc", str(page)])
    text = page.read_text(encoding="utf-8")
    assert list(written) == ["real_target_lookup", "heads_dflash"]
    assert doc_blocks(text) == written and "old" not in text and "\nkept\n" in text
    assert set(doc_scripts(text).values()) == {"eval_tables"}


def test_a_page_without_markers_is_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Page\n", encoding="utf-8")
    with pytest.raises(SystemExit):
        eval_tables.main(["--doc", str(page)])
    assert page.read_text(encoding="utf-8") == "# Page\n"


def test_a_tables_own_page_missing_a_marker_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(eval_tables, "BENCHMARKS", tmp_path)  # the pages (and the JSON, never reached) live here
    page = tmp_path / "heads.md"
    page.write_text(markers("heads_dflash"), encoding="utf-8")  # heads_small_pair's markers missing
    with pytest.raises(SystemExit):
        eval_tables.main(["--doc", str(page)])
    assert page.read_text(encoding="utf-8") == markers("heads_dflash")


def test_cells_read_as_the_pages_show_them():
    assert eval_tables.number(0.0, ".2f") == "0" and eval_tables.number(0.004, ".2f") == "0.00"
    assert eval_tables.number(None, ".2f") == "" and eval_tables.number(1.234, ".2f", "x") == "1.23x"
    lines = eval_tables.table_text("real_target_90min").splitlines()
    rule, sampled = lines[1].strip("|").split("|"), lines[-1].strip("|").split("|")
    assert rule[0].startswith(":") and rule[-1].endswith(":")  # the label left, the greedy count right
    assert sampled[-1].strip() == "" and "T=1" in sampled[0]  # no greedy match at T=1
    assert "**" in lines[2]  # the first row's speedup in bold


def test_gpu_tables_pick_the_path_and_name_sampling():
    decode = eval_tables.table_text("gpu_h100_decode").splitlines()
    assert decode[0].split("|")[3].strip() == "acceptance_rate"  # bench_decode.py's header, not the column's key
    assert [line.split("|")[1].strip() for line in decode[2:]] == ["eager", "eager", "compiled", "compiled"]
    assert len({line.split("|")[7] for line in decode[2:]}) == 4  # each row its own result: four plain tok/s
    head = eval_tables.table_text("gpu_h200_head512").splitlines()
    sampled = [line for line in head if "(sampling)" in line]
    assert len(sampled) == 1 and "| 1.0 |" in sampled[0]  # the T=1 row, and only it
