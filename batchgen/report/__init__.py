"""The run report: `report.html` (offline, charts embedded) and GX Data Docs in a publication directory.

Everything here is a function of the publication directory alone (manifest.json, the Parquet tables,
validation.json), so `batchgen report RUN_DIR` rebuilds exactly what the publish step wrote. The modules:
`read` (the publication), `figures` (its numbers), `charts` (their images), `page` (the HTML page and the
markdown), `datadocs` (GX's Data Docs site), `offline_docs` (that site, rewritten to read offline) and `worker` (a
process that draws the charts while the Data Docs are built).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from batchgen.files import write_text as write_text_atomic
from batchgen.records import Manifest
from batchgen.report.datadocs import DATA_DOCS, build_data_docs
from batchgen.report.page import REPORT, figures_markdown, page_template, render_html
from batchgen.report.read import NotAPublicationError, Publication, load_publication
from batchgen.report.charts import CHART_COUNT, report_charts
from batchgen.report.worker import (
    ChartWorker,
    ChartWorkerError,
    ask_for_charts,
    ask_for_data_docs,
    load_chart_libraries,
    running_workers,
    start_workers,
    wait_for,
)
from batchgen.table_figures import TableFigures

__all__ = ["DATA_DOCS", "REPORT", "NotAPublicationError", "load_publication", "preload", "report_markdown",
           "start_chart_worker", "start_charts", "start_data_docs", "write_report", "write_report_and_markdown"]

Charts = list[tuple[ChartWorker, list[int], Future]]  # charts asked of workers: (worker, chart indices, answer)


def load_libraries(data_docs: bool = True, charts: bool = True) -> None:
    """Import GX's site builder and compile its page templates (Data Docs), and matplotlib with its font list
    (charts); compile the report page's own template."""
    if charts:
        load_chart_libraries()
    if data_docs:
        from batchgen.report import gx_views

        gx_views.warm()  # GX's site builder, and its page templates compiled once for the process
    page_template()


def preload(chart_worker: bool = True) -> threading.Thread:
    """Get the report ready while the engine works, so that its setup is not paid after the engine is done: the
    chart worker processes start (`start_chart_worker`; not with `chart_worker=False`), and a background thread
    imports GX's site builder here and compiles its templates (matplotlib too, where no worker runs): about a
    second in a fresh process. Returns the thread; a failure here is left for the report itself to raise."""
    workers = start_chart_worker() if chart_worker else []

    def load() -> None:
        try:
            load_libraries(charts=not workers)
        except Exception:  # noqa: BLE001  (write_report imports them again and says what is wrong)
            pass

    thread = threading.Thread(target=load, name="batchgen-report-preload", daemon=True)
    thread.start()
    return thread


def start_chart_worker(count: int | None = None) -> list[ChartWorker]:
    """The process's chart workers (batchgen.report.worker), started up to `count` alive (default: one per four
    cores, at most one per chart): the report's charts are drawn there, beside the Data Docs. Their imports take
    other cores, not this process's time. Empty where no child process can be started (the charts are then drawn
    in-process)."""
    return start_workers(count)


def _write(run_dir: Path, timings: dict[str, float] | None = None,
           data_docs: tuple[ChartWorker, Future] | None = None, charts: Charts | None = None,
           figures: TableFigures | None = None) -> tuple[Path, Publication]:
    started = time.perf_counter()
    workers = running_workers()
    # the Data Docs in a worker (asked for already, or now), the charts in the others (those not asked for already),
    # while the publication is read here; what no worker takes is done here
    data_docs = data_docs or ask_for_data_docs(Path(run_dir), workers)
    asked = list(charts or [])
    taken = {index for _, which, _ in asked for index in which}
    if len(taken) < CHART_COUNT:
        asked += ask_for_charts(Path(run_dir), workers, which=[i for i in range(CHART_COUNT) if i not in taken])
    pub = load_publication(Path(run_dir), figures)
    read = time.perf_counter()
    docs = None
    if data_docs is not None:
        try:
            docs = wait_for(data_docs[1], data_docs[0])
        except ChartWorkerError:
            data_docs = None
    if data_docs is None:
        docs = build_data_docs(pub)
    built = time.perf_counter()
    charts: list[dict[str, str] | None] = [None] * CHART_COUNT
    for worker, which, answer in asked:
        try:
            for index, chart in zip(which, wait_for(answer, worker)):
                charts[index] = chart
        except ChartWorkerError:  # drawn here instead, where a real error is raised
            continue
    missing = [index for index, chart in enumerate(charts) if chart is None]
    for index, chart in zip(missing, report_charts(pub, missing) if missing else []):
        charts[index] = chart
    drawn = time.perf_counter()
    path = pub.root / REPORT
    write_text_atomic(render_html(pub, docs, charts), path)
    if timings is not None:
        timings.update(read=read - started, data_docs=built - read, charts=drawn - built,
                       page=time.perf_counter() - drawn)
    return path, pub


def write_report(run_dir: Path) -> Path:
    """Build `data_docs/` and `report.html` in a publication directory; returns the report's path. The charts
    are drawn by the chart worker when `preload` started one, else here: the same images either way."""
    return _write(Path(run_dir))[0]


def write_report_and_markdown(run_dir: Path, timings: dict[str, float] | None = None,
                              data_docs: tuple[ChartWorker, Future] | None = None, charts: Charts | None = None,
                              figures: TableFigures | None = None) -> tuple[Path, str]:
    """`write_report`, and the report's figures as markdown (`report_markdown`) from the same reading of the
    publication. `timings`, when given, gets the seconds each part took: read (the publication), data_docs (building
    them here, or the wait for a worker's), charts (the wait for the chart workers' images, or drawing them here)
    and page (report.html). `data_docs`: the Data Docs asked of a worker already (`start_data_docs`); `charts`: the
    charts asked of workers already (`start_charts`); `figures`: the tables' figures as the publication's writer
    added them up (`Publication.figures`), so that the tables are read here only for the page's samples."""
    path, pub = _write(Path(run_dir), timings, data_docs, charts, figures)
    return path, figures_markdown(pub)


def start_data_docs(run_dir: Path, validation: list[dict[str, Any]], started_at: str | None) -> \
        tuple[ChartWorker, Future] | None:
    """Ask a chart worker that builds Data Docs (`start_chart_worker`) for those of `validation` (the results as
    the publication's validation.json will hold them) into `run_dir` now, before the tables are sealed; give what
    it returns to `write_report_and_markdown`. None where no such worker is ready: the report builds them."""
    return ask_for_data_docs(Path(run_dir), running_workers(), validation, started_at)


def start_charts(run_dir: Path, figures: TableFigures | None, manifest: Manifest,
                 validation: list[dict[str, Any]]) -> Charts:
    """Ask the chart workers (`start_chart_worker`) for the charts of the publication being sealed in `run_dir`,
    drawn from `figures` (its tables' figures as its writer added them up, `Publication.figures`), `manifest` (as
    the seal will write it) and `validation` (its GX results), so that they are drawn while the tables are sealed;
    give what it returns to `write_report_and_markdown`. Empty where no worker is ready or there are no figures (a
    merge's publication): the report asks for them, or draws them, once the tables are sealed."""
    if figures is None:
        return []
    return ask_for_charts(Path(run_dir), running_workers(), (figures, manifest, validation))


def report_markdown(run_dir: Path) -> str:
    """The report's figures as markdown (the Prefect artifact of the publish step)."""
    return figures_markdown(load_publication(Path(run_dir)))
