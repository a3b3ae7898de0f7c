"""The run report and its Data Docs in headless Chromium with no network: styled, complete, no request sent."""

from __future__ import annotations

from tests.browser import browser_page, open_page, screenshot
from tests.e2e.report_checks import assert_styled, check_data_docs_index, record_requests
from tests.unit.batchgen.report.publication import make_publication
from batchgen.report import write_report


def test_report_and_data_docs_read_offline_and_run_no_script(tmp_path):
    root = tmp_path / "run"
    make_publication(root)  # one output holds a <script>: GX writes it into its page unescaped
    write_report(root)
    with browser_page() as page:
        requests, dialogs = record_requests(page), []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        open_page(page, root / "report.html", wait_for_text="run report")
        page.get_by_text("Prompt and settings").wait_for()
        check_data_docs_index(page, root)
        assert_styled(page)
        assert "Evaluated Expectations" in page.inner_text("body")
        screenshot(page, "report-data-docs-offline", full_page=False)
        assert dialogs == []  # the output's alert() never ran
        assert [url for url in requests if not url.startswith(("file:", "data:"))] == []
