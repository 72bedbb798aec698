"""scripts/plot_real_target.py: every plot of docs/benchmarks/real_target.md is drawn from the committed JSON into
--out as a non-empty PNG, a benchmark page shows each one (real_target.md, or serving.md for vLLM under load), and the
page's data-curve table is the one data_curve.json gives."""
from __future__ import annotations

from pathlib import Path

from scripts import plot_real_target
from scripts.benchmark import doc_markers

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks" / "real_target.md"
SHOWN_ON = {"concurrency.png": ROOT / "docs" / "benchmarks" / "serving.md"}  # the other plots are on PAGE
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_every_plot_written_as_a_png(tmp_path):
    written = plot_real_target.main(["--out", str(tmp_path / "plots")])
    names = sorted(path.name for path in written)
    assert names == sorted(plot_real_target.PLOTS) and len(names) >= 5
    for path in written:
        data = path.read_bytes()
        assert data.startswith(PNG_SIGNATURE), f"{path.name} is not a PNG"
        assert len(data) > 10_000, f"{path.name} is {len(data)} bytes: an empty figure?"
    assert not (tmp_path / "real_target.md").exists()  # without --doc no page is written


def test_the_page_shows_every_plot_and_the_committed_pngs_exist():
    for name in plot_real_target.PLOTS:
        page = SHOWN_ON.get(name, PAGE)
        assert f"](real_target/{name})" in page.read_text(encoding="utf-8"), f"{page.name} does not show {name}"
        assert (ROOT / "docs" / "benchmarks" / "real_target" / name).stat().st_size > 10_000


def test_the_data_curve_table_on_the_page_is_data_curve_json():
    begin, end = doc_markers("plot_real_target")
    page = PAGE.read_text(encoding="utf-8")
    assert begin in page and end in page
    block = page.split(begin, 1)[1].split(end, 1)[0].strip("\n")
    table = plot_real_target.curve_table().strip("\n")
    assert block == table, "the page's data curve differs from data_curve.json: run scripts/plot_real_target.py --doc"
    rows = plot_real_target.curve_rows()
    assert len(block.splitlines()) == len(rows) + 2  # header, rule, one line per row
    first = [c.strip() for c in block.splitlines()[2].strip("|").split("|")]
    assert first[:3] == [str(rows[0]["prompts"]), rows[0]["data"], str(rows[0]["steps"])]
    assert first[7] == f"{rows[0]['tau_gamma4']:.2f}"


def test_doc_writes_the_table_between_the_markers_and_keeps_the_rest(tmp_path):
    begin, end = doc_markers("plot_real_target")
    page = tmp_path / "page.md"
    page.write_text(f"# Page\n\nsetup\n\n{begin}\nold table\n{end}\n\nfindings\n")
    plot_real_target.main(["--out", str(tmp_path / "plots"), "--doc", str(page)])
    text = page.read_text()
    assert "old table" not in text
    assert text == f"# Page\n\nsetup\n\n{begin}\n{plot_real_target.curve_table()}{end}\n\nfindings\n"
