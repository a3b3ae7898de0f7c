"""GX's Data Docs rewritten to read offline (batchgen.report.offline_docs), on a small hand-made site of GX's shape."""

from __future__ import annotations

from batchgen.report.offline_docs import POLICY, Page, make_offline

RESULT_PAGE = """<html><head><title>result</title>
<link rel="stylesheet" href="https://cdn.example.org/bootstrap.min.css">
<script src="https://cdn.example.org/jquery.min.js"></script>
</head><body><img src="https://cdn.example.org/logo.png" alt="logo">
<script>$(function () { render(); })</script><p>Expectation Validation Result</p></body></html>"""

INDEX = """<html><head><title>index</title></head><body>
<table id="section-1" data-toggle="table" data-url="https://cdn.example.org/rows.json"></table></body></html>"""


def test_a_built_site_reads_offline_styled_with_a_static_index(tmp_path):
    site = tmp_path / "data_docs"
    result = site / "validations" / "outputs" / "first-pass.html"
    result.parent.mkdir(parents=True)
    result.write_text(RESULT_PAGE, encoding="utf-8")
    (site / "index.html").write_text(INDEX, encoding="utf-8")
    for name in ("images/logo-long.png", "fonts/unused.otf"):
        (site / "static" / name).parent.mkdir(parents=True, exist_ok=True)
        (site / "static" / name).write_bytes(b"\x00")

    make_offline(site, [Page("first pass", "validations/outputs/first-pass.html", False, 3, 2)],
                 "expectations/outputs.html")

    page = result.read_text(encoding="utf-8")
    assert "https://" not in page and "<script" not in page  # no CDN, and no script runs
    assert f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">' in page
    assert '<link rel="stylesheet" href="../../static/styles/batchgen-offline.css">' in page
    assert '<img src="../../static/images/logo-long.png" alt="logo">' in page  # the site's own logo
    assert "Expectation Validation Result" in page
    index = (site / "index.html").read_text(encoding="utf-8")
    assert 'data-toggle="table"' not in index  # GX's script-filled table, replaced by a static one
    assert ("<td><span class='text-danger'>failed</span></td>"
            "<td><a href='validations/outputs/first-pass.html'>first pass</a></td><td>2 of 3</td>") in index
    assert "Expectation suite: <a href='expectations/outputs.html'>outputs</a>" in index
    assert (site / "static" / "styles" / "batchgen-offline.css").is_file()
    assert (site / "static" / "images" / "logo-long.png").is_file()  # referenced: kept
    assert not (site / "static" / "fonts").exists()  # referenced by no page: removed, with its empty folder
