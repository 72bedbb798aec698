"""The docs site (mkdocs.yml): it builds with --strict (no broken link between pages, no missing nav page, no
mkdocstrings warning), every page under docs/ is in the nav or deliberately left out of it, and every link into the
repository outside docs/ (mkdocs.yml, "Link policy") names a path that exists."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from mkdocs.config import load_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"
SNIPPET = re.compile(r'^--8<-- "([^":]+)(?::[\w-]+)?"\s*$', re.MULTILINE)  # a whole-line pymdownx.snippets include


def config():
    return load_config(config_file=str(CONFIG))


def nav_pages(nav) -> list[str]:
    """The .md paths of a nav (nested lists of paths and {title: path-or-list} mappings)."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return [page for item in nav or [] for page in nav_pages(item)]


def test_site_builds_strictly(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's end-of-life banner
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(CONFIG),
                          "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    problems = [line for line in (run.stdout + run.stderr).splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert run.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(problems or [run.stderr[-3000:]])
    assert (tmp_path / "site" / "reference" / "api" / "index.html").is_file()


def test_every_nav_page_exists():
    missing = [page for page in nav_pages(config()["nav"]) if not (DOCS / page).is_file()]
    assert not missing, f"mkdocs.yml's nav lists pages that do not exist under docs/: {missing}"


def test_every_page_is_in_the_nav_or_deliberately_left_out():
    cfg = config()
    listed = set(nav_pages(cfg["nav"]))
    left_out = [spec for spec in (cfg["not_in_nav"], cfg["exclude_docs"]) if spec is not None]
    orphans = [page for page in (p.relative_to(DOCS).as_posix() for p in sorted(DOCS.rglob("*.md")))
               if page not in listed and not any(spec.match_file(page) for spec in left_out)]
    assert not orphans, f"pages under docs/ in neither mkdocs.yml's nav nor its not_in_nav: {orphans}"


def test_links_into_the_repository_name_existing_paths():
    """Pages, and the files outside docs/ they include, link to the repository as REPO_URL/blob|tree/main/PATH."""
    link = re.compile(re.escape(config()["repo_url"].rstrip("/")) + r"/(?:blob|tree)/main/([^)\s\"'#>?]+)")
    pages = sorted(DOCS.rglob("*.md"))
    included = {ROOT / path for page in pages for path in SNIPPET.findall(page.read_text())}
    assert included, "no page includes a file with --8<-- (docs/changelog.md includes CHANGELOG.md)"
    broken = [f"{source.relative_to(ROOT)}: {path}" for source in [*pages, *sorted(included)]
              for path in link.findall(source.read_text()) if not (ROOT / path.rstrip("/")).exists()]
    assert not broken, "links to paths that do not exist in the repository:\n" + "\n".join(broken)
