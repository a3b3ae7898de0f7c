"""The report's charts and Data Docs made in worker processes (batchgen.workers), started ahead of the report.

After the engine is done, the report's two slow parts are the charts (matplotlib) and GX's Data Docs, both pure
Python: in one process they run one after the other, whatever the cores. A `ChartWorker` imports matplotlib while
the run works; then it draws charts of a publication directory (`report_charts(load_publication(run_dir), which)`,
exactly what the report draws in-process), or of the figures a publication's writer added up before its tables are
sealed (`charts_figures`: the same images). Where there are cores for it, several workers share a page's charts
(`worker_count`, `ask_for_charts`): the page waits for its costliest chart, not the sum. The first worker started
also imports GX and builds the Data Docs (`ask_for_data_docs`). The publish step asks for both before it seals the
tables, so that they are built beside the seal and the page. What no worker can take, the report does
in-process. This module is also the workers' program (`serve`, `main`): for validation workers (started with
`--validate`, expectations.workers) too.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from batchgen.workers import started_up_to, usable_cores
from batchgen.workers import wait_for  # noqa: F401  (the report waits on the workers' answers with it)
from batchgen.workers import Worker as ChartWorker
from batchgen.workers import WorkerError as ChartWorkerError


def worker_count() -> int:
    """How many report workers a run starts: one per three cores this process may run on, one to CHART_COUNT + 1
    (the first builds the Data Docs, the others each draw a share of the page's charts, all at the same time: on a
    16-core host, one chart each). On an H200 host, three chart workers (one drawing two charts) kept the page
    waiting 0.14-0.30 s for its charts after the Data Docs were done."""
    from batchgen.report.charts import CHART_COUNT

    return max(1, min(CHART_COUNT + 1, usable_cores() // 3))


_workers: list[ChartWorker] = []
_starting = threading.Lock()


def start_workers(count: int | None = None) -> list[ChartWorker]:
    """The process's chart workers, started now up to `count` alive (default `worker_count()`; reused by later
    runs); those that could be started (none where no child process can be started here)."""
    global _workers
    wanted = worker_count() if count is None else count
    with _starting:  # the first builds the Data Docs too
        _workers = started_up_to(_workers, wanted, data_docs=lambda alive: not any(w.data_docs for w in alive))
        return list(_workers)


def running_workers() -> list[ChartWorker]:
    """The chart workers started (`start_workers`) and alive."""
    return [worker for worker in _workers if worker.alive()]


def ask_for_charts(run_dir: Path, workers: list[ChartWorker], figures: Any = None,
                   which: list[int] | None = None) -> list[tuple[ChartWorker, list[int], Future]]:
    """Share a page's charts (or those at the indices `which`) among the ready `workers` (the costliest first, in
    turn) and ask each for its share; returns (worker, chart indices, answer) for every request sent. A worker that
    cannot take its share (not ready, busy, gone) is left out: its charts are for the caller to draw. `figures`:
    (TableFigures, manifest, validation) of a publication not sealed yet, which the workers draw from instead of
    reading `run_dir`'s tables."""
    from batchgen.report.charts import CHART_COUNT

    ready = [worker for worker in workers if worker.idle()]
    if not ready:
        return []
    order = [1, 2, 3, 0][:CHART_COUNT]  # the costliest first: lengths (a histogram), expectations, throughput, finish
    by_cost = [i for i in order if which is None or i in which]
    shares = [sorted(by_cost[i::len(ready)]) for i in range(min(len(ready), len(by_cost)))]
    asked = []
    for worker, share in zip(ready, shares):
        try:
            payload = None if figures is None else charts_figures(*figures, share)
            asked.append((worker, share, worker.charts(run_dir, share, payload)))
        except ChartWorkerError:
            continue
    return asked


def charts_figures(tables: Any, manifest: Any, validation: list[dict[str, Any]], which: list[int]) -> dict[str, Any]:
    """What a worker needs to draw the charts at `which` of a publication not sealed yet, as JSON values: the
    tables' figures (batchgen.table_figures.TableFigures; the output lengths only for the length chart), the
    manifest as the seal will write it and the GX results (only for the pass-rate chart)."""
    figures = tables.to_json(lengths=1 in which)
    return {"tables": figures, "manifest": manifest.to_json(), "validation": validation if 2 in which else []}


def charts_publication(request: dict[str, Any]) -> Any:
    """The publication a chart request is about: read from its folder, or from the figures it carries."""
    from batchgen.records import Manifest
    from batchgen.report.read import load_publication, unsealed_publication
    from batchgen.table_figures import TableFigures

    figures = request.get("figures")
    if figures is None:
        return load_publication(Path(request["run_dir"]))
    return unsealed_publication(Path(request["run_dir"]), Manifest.model_validate(figures["manifest"]),
                                figures["validation"], TableFigures.from_json(figures["tables"]))


def ask_for_data_docs(run_dir: Path, workers: list[ChartWorker], validation: list[dict[str, Any]] | None = None,
                      started_at: str | None = None) -> tuple[ChartWorker, Future] | None:
    """Ask the ready, idle worker that builds Data Docs for those of `run_dir` (`ChartWorker.build_data_docs`);
    None where there is none (the caller builds them in-process)."""
    for worker in workers:
        if worker.data_docs and worker.idle():
            try:
                return worker, worker.build_data_docs(run_dir, validation, started_at)
            except ChartWorkerError:
                return None
    return None


@atexit.register
def _close() -> None:
    for worker in _workers:
        worker.close()


def serve(requests: Any, answers: Any) -> None:
    """The child's loop: a JSON request per line in, a JSON answer per line out, until its input ends."""
    from batchgen.report.charts import report_charts

    for line in requests:
        try:
            request = json.loads(line)
            if request.get("data_docs"):
                reply: dict[str, Any] = {"data_docs": data_docs(request)}
            elif "validate" in request:
                from expectations.workers import serve_validation

                reply = {"validated": serve_validation(request["validate"])}
            else:
                reply = {"charts": report_charts(charts_publication(request), request.get("which"))}
        except Exception as exc:  # noqa: BLE001  (the parent draws in-process, where the error is raised)
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps(reply) + "\n")
        answers.flush()


def data_docs(request: dict[str, Any]) -> dict[str, Any] | None:
    """The Data Docs a request asks for: of the validation results and start it carries, else of the publication's
    validation.json and manifest."""
    from datetime import datetime
    from types import SimpleNamespace

    from batchgen.report.datadocs import build_data_docs
    from batchgen.report.read import load_publication

    root = Path(request["run_dir"])
    if request.get("validation") is None:
        return build_data_docs(load_publication(root))
    started = request.get("started_at")
    return build_data_docs(SimpleNamespace(root=root, validation=request["validation"],  # type: ignore[arg-type]
                                           started_at=datetime.fromisoformat(started) if started else None))


def load_chart_libraries() -> None:
    """matplotlib (Agg) and its font list, and the report's chart modules."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot  # noqa: F401
    from matplotlib import font_manager

    import batchgen.report.charts  # noqa: F401

    font_manager.findfont("DejaVu Sans")  # reads the font list once


def main() -> None:
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a library's stray print must not garble an answer
    if "--validate" in sys.argv[1:]:
        from expectations.workers import load_validation_libraries

        load_validation_libraries()
    else:
        load_chart_libraries()
    if "--data-docs" in sys.argv[1:]:
        import batchgen.report.gx_views as gx_views

        gx_views.warm()  # GX's site builder and its page templates
    answers.write(json.dumps({"ready": True}) + "\n")
    answers.flush()
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
