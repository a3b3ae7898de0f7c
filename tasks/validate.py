"""Validate outputs with the job's Great Expectations suite."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pandas as pd
from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from batchgen.job import JobSpec
from expectations import workers as validation_workers
from expectations.validate import validate_rows


@dataclass
class Validated:
    rows: pd.DataFrame  # the attempts with their verdicts: passed and failed (batchgen.records.Verdict)
    result: dict[str, Any]  # the GX validation result, as JSON
    seconds: float  # the task's own time


def expectation_table(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per expectation: what it checks and how many rows failed it."""
    table = []
    for outcome in result.get("results", []):
        config = outcome["expectation_config"]
        res = outcome.get("result", {})
        table.append({
            "expectation": config.get("meta", {}).get("batchgen_id", config["type"]),
            "description": config.get("description") or config["type"],
            "rows": res.get("element_count"),
            "failed": res.get("unexpected_count"),
            "success": outcome["success"],
        })
    return table


@task(name="validate", cache_policy=NO_CACHE, task_run_name="validate-{label}")
def validate_task(job: JobSpec, rows: pd.DataFrame, keywords: pd.Series | None, label: str) -> Validated:
    """Run the GX suite; every row gets passed/failed and the expectations it failed."""
    started = time.perf_counter()
    validation = validate_rows(rows, job.expectations, keywords, suite_name=f"{job.name}-outputs",
                               structured=job.sampling.structured, elsewhere=validation_workers.validate_in_worker)
    out = rows.reset_index(drop=True).copy()  # the verdicts are in the rows' order
    out["passed"] = validation.verdicts["passed"].to_numpy(dtype=bool)
    out["failed"] = validation.verdicts["failed"].to_list()
    summary = expectation_table(validation.result)
    if summary:
        create_table_artifact(table=summary, description=f"{job.name}: expectations, {label}")
    print(f"validate [{label}]: {int(out['passed'].sum())}/{len(out)} outputs pass every expectation; "
          + ", ".join(f"{s['expectation']} failed {s['failed']}" for s in summary))
    return Validated(rows=out, result=validation.result, seconds=time.perf_counter() - started)
