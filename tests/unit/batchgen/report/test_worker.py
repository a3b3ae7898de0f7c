"""The chart workers (batchgen.report.worker): child processes that draw a publication's charts (a share each) and,
the first one, build its Data Docs, the same images and pages as in-process; what they cannot do, the report does
itself."""

from __future__ import annotations

import re
import shutil
import time

import pytest

import batchgen.report.worker as worker_module
import batchgen.workers
from batchgen.report import DATA_DOCS, REPORT, write_report, write_report_and_markdown
from batchgen.report.datadocs import build_data_docs
from batchgen.report.charts import report_charts
from batchgen.report.read import load_publication, table_figures
from batchgen.report.worker import (
    ChartWorker,
    ChartWorkerError,
    ask_for_charts,
    ask_for_data_docs,
    charts_figures,
    wait_for,
    worker_count,
)
from tests.unit.batchgen.report.publication import make_publication


def _ready_worker(data_docs: bool = False):
    started = ChartWorker.start(data_docs=data_docs)
    assert started.ready.wait(timeout=120), "the chart worker never said it was ready"
    yield started
    started.close()
    started.process.wait(timeout=30)


@pytest.fixture(scope="module")
def worker():
    yield from _ready_worker()


@pytest.fixture(scope="module")
def second_worker():
    yield from _ready_worker()


@pytest.fixture(scope="module")
def docs_worker():
    yield from _ready_worker(data_docs=True)


def without_ids(page: str) -> str:
    """The page without what differs between any two builds (GX's random element ids, its build times)."""
    page = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "ID", page)
    return re.sub(r"\d{8}T\d{6}\.\d+Z", "TIME", page)


def test_the_worker_draws_the_same_images_as_the_report_does_in_process(published, worker):
    root, _, _ = published
    assert wait_for(worker.charts(root), worker, timeout=120) == report_charts(load_publication(root))


def test_a_worker_draws_the_charts_it_is_asked_for_in_the_order_asked(published, worker):
    root, _, _ = published
    drawn = report_charts(load_publication(root))
    assert wait_for(worker.charts(root, [3, 1]), worker, timeout=120) == [drawn[3], drawn[1]]


def test_the_charts_are_shared_among_the_ready_workers_each_asked_once(published, worker, second_worker):
    root, _, _ = published
    starting = ChartWorker.start()  # not ready yet: left out, not waited for
    try:
        asked = ask_for_charts(root, [worker, starting, second_worker])
        assert [w for w, _, _ in asked] == [worker, second_worker]
        shares = [which for _, which, _ in asked]
        assert sorted(i for which in shares for i in which) == [0, 1, 2, 3] and all(len(w) == 2 for w in shares)
        assert 1 in shares[0]  # the costliest (the length histogram) goes to the first worker
        drawn = report_charts(load_publication(root))
        for w, which, answer in asked:
            assert wait_for(answer, w, timeout=120) == [drawn[i] for i in which]
    finally:
        starting.kill()
        starting.process.wait(timeout=30)


def test_a_worker_draws_from_the_figures_of_a_publication_not_sealed_yet_what_its_sealed_tables_give(
        tmp_path, published, worker, second_worker):
    """The publish step asks for the charts before it seals the tables, with the figures its writer added up: the
    workers read no table (their folder is empty here) and draw the images the sealed publication gives."""
    root, _, _ = published
    sealed = load_publication(root)
    figures = (table_figures(root), sealed.manifest, sealed.validation)
    empty = tmp_path / "staging"
    empty.mkdir()
    asked = ask_for_charts(empty, [worker, second_worker], figures, which=[0, 1, 3])
    assert sorted(i for _, which, _ in asked for i in which) == [0, 1, 3]
    drawn = report_charts(sealed)
    for w, which, answer in asked:
        assert wait_for(answer, w, timeout=120) == [drawn[i] for i in which]
    # the pass-rate chart's share carries the GX results, the length chart's the lengths; the others neither
    assert charts_figures(*figures, [2])["validation"] == sealed.validation
    assert charts_figures(*figures, [0, 3])["validation"] == []
    assert charts_figures(*figures, [0, 3])["tables"]["lengths"] == {}


def test_one_worker_per_three_cores_one_to_five(monkeypatch):
    for cores, workers in ((1, 1), (2, 1), (5, 1), (8, 2), (12, 4), (16, 5), (128, 5)):
        monkeypatch.setattr(batchgen.workers.os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        assert worker_count() == workers


def test_a_publication_the_worker_cannot_read_fails_its_request_and_it_keeps_serving(tmp_path, published, worker):
    with pytest.raises(ChartWorkerError, match="not a batchgen publication"):
        wait_for(worker.charts(tmp_path), worker, timeout=120)
    root, _, _ = published
    assert len(wait_for(worker.charts(root), worker, timeout=120)) == 4


def test_one_request_at_a_time_and_none_before_the_worker_is_ready(published, worker):
    root, _, _ = published
    answer = worker.charts(root)
    with pytest.raises(ChartWorkerError, match="busy with another request"):
        worker.charts(root)
    wait_for(answer, worker, timeout=120)
    starting = ChartWorker.start()  # asked at once: its imports are not done
    try:
        with pytest.raises(ChartWorkerError, match="not ready"):
            starting.charts(root)
    finally:
        starting.kill()
        starting.process.wait(timeout=30)


def test_a_worker_that_dies_while_asked_fails_the_request_with_a_worker_error(published):
    """The worker dies between the ask's checks and its write: its reader, at the pipe's end, fails the pending
    answer and frees the worker; the ask then says WorkerError (the caller's cue to work in-process), not a lock
    freed twice."""
    root, _, _ = published
    dying = ChartWorker.start()
    assert dying.ready.wait(timeout=120)
    real = dying.process.stdin

    class DiesFirst:
        def write(self, data):
            dying.process.kill()
            dying.process.wait(timeout=30)
            deadline = time.monotonic() + 30
            while dying._answer is not None and time.monotonic() < deadline:  # the reader has failed the answer
                time.sleep(0.01)
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

        def close(self):
            real.close()

    dying.process.stdin = DiesFirst()
    with pytest.raises(ChartWorkerError, match="cannot take a request"):
        dying.charts(root)
    assert not dying.busy() and not dying.alive()


def test_the_report_is_the_same_with_workers_without_them_and_when_one_died(tmp_path, monkeypatch, worker,
                                                                          second_worker):
    roots = [tmp_path / name for name in ("in-process", "worker", "two-workers", "died")]
    make_publication(roots[0])
    for root in roots[1:]:
        shutil.copytree(roots[0], root)
    monkeypatch.setattr(worker_module, "_workers", [])
    write_report(roots[0])
    monkeypatch.setattr(worker_module, "_workers", [worker])
    _, markdown = write_report_and_markdown(roots[1])
    monkeypatch.setattr(worker_module, "_workers", [worker, second_worker])
    write_report(roots[2])
    dead = ChartWorker.start()
    dead.kill()
    dead.process.wait(timeout=30)
    dead.ready.set()  # as if it had been ready before it died: its share is drawn in-process
    monkeypatch.setattr(worker_module, "_workers", [worker, dead])
    monkeypatch.setattr(worker_module.ChartWorker, "alive", lambda self: True)  # it died after the run looked
    write_report(roots[3])
    pages = [without_ids((root / REPORT).read_text(encoding="utf-8")) for root in roots]
    assert pages[0] == pages[1] == pages[2] == pages[3]
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


def site(root) -> dict[str, str]:
    """The Data Docs' pages of a publication, by path, without what differs between two builds."""
    return {path.relative_to(root).as_posix(): without_ids(path.read_text(encoding="utf-8"))
            for path in sorted((root / DATA_DOCS).rglob("*.html"))}


def test_the_docs_worker_builds_the_same_data_docs_from_the_publication_or_before_its_seal(tmp_path, docs_worker):
    import json

    roots = [tmp_path / name for name in ("in-process", "worker", "before-seal")]
    make_publication(roots[0])
    for root in roots[1:]:
        shutil.copytree(roots[0], root)
    pub = load_publication(roots[0])
    pages = build_data_docs(pub)
    assert wait_for(docs_worker.build_data_docs(roots[1]), docs_worker, timeout=120) == pages
    # the results and the start as the publish step has them before validation.json and the manifest are written
    validation = json.loads((roots[2] / "validation.json").read_text(encoding="utf-8"))
    (roots[2] / "validation.json").unlink()
    answer = docs_worker.build_data_docs(roots[2], validation, pub.manifest.started_at)
    assert wait_for(answer, docs_worker, timeout=120) == pages
    built = [site(root) for root in roots]
    assert len(built[0]) >= 3 and built[0] == built[1] == built[2]


def test_only_a_worker_with_gx_builds_data_docs_and_a_busy_one_is_left_out(published, worker, docs_worker):
    root, _, _ = published
    with pytest.raises(ChartWorkerError, match="does not build Data Docs"):
        worker.build_data_docs(root)
    assert ask_for_data_docs(root, [worker]) is None
    asked = ask_for_data_docs(root, [worker, docs_worker])
    assert asked is not None and asked[0] is docs_worker
    # busy with the Data Docs: no second request, and no share of the charts
    assert ask_for_data_docs(root, [docs_worker]) is None
    charts = ask_for_charts(root, [docs_worker, worker])
    assert [w for w, _, _ in charts] == [worker] and charts[0][1] == [0, 1, 2, 3]
    assert len(wait_for(charts[0][2], worker, timeout=120)) == 4
    assert wait_for(asked[1], docs_worker, timeout=120)["index"] == f"{DATA_DOCS}/index.html"


def test_the_report_is_the_same_with_the_data_docs_built_by_a_worker(tmp_path, monkeypatch, worker, docs_worker):
    roots = [tmp_path / name for name in ("in-process", "workers", "asked-before")]
    make_publication(roots[0])
    for root in roots[1:]:
        shutil.copytree(roots[0], root)
    monkeypatch.setattr(worker_module, "_workers", [])
    write_report(roots[0])
    monkeypatch.setattr(worker_module, "_workers", [docs_worker, worker])
    timings: dict[str, float] = {}
    write_report_and_markdown(roots[1], timings)
    assert set(timings) == {"read", "data_docs", "charts", "page"}
    from batchgen.report import start_data_docs

    pub = load_publication(roots[2])
    asked = start_data_docs(roots[2], pub.validation, pub.manifest.started_at)
    assert asked is not None and asked[0] is docs_worker
    write_report_and_markdown(roots[2], data_docs=asked)
    pages = [without_ids((root / REPORT).read_text(encoding="utf-8")) for root in roots]
    assert pages[0] == pages[1] == pages[2]
    assert site(roots[0]) == site(roots[1]) == site(roots[2])


def test_a_worker_starts_in_the_checkout_it_is_imported_from(monkeypatch):
    """`python -m` puts the child's working folder first on its path: the checkout's root, so the child imports
    this batchgen, not another one installed."""
    from pathlib import Path

    import batchgen
    import batchgen.workers

    started = {}

    class Popen:
        def __init__(self, argv, **options):
            started.update(options, argv=argv)
            self.stdout, self.stdin = iter(()), None

    monkeypatch.setattr(batchgen.workers.subprocess, "Popen", Popen)
    worker = ChartWorker.start(validates=True)
    assert worker.validates and not worker.data_docs
    assert started["argv"][1:] == ["-m", "batchgen.report.worker", "--validate"]
    assert Path(started["cwd"]) == Path(batchgen.__file__).resolve().parents[1]
