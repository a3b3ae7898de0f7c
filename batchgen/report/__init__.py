"""The run report: `report.html` (offline, charts embedded) and GX Data Docs in a publication directory.

Everything here is a function of the publication directory alone (manifest.json, the Parquet tables,
validation.json), so `batchgen report RUN_DIR` rebuilds exactly what the publish step wrote. The modules:
`read` (the publication), `figures` (its numbers), `charts` (their images), `page` (the HTML page and the
markdown), `datadocs` (GX's Data Docs site) and `offline_docs` (that site, rewritten to read offline).
"""

from __future__ import annotations

import threading
from pathlib import Path

from batchgen.files import write_text as write_text_atomic
from batchgen.report.datadocs import DATA_DOCS, build_data_docs
from batchgen.report.page import REPORT, figures_markdown, render_html
from batchgen.report.read import NotAPublicationError, load_publication

__all__ = ["DATA_DOCS", "REPORT", "NotAPublicationError", "load_publication", "preload", "report_markdown",
           "write_report"]


def _load_libraries() -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import great_expectations.render.renderer.site_builder  # noqa: F401  (Data Docs' site builder)
    import matplotlib.pyplot  # noqa: F401
    from matplotlib import font_manager

    font_manager.findfont("DejaVu Sans")  # reads the font list once


def preload() -> threading.Thread:
    """Import what the report needs (matplotlib and its fonts, GX's site builder: about a second in a fresh
    process) in a background thread, while the engine works, so that it is not paid after the engine is done.
    Returns the thread; a failure here is left for the report itself to raise."""

    def load() -> None:
        try:
            _load_libraries()
        except Exception:  # noqa: BLE001  (write_report imports them again and says what is wrong)
            pass

    thread = threading.Thread(target=load, name="batchgen-report-preload", daemon=True)
    thread.start()
    return thread


def write_report(run_dir: Path) -> Path:
    """Build `data_docs/` and `report.html` in a publication directory; returns the report's path."""
    pub = load_publication(Path(run_dir))
    docs = build_data_docs(pub)
    path = pub.root / REPORT
    write_text_atomic(render_html(pub, docs), path)
    return path


def report_markdown(run_dir: Path) -> str:
    """The report's figures as markdown (the Prefect artifact of the publish step)."""
    return figures_markdown(load_publication(Path(run_dir)))
