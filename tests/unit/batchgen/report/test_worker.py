"""The chart worker (batchgen.report.worker): a child process that draws a publication's charts while the Data Docs
are built, the same images as in-process; when it cannot, the report draws them itself."""

from __future__ import annotations

import re
import shutil

import pytest

import batchgen.report.worker as worker_module
from batchgen.report import REPORT, write_report, write_report_and_markdown
from batchgen.report.charts import report_charts
from batchgen.report.read import load_publication
from batchgen.report.worker import ChartWorker, ChartWorkerError, wait_for
from tests.unit.batchgen.report.publication import make_publication


@pytest.fixture(scope="module")
def worker():
    started = ChartWorker.start()
    assert started.ready.wait(timeout=120), "the chart worker never said it was ready"
    yield started
    started.close()
    started.process.wait(timeout=30)


def without_ids(page: str) -> str:
    """The page without what differs between any two builds (GX's random element ids, its build times)."""
    page = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "ID", page)
    return re.sub(r"\d{8}T\d{6}\.\d+Z", "TIME", page)


def test_the_worker_draws_the_same_images_as_the_report_does_in_process(published, worker):
    root, _, _ = published
    assert wait_for(worker.charts(root), worker, timeout=120) == report_charts(load_publication(root))


def test_a_publication_the_worker_cannot_read_fails_its_request_and_it_keeps_serving(tmp_path, published, worker):
    with pytest.raises(ChartWorkerError, match="not a batchgen publication"):
        wait_for(worker.charts(tmp_path), worker, timeout=120)
    root, _, _ = published
    assert len(wait_for(worker.charts(root), worker, timeout=120)) == 4


def test_one_request_at_a_time_and_none_before_the_worker_is_ready(published, worker):
    root, _, _ = published
    answer = worker.charts(root)
    with pytest.raises(ChartWorkerError, match="drawing another report"):
        worker.charts(root)
    wait_for(answer, worker, timeout=120)
    starting = ChartWorker.start()  # asked at once: its imports are not done
    try:
        with pytest.raises(ChartWorkerError, match="not ready"):
            starting.charts(root)
    finally:
        starting.kill()
        starting.process.wait(timeout=30)


def test_the_report_is_the_same_with_the_worker_without_it_and_when_it_died(tmp_path, monkeypatch, worker):
    roots = [tmp_path / name for name in ("in-process", "worker", "died")]
    make_publication(roots[0])
    for root in roots[1:]:
        shutil.copytree(roots[0], root)
    monkeypatch.setattr(worker_module, "_worker", None)
    write_report(roots[0])
    monkeypatch.setattr(worker_module, "_worker", worker)
    _, markdown = write_report_and_markdown(roots[1])
    dead = ChartWorker.start()
    dead.kill()
    dead.process.wait(timeout=30)
    dead.ready.set()  # as if it had been ready before it died
    monkeypatch.setattr(worker_module, "_worker", dead)
    write_report(roots[2])
    pages = [without_ids((root / REPORT).read_text(encoding="utf-8")) for root in roots]
    assert pages[0] == pages[1] == pages[2]
    assert len(re.findall(r'<img class="chart"', pages[1])) == 4
    assert "**Finish reasons per attempt**" in markdown and str(roots[1] / REPORT) in markdown


def test_a_worker_that_gives_no_answer_in_time_is_ended(published):
    root, _, _ = published
    slow = ChartWorker.start()
    assert slow.ready.wait(timeout=120)
    try:
        with pytest.raises(ChartWorkerError, match="no answer"):
            wait_for(slow.charts(root), slow, timeout=0.001)
        assert slow.process.wait(timeout=30) is not None  # killed
    finally:
        slow.kill()
