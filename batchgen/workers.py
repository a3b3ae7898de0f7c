"""Worker processes started ahead of the work they take: the report's charts and Data Docs, GX validation.

A worker is a plain child (`python -m batchgen.report.worker`, with flags for what it loads), not a
multiprocessing one, so the parent's main module (a user's script, a test runner) is never imported again there.
It imports its libraries at once and says when it is ready; then it reads one JSON request per line on stdin and
answers one JSON line on stdout, one request at a time; it exits when its stdin closes (its parent ended). Anything
that goes wrong (no interpreter, not ready yet, busy, a crash, an error, no answer in time) is a `WorkerError`:
the caller's cue to do the work in-process instead, where a real error is raised. batchgen.report.worker has the
report's use of them (and the child's loop), expectations.workers the validation's.
"""

from __future__ import annotations

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


class WorkerError(RuntimeError):
    """The worker did not do the work (not ready, busy, gone, failed, or too slow): do it in-process."""


class Worker:
    """One child process that draws charts, builds Data Docs (`data_docs`) or validates (`validates`); one request
    at a time (other work meanwhile is done in-process). It says when its imports are done: a request before that
    is refused (done in-process, not waited for)."""

    def __init__(self, process: subprocess.Popen, data_docs: bool = False, validates: bool = False):
        self.process = process
        self.data_docs = data_docs  # it has GX loaded and builds Data Docs too
        self.validates = validates  # it has GX loaded and validates outputs (expectations.workers)
        self.ready = threading.Event()
        self._busy = threading.Lock()
        self._answer: Future | None = None
        self._handoff = threading.Lock()  # the pending answer is taken once: by the reader, or by a failed ask
        threading.Thread(target=self._read, name="batchgen-worker", daemon=True).start()

    @classmethod
    def start(cls, data_docs: bool = False, validates: bool = False) -> Worker:
        """Start the child; it imports matplotlib and batchgen's report modules at once (with `data_docs`, GX's site
        builder too; with `validates`, GX and batchgen's suites instead of matplotlib), then waits."""
        root = Path(__file__).resolve().parents[1]  # the folder this batchgen is imported from
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
            answer = self._take()
            if answer is None:
                continue
            kind = next((key for key in ("charts", "data_docs", "validated") if key in reply), None)
            if kind is not None:
                answer.set_result(reply[kind])
            else:
                answer.set_exception(WorkerError(f"the worker failed: {reply.get('error')}"))
            self._busy.release()
        self.ready.clear()
        answer = self._take()
        if answer is not None:
            answer.set_exception(WorkerError("the worker exited before answering"))
            self._busy.release()

    def alive(self) -> bool:
        return self.process.poll() is None

    def busy(self) -> bool:
        """Working on a request (its answer not read yet)."""
        return self._busy.locked()

    def idle(self) -> bool:
        """Ready for a request now: its imports done, not busy (`_ask` still refuses it if another thread took it
        meanwhile or it is gone)."""
        return self.ready.is_set() and not self.busy()

    def charts(self, run_dir: Path, which: Sequence[int] | None = None,
               figures: dict[str, Any] | None = None) -> Future:
        """Ask for the charts of `run_dir` (a sealed publication), all or those at the indices `which`; with
        `figures` (batchgen.report.worker.charts_figures), of those figures instead, the tables not read (not
        sealed yet). The future's result is `report_charts`'s list, or WorkerError. Raises WorkerError at once when
        the worker is not ready, busy or gone."""
        return self._ask({"run_dir": str(Path(run_dir).resolve()), "which": None if which is None else list(which),
                          **({"figures": figures} if figures is not None else {})})

    def build_data_docs(self, run_dir: Path, validation: list[dict[str, Any]] | None = None,
                        started_at: str | None = None) -> Future:
        """Ask for the Data Docs of `run_dir` (`batchgen.report.datadocs.build_data_docs`, written into the folder):
        of `validation` (the results as validation.json holds them) and the run's start `started_at` (ISO) when
        given, so that the tables need not be sealed yet, else of the publication's own. The future's result is
        the pages (build_data_docs' return), or WorkerError; raises it at once as `charts` does, and where
        this worker has no GX."""
        if not self.data_docs:
            raise WorkerError("this worker does not build Data Docs")
        return self._ask({"run_dir": str(Path(run_dir).resolve()), "data_docs": True, "validation": validation,
                          "started_at": started_at})

    def validate(self, payload: str) -> Future:
        """Ask for a validation (expectations.workers: `payload` is its pickled arguments, as text); the future's
        result is the pickled answer, as text, or WorkerError. Raises it at once as `charts` does, and where
        this worker does not validate."""
        if not self.validates:
            raise WorkerError("this worker does not validate")
        return self._ask({"validate": payload})

    def _ask(self, request: dict[str, Any]) -> Future:
        if not self.ready.is_set() or not self.alive():
            raise WorkerError("the worker is not ready")
        if not self._busy.acquire(blocking=False):
            raise WorkerError("the worker is busy with another request")
        answer: Future = Future()
        self._answer = answer
        try:
            self.process.stdin.write((json.dumps(request, default=str) + "\n").encode())
            self.process.stdin.flush()
        except (OSError, ValueError) as exc:
            # A worker that died meanwhile: its reader, at the pipe's end, may have failed the answer and freed the
            # worker already; whoever takes the answer frees it, once.
            if self._take(answer) is not None:
                self._busy.release()
            raise WorkerError(f"the worker cannot take a request: {exc}") from exc
        return answer

    def _take(self, expected: Future | None = None) -> Future | None:
        """The pending answer, taken (None when there is none, or it is not `expected`)."""
        with self._handoff:
            answer = self._answer
            if answer is None or (expected is not None and answer is not expected):
                return None
            self._answer = None
            return answer

    def close(self) -> None:
        """Close its stdin: the child ends its loop and exits."""
        try:
            self.process.stdin.close()
        except OSError:
            pass

    def kill(self) -> None:
        self.process.kill()


def wait_for(answer: Future, worker: Worker, timeout: float = ANSWER_SECONDS) -> Any:
    """The worker's answer; a worker that does not answer in `timeout` seconds is killed (WorkerError)."""
    try:
        return answer.result(timeout=timeout)
    except TimeoutError as exc:  # concurrent.futures.TimeoutError is TimeoutError since Python 3.11
        worker.kill()
        raise WorkerError(f"the worker gave no answer in {timeout:.0f} s") from exc


def started_up_to(workers: list[Worker], count: int, **options: Any) -> list[Worker]:
    """`workers` that are alive, and more started (`Worker.start(**options)`, `options` called with the workers so
    far where it is a function) until there are `count`; as many as could be started."""
    alive = [worker for worker in workers if worker.alive()]
    while len(alive) < count:
        try:
            alive.append(Worker.start(**{name: value(alive) if callable(value) else value
                                         for name, value in options.items()}))
        except (OSError, ValueError, subprocess.SubprocessError):
            break
    return alive


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system says it), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1
