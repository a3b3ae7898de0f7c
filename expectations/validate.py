"""Running the suite on a generation table and turning GX's result into per-row verdicts."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pandas as pd

from batchgen.gx_expectations import OUTPUT_COLUMNS
from batchgen.gx_results import ROW_LISTS
from batchgen.job import ExpectationsSpec, JobError, first_line
from expectations.suite import build_suite

ROW_KEY = "row_key"


class ExpectationError(JobError):
    """An expectation GX could not evaluate on the outputs (a comparison their type does not allow, a library it
    could not load): no output may be judged by it, so the window stops instead of every output passing it."""


@dataclass
class Validation:
    verdicts: pd.DataFrame  # row_key, passed, failed (list of batchgen ids)
    result: dict[str, Any]  # the GX validation result, as JSON
    statistics: dict[str, Any]


def prepare_frame(rows: pd.DataFrame, keywords: pd.Series | None) -> pd.DataFrame:
    """The columns the suite reads: text, finish_reason, keyword_present, and a row key."""
    frame = pd.DataFrame({
        ROW_KEY: rows["item_id"].astype(str) + "#" + rows["candidate"].astype(str) + "#" + rows["attempt"].astype(str),
        "text": rows["text"].astype(object),
        "finish_reason": rows["finish_reason"].astype(object),
    })
    for name in OUTPUT_COLUMNS:  # the other output columns a job's own GX expectations may read
        if name not in frame and name in rows and name != "keyword_present":
            frame[name] = rows[name].to_numpy()
    if keywords is not None:
        wanted = rows["item_id"].map(keywords)
        frame["keyword_present"] = [
            isinstance(k, str) and bool(k) and k.casefold() in t.casefold()
            for k, t in zip(wanted.tolist(), rows["text"].tolist())
        ]
    return frame.reset_index(drop=True)


def _quiet_gx() -> None:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    logging.getLogger("great_expectations").setLevel(logging.WARNING)


FrameValidator = Callable[[pd.DataFrame, ExpectationsSpec, str, "dict[str, Any] | None", "tuple[str, Any] | None"],
                          "tuple[list[list[str]], dict[str, Any]] | None"]


def validate_rows(rows: pd.DataFrame, spec: ExpectationsSpec, keywords: pd.Series | None,
                  suite_name: str, json_schema: dict[str, Any] | None = None,
                  structured: tuple[str, Any] | None = None, elsewhere: FrameValidator | None = None) -> Validation:
    """Validate every row with a GX suite built from the job; each row gets the list of expectations it failed.

    `elsewhere`: a function that may run `validate_frame` somewhere else and return its answer, or None to leave
    it to this process (the validate task passes expectations.workers.validate_in_worker: on GPU hosts a worker
    process, so that GX's work leaves the run's process to the engine's outputs and the windows' staging); the
    same verdicts and results either way."""
    frame = prepare_frame(rows, keywords)
    done = elsewhere(frame, spec, suite_name, json_schema, structured) if elsewhere is not None else None
    failed, result_json = done if done is not None else validate_frame(frame, spec, suite_name, json_schema,
                                                                       structured)
    verdicts = pd.DataFrame({
        ROW_KEY: frame[ROW_KEY],
        "passed": [not reasons for reasons in failed],
        "failed": failed,
    })
    return Validation(verdicts=verdicts, result=result_json, statistics=result_json.get("statistics", {}))


def validate_frame(frame: pd.DataFrame, spec: ExpectationsSpec, suite_name: str,
                   json_schema: dict[str, Any] | None = None,
                   structured: tuple[str, Any] | None = None) -> tuple[list[list[str]], dict[str, Any]]:
    """The suite on a prepared frame (`prepare_frame`), in this process: each row's failed expectations (batchgen
    ids, in the frame's order) and GX's validation result as JSON."""
    _quiet_gx()
    with _suite_of(spec, suite_name, json_schema, structured) as (built, validator):
        failed: list[list[str]] = [[] for _ in range(len(frame))]
        result_json: dict[str, Any] = {"success": True, "results": [], "statistics": {}}
        if len(frame) and built.expectations:
            definition, suite = validator()
            batch = definition.get_batch(batch_parameters={"dataframe": frame})
            # Row positions, not row keys: GX builds one dict per failing row for unexpected_index_column_names,
            # which cost 4x the whole validation (2,048 rows: 0.28 s against 0.07 s).
            result = batch.validate(suite, result_format={"result_format": "COMPLETE"})
            keys = frame[ROW_KEY].tolist()
            for outcome in result.results:
                name = outcome.expectation_config.meta.get("batchgen_id", outcome.expectation_config.type)
                _stop_if_raised(outcome, name, spec)
                for position in outcome.result.get("unexpected_index_list") or []:
                    if name not in failed[position]:
                        failed[position].append(name)
                _bound_lists(outcome.result, keys)
            result_json = result_as_json(result)
    return failed, result_json


def _raised_message(exception_info: Any) -> str | None:
    """GX's message where evaluating an expectation raised, else None. GX keeps one exception_info for the
    expectation, or one per metric it computed for it; either way a failure reads as `success: False` with no
    unexpected rows, which would let every output pass."""
    if not isinstance(exception_info, dict):
        return None
    for info in [exception_info, *exception_info.values()]:
        if isinstance(info, dict) and info.get("raised_exception"):
            return first_line(str(info.get("exception_message") or "an exception without a message"))
    return None


def _stop_if_raised(outcome: Any, name: str, spec: ExpectationsSpec) -> None:
    message = _raised_message(outcome.exception_info)
    if message is None:
        return
    field = next((f"expectations.gx.{number}" + (f" ({name})" if entry.id else "")
                  for number, entry in enumerate(spec.gx) if entry.name == name), f"the expectation {name}")
    raise ExpectationError(f"{field}: Great Expectations could not evaluate {outcome.expectation_config.type} on "
                           f"the outputs: {message}")


# GX suites ready to validate: an ephemeral context, its pandas data source, the batch definition and the saved
# suite (~40 ms to make, a third of a 2,048-row window's validation). GX's contexts and data sources are not made
# for threads to share, so each is lent to one validation at a time and given back after it: the flow's windows
# run on threads of their own, and a window on a fresh thread takes a context another window gave back instead of
# making one. Kept for the SUITE_KEYS suites used last in the process.
_FREE: OrderedDict[tuple, list[list[Any]]] = OrderedDict()
_FREE_LOCK = threading.Lock()
SUITE_KEYS = 8


@contextmanager
def _suite_of(spec: ExpectationsSpec, suite_name: str, json_schema: dict[str, Any] | None,
              structured: tuple[str, Any] | None) -> Iterator[tuple[Any, Callable[[], tuple[Any, Any]]]]:
    """The suite as built from the job (its expectations), and a function giving its batch definition and saved
    suite in a context lent to this block alone (made at the first call where none is free)."""
    key = (suite_name, spec.model_dump_json(), json.dumps(json_schema, sort_keys=True, default=str),
           repr(structured), os.environ.get("BATCHGEN_VERBOSE"))
    with _FREE_LOCK:
        free = _free(key)
        entry = free.pop() if free else None
    if entry is None:
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        context = gx.get_context(mode="ephemeral")  # suites need an active context, even before they are saved
        if os.environ.get("BATCHGEN_VERBOSE") != "1":  # GX's metric bars (tqdm): noise in a batch job's log
            context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        entry = [context, build_suite(spec, suite_name, json_schema, structured), None]

    def validator() -> tuple[Any, Any]:
        if entry[2] is None:
            context, built = entry[0], entry[1]
            asset = context.data_sources.add_pandas("batchgen").add_dataframe_asset("generations")
            entry[2] = (asset.add_batch_definition_whole_dataframe("all"), context.suites.add(built))
        return entry[2]

    try:
        yield entry[1], validator
    finally:
        with _FREE_LOCK:
            _free(key).append(entry)


def _free(key: tuple) -> list[list[Any]]:
    """The contexts given back for suite `key`, now the last used (under _FREE_LOCK); the suites used longest ago
    beyond SUITE_KEYS are let go."""
    free = _FREE.setdefault(key, [])
    _FREE.move_to_end(key)
    while len(_FREE) > SUITE_KEYS:
        _FREE.popitem(last=False)
    return free


def result_as_json(result: Any) -> dict[str, Any]:
    """`result.to_json_dict()` of a suite's validation result, made without its deep copy of every expectation's
    result: each expectation's part is converted on its own (the row lists are already cut to their published
    length), with GX's own converter."""
    from great_expectations.util import convert_to_json_serializable

    outcomes = result.results
    result.results = []
    try:
        whole = result.to_json_dict()
    finally:
        result.results = outcomes
    whole["results"] = [{
        "success": outcome.success,
        "expectation_config": outcome.expectation_config.to_json_dict(),
        "result": convert_to_json_serializable(outcome.result),
        "meta": convert_to_json_serializable(outcome.meta),
        "exception_info": convert_to_json_serializable(outcome.exception_info),
    } for outcome in outcomes]
    return whole


def _bound_lists(result: dict[str, Any], keys: list[str]) -> None:
    """Keep LISTED_ROWS failing rows per expectation in the published result (every row's verdict is in
    attempts), each index as the row's key, as GX writes it with unexpected_index_column_names."""
    for name, cap in ROW_LISTS:
        values = result.get(name)
        if not isinstance(values, list):
            continue
        values = values[:cap]
        if name.endswith("index_list"):
            values = [{ROW_KEY: keys[position]} for position in values]
        result[name] = values
