"""Headless Chromium for tests: Debian's /usr/bin/chromium driven by Playwright (never a downloaded browser).

    from tests.browser import browser_page, screenshot

    def test_page(page):                       # the `page` fixture: import it into the test module
        page.goto(url); page.get_by_text("Completed").wait_for(); screenshot(page, "ui-flow-run")

    with browser_page() as page:               # or as a context manager, anywhere
        open_page(page, "file:///.../report.html", wait_for_text="run report")

`make browser` installs Chromium (`make test` depends on it). Screenshots go to
`test-artifacts/<name>.png`. With `offline=True` (the default) every request that is not
to a file: URL or a loopback address is aborted, so a page that pulls from a CDN fails
fast here as it would for a reader without network.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

CHROMIUM = Path(os.environ.get("BATCHGEN_CHROMIUM", "/usr/bin/chromium"))
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}


def _local(url: str) -> bool:
    parsed = urlparse(url)
    if parsed.scheme in ("file", "data", "blob", "about"):
        return True
    host = (parsed.hostname or "").lower()
    return host in LOCAL_HOSTS or host.startswith("127.")


@contextlib.contextmanager
def browser_page(width: int = 1280, height: int = 900, offline: bool = True) -> Iterator["Page"]:  # noqa: F821
    """A fresh page in a headless Chromium; closed (browser and all) on exit."""
    if not CHROMIUM.exists():
        raise RuntimeError(f"{CHROMIUM} is missing: run `make browser` (installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": width, "height": height})
            if offline:
                context.route(re.compile(r".*"),
                              lambda route: route.continue_() if _local(route.request.url) else route.abort())
            yield context.new_page()
        finally:
            browser.close()


def open_page(page, url: str, wait_for_text: str | None = None, timeout_ms: float = 30_000):
    """Open a URL (a path is turned into a file: URL) and wait until the text is on the page."""
    if isinstance(url, Path) or "://" not in str(url):
        url = Path(url).resolve().as_uri()
    page.goto(str(url), wait_until="load", timeout=timeout_ms)
    if wait_for_text is not None:
        page.get_by_text(wait_for_text).first.wait_for(timeout=timeout_ms)
    return page


def screenshot(page, name: str, full_page: bool = True) -> Path:
    """Save the page as test-artifacts/<name>.png and return the path."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


@pytest.fixture
def page():
    """A headless Chromium page (offline); import this fixture into a test module to use it."""
    with browser_page() as opened:
        yield opened
