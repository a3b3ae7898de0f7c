
"""GX Data Docs of a run (batchgen.report.datadocs): relative links that survive a move, rebuilt from scratch,
readable with no network."""

from __future__ import annotations

import json
import re
import shutil

from batchgen.report import DATA_DOCS, write_report
from batchgen.report.offline_docs import POLICY


def test_data_docs_are_built_with_relative_links_that_survive_a_move(published, tmp_path):
    root, _, page = published
    links = re.findall(r'<a (?:id="data-docs"|class="docs-page") href="([^"]+)"', page)
    assert links[0] == f"{DATA_DOCS}/index.html" and len(links) == 4  # index, suite, first pass, retry 1
    moved = tmp_path / "moved"
    shutil.copytree(root, moved)
    for link in links:
        assert not link.startswith(("/", "file:")), link
        target = moved / link
        assert target.is_file(), link
    first_pass = (moved / links[2]).read_text(encoding="utf-8")
    assert "Expectation Validation Result" in first_pass and "first-pass" in first_pass
    assert "Output length between 10 and 40 characters" in first_pass  # the suite's own descriptions

def test_rebuilding_replaces_the_report_and_data_docs(published):
    root, _, _ = published
    stale = root / DATA_DOCS / "stale.html"
    stale.write_text("old", encoding="utf-8")
    write_report(root)
    assert not stale.exists() and (root / DATA_DOCS / "index.html").is_file()

def test_data_docs_need_no_network_and_carry_only_what_they_use(report):
    root, _ = report
    site = root / DATA_DOCS
    pages = list(site.rglob("*.html"))
    assert len(pages) == 4  # index, suite, two passes
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"<(script|link|img)\b[^>]*(src|href)=[\"']https?://", text), page
        assert "<script" not in text.split("</head>")[0] and POLICY in text
    index = (site / "index.html").read_text(encoding="utf-8")
    links = re.findall(r"<a href='(validations/[^']+)'>([^<]+)</a>", index)
    assert [label for _, label in links] == ["first pass", "retry 1"]
    assert all((site / href).is_file() for href, _ in links)
    assert not list(site.rglob("*.otf"))  # GX's fonts: no page uses them
    assert sum(path.stat().st_size for path in site.rglob("*") if path.is_file()) < 150_000


def test_a_run_with_nothing_validated_gets_no_data_docs_and_the_page_says_so(published, tmp_path):
    root = tmp_path / "run"
    shutil.copytree(published[0], root)  # with the Data Docs of its validation
    (root / "validation.json").write_text(json.dumps([]), encoding="utf-8")  # every item rejected before generation
    page = write_report(root).read_text(encoding="utf-8")
    assert not (root / DATA_DOCS).exists()  # the earlier site is gone, not left to contradict the page
    assert "Nothing was validated: no Data Docs." in page and 'id="data-docs"' not in page
