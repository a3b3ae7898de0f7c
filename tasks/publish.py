"""Publish the dataset and the run's summary."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from batchgen.assemble import LostItemsError, assemble
from batchgen.items import Rejection
from batchgen.job import JobSpec
from batchgen.manifest import build_manifest, tally
from batchgen.models import ModelRef
from batchgen.publish import ATTEMPTS, CURRENT, PUBLICATIONS, REJECTED, RESULTS, commit, frame_tables, stage_part, \
    stage_parts
from batchgen.remote import CURRENT_JSON, upload_publication
from batchgen.report import report_markdown, write_report
from batchgen.retry import latest_attempts
from batchgen.summary import summary_markdown


@task(name="stage-window", cache_policy=NO_CACHE)
def stage_window_task(
    job: JobSpec,
    staging: Path,
    index: int,
    items: pd.DataFrame,
    columns: list[str],
    early_rejections: list[Rejection],
    attempts: pd.DataFrame,
    codec: tuple[pa.DataType, Callable[[Any], Any]],
) -> dict[str, Any]:
    """Choose each item's published candidate in one window, write the window's rows into the staged publication,
    and return its counts; the window's items each end in accepted or rejected, exactly once."""
    result = assemble(items, columns, early_rejections, latest_attempts(attempts), job.sampling)
    stage_part(staging, index, frame_tables(result.accepted, result.rejected, attempts, codec, job.input.id_column))
    return tally(result.accepted, result.rejected, attempts)


@task(name="publish", cache_policy=NO_CACHE)
def publish_task(
    job: JobSpec,
    staging: Path,
    counted: dict[str, Any],
    validation: list[dict[str, Any]],
    model: ModelRef,
    engine_args: dict[str, Any],
    reused: int,
    fresh_output_tokens: int,
    timings: dict[str, float],
    started_at: datetime,
) -> dict[str, Any]:
    """Join the windows' rows into the accepted, rejected and attempts tables, add the GX results, the dataset card
    and the manifest; switch."""
    manifest = build_manifest(job, {"name": model.name, "path": model.path}, engine_args, counted, reused,
                              fresh_output_tokens, timings, started_at, flow_run.get_id(), flow_run.get_flow_name())
    written, staging = stage_parts(Path(job.output.dir), staging, [RESULTS, REJECTED, ATTEMPTS], validation,
                                   manifest, job.output.jsonl)
    check_published_once(staging, counted["items"])
    finish_publication(job, written, staging, _artifact_key(job.name), f"{job.name}: run summary", "publish")
    return written


def check_published_once(staging: Path, expected: int) -> None:
    """Across windows: results and rejected hold `expected` distinct item ids, none twice (read as Arrow columns;
    with selection `all` an accepted item has a results row per published candidate and counts once)."""
    accepted = pc.unique(pq.read_table(staging / RESULTS, columns=["item_id"])["item_id"])
    ids = pa.chunked_array([accepted.cast(pa.string())] +
                           pq.read_table(staging / REJECTED, columns=["item_id"])["item_id"].chunks, type=pa.string())
    distinct = len(pc.unique(ids))
    if len(ids) != expected or distinct != len(ids):
        raise LostItemsError(f"{staging.name}: {len(ids)} published rows, {distinct} distinct items, "
                             f"{expected} expected")


def finish_publication(job: JobSpec, written: dict[str, Any], staging: Path, artifact_key: str,
                       artifact_description: str, label: str) -> Path:
    """Add the report to a staged publication, switch `current` to it, post the summary, copy it to shared storage."""
    # Anything else that belongs to this publication is written into `staging` before the commit,
    # so that readers of <out>/current see it together with the data or not at all.
    write_report(staging)  # report.html and data_docs/ belong to this publication
    out_dir = Path(job.output.dir)
    published = commit(out_dir, staging, job.output.keep)
    create_markdown_artifact(markdown=summary_markdown(written) + report_markdown(published), key=artifact_key,
                             description=artifact_description)
    counts = written["counts"]
    print(f"{label}: {counts['accepted']} accepted, {counts['rejected']} rejected of {counts['items']} items "
          f"-> {out_dir / CURRENT} ({published.relative_to(out_dir)})")
    if job.output.publish_to:
        # After the local commit: the shared copy's current.json is written last, so readers there
        # see this publication complete or still the previous one.
        upload_publication(published, job.output.publish_to, job.output.keep)
        print(f"{label}: copied {published.name} -> {job.output.publish_to.rstrip('/')}/{PUBLICATIONS}/"
              f"{published.name} ({CURRENT_JSON} switched)")
    return published


def _artifact_key(name: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes."""
    key = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
    return f"{key or 'batch'}-summary"
