"""GX validation in worker processes, where the engine runs on an accelerator.

The flow's windows validate their outputs with GX (expectations.validate), pure Python that holds the run's
interpreter: beside the engine's outputs coming in and the other windows' staging, the last windows' validations
on an H200 host took 0.19-0.29 s each for 256-512 rows, a third of what was left after the engine's last output.
Validation workers are child processes (batchgen.workers, started with `--validate`: GX and batchgen's
suites imported ahead, one request at a time) that run `validate_frame` on a prepared frame sent to them pickled;
the run's process only prepares the frame and reads the verdicts back. A validation that finds no ready, idle
worker, or whose worker fails, runs in-process: the same verdicts and results either way. None are started on CPU
builds, where the engine's threads use every core.
"""

from __future__ import annotations

import atexit
import base64
import pickle
import threading
from typing import Any

import pandas as pd

from batchgen.job import ExpectationsSpec
from batchgen.workers import Worker, WorkerError, started_up_to, usable_cores, wait_for

ANSWER_SECONDS = 600.0  # a window's validation takes well under a second; a worker silent this long is given up

_validators: list[Worker] = []
_starting = threading.Lock()


def wanted(windows_in_flight: int) -> int:
    """Validation workers for a run: none on CPU builds, else one per window in flight, at most one per four cores
    this process may run on (the report's workers take one per three)."""
    from batchgen.engine import on_cpu

    if on_cpu():
        return 0
    return max(0, min(windows_in_flight, usable_cores() // 4))


def start_validation_workers(count: int) -> list[Worker]:
    """The process's validation workers, started now up to `count` alive (reused by later runs); those that could
    be started."""
    global _validators
    with _starting:
        _validators = started_up_to(_validators, count, validates=True)
        return list(_validators)


def validation_workers() -> list[Worker]:
    """The process's validation workers started (`start_validation_workers`) and alive."""
    return [worker for worker in _validators if worker.alive()]


def validate_in_worker(frame: pd.DataFrame, spec: ExpectationsSpec, suite_name: str,
                       json_schema: dict[str, Any] | None, structured: tuple[str, Any] | None) -> \
        tuple[list[list[str]], dict[str, Any]] | None:
    """`validate_frame`'s answer from a ready, idle validation worker; None where there is none or it failed (the
    caller validates in-process)."""
    payload = None
    for worker in list(_validators):
        if not worker.idle():
            continue
        if payload is None:
            payload = _encode((frame, spec, suite_name, json_schema, structured))
        try:
            answer = worker.validate(payload)
        except WorkerError:  # taken by another window meanwhile, or gone
            continue
        try:
            return _decode(wait_for(answer, worker, timeout=ANSWER_SECONDS))
        except WorkerError:
            return None
    return None


@atexit.register
def _close() -> None:
    for worker in _validators:
        worker.close()


def serve_validation(payload: str) -> str:
    """In a worker: `validate_frame` on the request's arguments; its answer, encoded."""
    from expectations.validate import validate_frame

    return _encode(validate_frame(*_decode(payload)))


def load_validation_libraries() -> None:
    """GX and batchgen's suites, imported by a validation worker before it says it is ready."""
    import great_expectations  # noqa: F401

    import expectations.suite  # noqa: F401
    import expectations.validate  # noqa: F401


def _encode(value: Any) -> str:
    return base64.b64encode(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).decode("ascii")


def _decode(text: str) -> Any:
    return pickle.loads(base64.b64decode(text))  # noqa: S301  (this process's own worker, over its pipes)
