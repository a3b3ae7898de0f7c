"""What a reader of a run's report.html checks, in headless Chromium (used by the engine end-to-end test)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.browser import browser_page, open_page, screenshot


def publication_dir(out: Path) -> Path:
    """The published directory: `<out>/current` when the output keeps publications side by side, else `out`."""
    return (out / "current").resolve() if (out / "current" / "manifest.json").is_file() else out


def check_report_in_browser(out: Path, manifest: dict, name: str) -> Path:
    """Open report.html offline: every chart is a decoded image, the counts are the manifest's, Data Docs open.

    Returns the screenshot's path (test-artifacts/<name>.png).
    """
    root = publication_dir(Path(out))
    on_disk = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    assert on_disk["counts"] == manifest["counts"]
    with browser_page() as page:
        requests = record_requests(page)
        open_page(page, root / "report.html", wait_for_text="run report")
        charts = page.eval_on_selector_all(
            "img.chart", "imgs => imgs.map(i => ({alt: i.alt, complete: i.complete, width: i.naturalWidth}))")
        assert [c["alt"] for c in charts] == ["Finish reasons per attempt", "Output length against the expected bounds",
                                              "Pass rate per expectation", "Throughput over the run"]
        assert all(c["complete"] and c["width"] > 0 for c in charts), charts

        shown = page.eval_on_selector_all(
            "[data-count]", "els => Object.fromEntries(els.map(e => [e.dataset.count, e.textContent.trim()]))")
        counts, tokens = manifest["counts"], manifest["tokens"]
        for key in ("items", "accepted", "rejected", "truncated_first_pass", "truncated_final", "retry_attempts",
                    "reused"):
            assert shown[key] == str(counts[key]), (key, shown[key], counts[key])
        assert shown["generated_this_run"] == str(tokens["generated_this_run"])
        reasons = page.eval_on_selector_all(
            "[data-reason]", "els => Object.fromEntries(els.map(e => [e.dataset.reason, Number(e.textContent)]))")
        assert reasons == counts["rejected_by_reason"]
        accepted_rows = page.locator("#accepted-sample tr").count() - 1
        assert accepted_rows == min(10, counts["accepted"]) or (counts["accepted"] == 0 and accepted_rows == 1)
        shot = screenshot(page, name)

        docs = page.get_attribute("#data-docs", "href")
        assert (root / docs).is_file(), docs
        first_pass = page.locator("a.docs-page", has_text="first pass")
        first_pass.click()
        page.wait_for_load_state("load")
        assert page.url.startswith((root / "data_docs").as_uri())
        page.get_by_text("Expectation Validation Result").first.wait_for()
        assert "Evaluated Expectations" in page.inner_text("body")
        assert_styled(page)
        screenshot(page, f"{name}-data-docs", full_page=False)
        check_data_docs_index(page, root)
        assert not [url for url in requests if not url.startswith(("file:", "data:"))], requests
    return shot


def record_requests(page) -> list[str]:
    """Every URL the page asks for from now on (the browser helper aborts those that would leave the machine)."""
    seen: list[str] = []
    page.on("request", lambda request: seen.append(request.url))
    return seen


def assert_styled(page) -> None:
    """The page's own stylesheet applied: tables collapse their borders and the body font is not the default."""
    style = page.evaluate("""() => ({font: getComputedStyle(document.body).fontFamily,
        table: getComputedStyle(document.querySelector('table')).borderCollapse,
        sheets: [...document.styleSheets].filter(s => s.href).map(s => s.href)})""")
    assert style["table"] == "collapse" and style["font"].startswith("system-ui"), style
    assert any(href.endswith("batchgen-offline.css") for href in style["sheets"]), style


def check_data_docs_index(page, root: Path) -> None:
    """GX's index, offline: a static table that links every validation page (GX builds it with CDN scripts)."""
    open_page(page, root / "data_docs" / "index.html", wait_for_text="Validation Results")
    assert_styled(page)
    links = page.eval_on_selector_all("table.ge-index-static a", "as => as.map(a => a.textContent.trim())")
    assert links and links[0] == "first pass", links
    page.locator("table.ge-index-static a", has_text="first pass").click()
    page.wait_for_load_state("load")
    page.get_by_text("Expectation Validation Result").first.wait_for()


def check_report_rebuilds_the_same(root: Path, tmp: Path) -> None:
    """The publish step's report and Data Docs (its charts and figures from what the publication's writer added up
    as it staged the windows, made in-process or by report workers) are the ones `batchgen report` rebuilds, in
    process, from the sealed tables alone."""
    import shutil

    import batchgen.report.worker as worker_module
    from batchgen.report import REPORT, write_report
    from tests.unit.batchgen.report.test_worker import site, without_ids

    copy = tmp / f"rebuilt-{root.name}"
    shutil.copytree(root, copy)
    (copy / REPORT).unlink()
    workers, worker_module._workers = worker_module._workers, []  # in-process, as `batchgen report` does it
    try:
        write_report(copy)
    finally:
        worker_module._workers = workers
    assert site(root) == site(copy)
    assert (without_ids((root / REPORT).read_text(encoding="utf-8"))
            == without_ids((copy / REPORT).read_text(encoding="utf-8")))
