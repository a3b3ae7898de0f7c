"""GX validation in worker processes (expectations.workers): the same verdicts and results as in-process; a
validation that finds no ready, idle worker, or whose worker dies, runs in-process."""

from __future__ import annotations

import copy

import pandas as pd
import pytest

import batchgen.engine
import batchgen.workers
import expectations.workers as workers
from batchgen.workers import Worker
from expectations.validate import validate_rows
from tests.jobs import SPEC
from tests.unit.expectations.test_validate import CASES


@pytest.fixture(scope="module")
def validator():
    started = Worker.start(validates=True)
    assert started.ready.wait(timeout=180), "the validation worker never said it was ready"
    yield started
    started.close()
    started.process.wait(timeout=30)


def rows_and_keywords(copies: int = 1) -> tuple[pd.DataFrame, pd.Series]:
    ids = [f"{item}-{n}" for n in range(copies) for item in CASES]
    cases = [CASES[item] for _ in range(copies) for item in CASES]
    rows = pd.DataFrame({"item_id": ids, "candidate": [0] * len(ids), "attempt": [1] * len(ids),
                         "text": [c[0] for c in cases], "finish_reason": [c[1] for c in cases],
                         "n_output_tokens": [len(c[0]) // 4 for c in cases]})
    return rows, pd.Series(dict(zip(ids, (c[2] for c in cases))), dtype="string")


def comparable(result: dict) -> dict:
    """GX's result without what differs between any two validations: the batch's load time, and the ids GX gives
    the expectations of a suite when a context saves it (each context its own, in one process too)."""
    result = copy.deepcopy(result)
    result["meta"]["batch_markers"].pop("ge_load_time", None)
    for outcome in result["results"]:
        outcome["expectation_config"].pop("id", None)
    return result


def validate(monkeypatch, validators: list) -> object:
    monkeypatch.setattr(workers, "_validators", validators)
    rows, keywords = rows_and_keywords(40)
    return validate_rows(rows, SPEC, keywords, suite_name="unit-workers",
                         elsewhere=lambda *args: workers.validate_in_worker(*args))  # as the validate task does


def test_a_worker_gives_the_verdicts_and_result_of_an_in_process_validation(monkeypatch, validator):
    served = []
    original = workers.validate_in_worker
    monkeypatch.setattr(workers, "validate_in_worker", lambda *a: served.append(original(*a)) or served[-1])
    here, there = validate(monkeypatch, []), validate(monkeypatch, [validator])
    assert served[0] is None and served[1] is not None  # in-process first, then by the worker
    assert here.verdicts.equals(there.verdicts)
    expected = [CASES[key.split("#")[0].rsplit("-", 1)[0]][3] for key in there.verdicts["row_key"]]
    assert [set(failed) for failed in there.verdicts["failed"]] == expected
    assert comparable(here.result) == comparable(there.result)
    assert there.result["statistics"]["evaluated_expectations"] == 6


def test_a_busy_or_dead_worker_leaves_the_validation_to_this_process(monkeypatch, validator):
    here = validate(monkeypatch, [])
    rows, keywords = rows_and_keywords(1)
    from expectations.validate import prepare_frame

    answer = validator.validate(workers._encode((prepare_frame(rows, keywords), SPEC, "unit-busy", None, None)))
    try:  # busy: not asked, not waited for
        monkeypatch.setattr(workers, "_validators", [validator])
        assert workers.validate_in_worker(prepare_frame(rows, keywords), SPEC, "unit-busy", None, None) is None
    finally:
        answer.result(timeout=120)
    dead = Worker.start(validates=True)
    dead.kill()
    dead.process.wait(timeout=30)
    dead.ready.set()  # as if it had been ready before it died
    monkeypatch.setattr(Worker, "alive", lambda self: True)  # and died after it was looked at
    after = validate(monkeypatch, [dead])
    assert here.verdicts.equals(after.verdicts) and comparable(here.result) == comparable(after.result)


def test_validation_workers_run_only_on_accelerators_one_per_window_in_flight(monkeypatch):
    monkeypatch.setattr(batchgen.engine, "on_cpu", lambda: True)
    assert workers.wanted(3) == 0
    monkeypatch.setattr(batchgen.engine, "on_cpu", lambda: False)
    for cores, in_flight, count in ((16, 3, 3), (8, 3, 2), (2, 3, 0), (64, 1, 1)):
        monkeypatch.setattr(batchgen.workers.os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        assert workers.wanted(in_flight) == count
