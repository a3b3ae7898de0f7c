"""The report's charts drawn in a Python process of their own, started ahead of the report.

After the engine is done, the report's two slow parts are the charts (matplotlib) and GX's Data Docs, both pure
Python: in one process they run one after the other, whatever the cores. `ChartWorker` is a child process that
imports matplotlib while the run works and says when it is ready; then it draws charts of a publication directory
(`report_charts(load_publication(run_dir), which)`, exactly what the report draws in-process) while the run's own
process builds the Data Docs. Where there are cores for it, several workers share a page's charts (`worker_count`,
`ask_for_charts`): the page waits for its costliest chart, not the sum. A worker is a plain child (`python -m
batchgen.report.worker`), not a multiprocessing one, so the parent's main module is never imported again there. It
reads one request line on stdin and answers one JSON line on stdout; it exits when its stdin closes (its parent
ended). The first worker started also imports GX and builds the Data Docs (`ask_for_data_docs`): the publish step
asks for them before it seals the tables, so that they are built beside the seal, the charts and the page. Anything that goes wrong there (no interpreter, not ready yet, a crash, an error, no answer in time) is the
caller's cue to draw the charts in-process instead, where a real error is raised.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

ANSWER_SECONDS = 300.0  # a publication's charts take about a second; a worker silent this long is given up


class ChartWorkerError(RuntimeError):
    """The worker did not draw the charts (gone, failed, or too slow): draw them in-process."""


class ChartWorker:
    """One child process that draws charts; one request at a time (others draw in-process meanwhile). It says
    when its imports are done: a request before that is refused (drawn in-process, not waited for)."""

    def __init__(self, process: subprocess.Popen, data_docs: bool = False, validates: bool = False):
        self.process = process
        self.data_docs = data_docs  # it has GX loaded and builds Data Docs too
        self.validates = validates  # it has GX loaded and validates outputs (expectations.workers)
        self.ready = threading.Event()
        self._busy = threading.Lock()
        self._answer: Future | None = None
        threading.Thread(target=self._read, name="batchgen-chart-worker", daemon=True).start()

    @classmethod
    def start(cls, data_docs: bool = False, validates: bool = False) -> ChartWorker:
        """Start the child; it imports matplotlib and batchgen's report modules at once (with `data_docs`, GX's site
        builder too; with `validates`, GX and batchgen's suites instead of matplotlib), then waits."""
        root = Path(__file__).resolve().parents[2]  # the folder this batchgen is imported from
        # `-m` puts the child's working folder first on its path: a checkout's root, so it imports this batchgen;
        # an installed batchgen is found by the child as it is (a site-packages folder first would shadow the
        # standard library with what is installed there).
        cwd = None if root.name in ("site-packages", "dist-packages") else root
        process = subprocess.Popen([sys.executable, "-m", "batchgen.report.worker",
                                    *(["--data-docs"] if data_docs else []), *(["--validate"] if validates else [])],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   env={**os.environ, "MPLBACKEND": "Agg"}, cwd=cwd, close_fds=True)
        return cls(process, data_docs, validates)

    def _read(self) -> None:
        """The child's lines: "ready" once, then one answer per request; at its end, a pending request fails."""
        for line in self.process.stdout:
            try:
                reply = json.loads(line)
            except ValueError:
                continue
            if reply.get("ready"):
                self.ready.set()
                continue
            answer, self._answer = self._answer, None
            if answer is None:
                continue
            kind = next((key for key in ("charts", "data_docs", "validated") if key in reply), None)
            if kind is not None:
                answer.set_result(reply[kind])
            else:
                answer.set_exception(ChartWorkerError(f"the chart worker failed: {reply.get('error')}"))
            self._busy.release()
        self.ready.clear()
        answer, self._answer = self._answer, None
        if answer is not None:
            answer.set_exception(ChartWorkerError("the chart worker exited before answering"))
            self._busy.release()

    def alive(self) -> bool:
        return self.process.poll() is None

    def busy(self) -> bool:
        """Working on a request (its answer not read yet)."""
        return self._busy.locked()

    def charts(self, run_dir: Path, which: Sequence[int] | None = None) -> Future:
        """Ask for the charts of `run_dir` (a sealed publication), all or those at the indices `which`; the future's
        result is `report_charts`'s list, or ChartWorkerError. Raises ChartWorkerError at once when the worker is
        not ready, busy or gone."""
        return self._ask({"run_dir": str(Path(run_dir).resolve()), "which": None if which is None else list(which)})

    def build_data_docs(self, run_dir: Path, validation: list[dict[str, Any]] | None = None,
                        started_at: str | None = None) -> Future:
        """Ask for the Data Docs of `run_dir` (`batchgen.report.datadocs.build_data_docs`, written into the folder):
        of `validation` (the results as validation.json holds them) and the run's start `started_at` (ISO) when
        given, so that the tables need not be sealed yet, else of the publication's own. The future's result is
        the pages (build_data_docs' return), or ChartWorkerError; raises it at once as `charts` does, and where
        this worker has no GX."""
        if not self.data_docs:
            raise ChartWorkerError("this chart worker does not build Data Docs")
        return self._ask({"run_dir": str(Path(run_dir).resolve()), "data_docs": True, "validation": validation,
                          "started_at": started_at})

    def validate(self, payload: str) -> Future:
        """Ask for a validation (expectations.workers: `payload` is its pickled arguments, as text); the future's
        result is the pickled answer, as text, or ChartWorkerError. Raises it at once as `charts` does, and where
        this worker does not validate."""
        if not self.validates:
            raise ChartWorkerError("this worker does not validate")
        return self._ask({"validate": payload})

    def _ask(self, request: dict[str, Any]) -> Future:
        if not self.ready.is_set() or not self.alive():
            raise ChartWorkerError("the chart worker is not ready")
        if not self._busy.acquire(blocking=False):
            raise ChartWorkerError("the chart worker is drawing another report")
        answer: Future = Future()
        self._answer = answer
        try:
            self.process.stdin.write((json.dumps(request, default=str) + "\n").encode())
            self.process.stdin.flush()
        except (OSError, ValueError) as exc:
            self._answer = None
            self._busy.release()
            raise ChartWorkerError(f"the chart worker cannot take a request: {exc}") from exc
        return answer

    def close(self) -> None:
        """Close its stdin: the child ends its loop and exits."""
        try:
            self.process.stdin.close()
        except OSError:
            pass

    def kill(self) -> None:
        self.process.kill()


def wait_for(answer: Future, worker: ChartWorker, timeout: float = ANSWER_SECONDS) -> list[dict[str, str]]:
    """The worker's charts; a worker that does not answer in `timeout` seconds is killed (ChartWorkerError)."""
    try:
        return answer.result(timeout=timeout)
    except TimeoutError as exc:  # concurrent.futures.TimeoutError is TimeoutError since Python 3.11
        worker.kill()
        raise ChartWorkerError(f"the chart worker gave no answer in {timeout:.0f} s") from exc


def worker_count() -> int:
    """How many chart workers a report uses: one per four cores this process may run on, one to CHART_COUNT + 1
    (the first builds the Data Docs, the others each draw a share of the page's charts, all at the same time)."""
    from batchgen.report.charts import CHART_COUNT

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(CHART_COUNT + 1, cores // 4))


_workers: list[ChartWorker] = []
_starting = threading.Lock()


def start_workers(count: int | None = None) -> list[ChartWorker]:
    """The process's chart workers, started now up to `count` alive (default `worker_count()`; reused by later
    runs); those that could be started (none where no child process can be started here)."""
    global _workers
    wanted = worker_count() if count is None else count
    with _starting:
        alive = [worker for worker in _workers if worker.alive()]
        while len(alive) < wanted:
            try:  # the first builds the Data Docs too
                alive.append(ChartWorker.start(data_docs=not any(worker.data_docs for worker in alive)))
            except (OSError, ValueError, subprocess.SubprocessError):
                break
        _workers = alive
        return list(alive)


def running_workers() -> list[ChartWorker]:
    """The chart workers started (`start_workers`) and alive."""
    return [worker for worker in _workers if worker.alive()]


def ask_for_charts(run_dir: Path, workers: list[ChartWorker]) -> list[tuple[ChartWorker, list[int], Future]]:
    """Share a page's charts among the ready `workers` (the costliest first, in turn) and ask each for its share;
    returns (worker, chart indices, answer) for every request sent. A worker that cannot take its share (not
    ready, busy, gone) is left out: its charts are for the caller to draw."""
    from batchgen.report.charts import CHART_COUNT

    ready = [worker for worker in workers if worker.ready.is_set() and not worker.busy()]
    if not ready:
        return []
    by_cost = [1, 2, 3, 0][:CHART_COUNT]  # lengths (a histogram), expectations, throughput, finish reasons
    shares = [sorted(by_cost[i::len(ready)]) for i in range(min(len(ready), CHART_COUNT))]
    asked = []
    for worker, which in zip(ready, shares):
        try:
            asked.append((worker, which, worker.charts(run_dir, which)))
        except ChartWorkerError:
            continue
    return asked


def ask_for_data_docs(run_dir: Path, workers: list[ChartWorker], validation: list[dict[str, Any]] | None = None,
                      started_at: str | None = None) -> tuple[ChartWorker, Future] | None:
    """Ask the ready, idle worker that builds Data Docs for those of `run_dir` (`ChartWorker.build_data_docs`);
    None where there is none (the caller builds them in-process)."""
    for worker in workers:
        if worker.data_docs and worker.ready.is_set() and not worker.busy():
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
    from batchgen.report.read import load_publication

    for line in requests:
        try:
            request = json.loads(line)
            if request.get("data_docs"):
                reply: dict[str, Any] = {"data_docs": data_docs(request)}
            elif "validate" in request:
                from expectations.workers import serve_validation

                reply = {"validated": serve_validation(request["validate"])}
            else:
                reply = {"charts": report_charts(load_publication(Path(request["run_dir"])), request.get("which"))}
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
        from batchgen.report import load_libraries

        load_libraries(charts=False)  # GX's site builder and its page templates
    answers.write(json.dumps({"ready": True}) + "\n")
    answers.flush()
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
