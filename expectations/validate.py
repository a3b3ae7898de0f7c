"""Running the suite on a generation table and turning GX's result into per-row verdicts."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import pandas as pd

from batchgen.job import ExpectationsSpec
from expectations.suite import build_suite

ROW_KEY = "row_key"


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
    if keywords is not None:
        wanted = rows["item_id"].map(keywords)
        frame["keyword_present"] = [
            isinstance(k, str) and bool(k) and k.casefold() in t.casefold()
            for k, t in zip(wanted, rows["text"])
        ]
    return frame.reset_index(drop=True)


def _quiet_gx() -> None:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    logging.getLogger("great_expectations").setLevel(logging.WARNING)


def validate_rows(rows: pd.DataFrame, spec: ExpectationsSpec, keywords: pd.Series | None,
                  suite_name: str, json_schema: dict[str, Any] | None = None) -> Validation:
    """Validate every row with a GX suite built from the job; each row gets the list of expectations it failed."""
    _quiet_gx()
    import great_expectations as gx

    frame = prepare_frame(rows, keywords)
    context = gx.get_context(mode="ephemeral")  # suites need an active context, even before they are saved
    suite = build_suite(spec, suite_name, json_schema)
    failed: dict[str, list[str]] = {key: [] for key in frame[ROW_KEY]}
    result_json: dict[str, Any] = {"success": True, "results": [], "statistics": {}}
    if len(frame) and suite.expectations:
        source = context.data_sources.add_pandas("batchgen")
        asset = source.add_dataframe_asset("generations")
        batch = asset.add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame})
        suite = context.suites.add(suite)
        result = batch.validate(
            suite, result_format={"result_format": "COMPLETE", "unexpected_index_column_names": [ROW_KEY]}
        )
        for outcome in result.results:
            name = outcome.expectation_config.meta.get("batchgen_id", outcome.expectation_config.type)
            for entry in outcome.result.get("unexpected_index_list") or []:
                key = entry[ROW_KEY] if isinstance(entry, dict) else frame.loc[entry, ROW_KEY]
                if name not in failed[key]:
                    failed[key].append(name)
        result_json = result.to_json_dict()
    verdicts = pd.DataFrame({
        ROW_KEY: list(failed),
        "passed": [not reasons for reasons in failed.values()],
        "failed": list(failed.values()),
    })
    return Validation(verdicts=verdicts, result=result_json, statistics=result_json.get("statistics", {}))
