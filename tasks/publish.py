"""Publish the dataset and the run's summary."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from batchgen.assemble import assemble
from batchgen.items import LoadedItems
from batchgen.job import JobSpec
from batchgen.manifest import build_manifest
from batchgen.publish import CURRENT, PUBLICATIONS, commit, stage
from batchgen.remote import CURRENT_JSON, upload_publication
from batchgen.report import report_markdown, write_report
from batchgen.retry import latest_attempts
from batchgen.summary import summary_markdown
from tasks.prompts import PromptStep


@task(name="publish", cache_policy=NO_CACHE)
def publish_task(
    job: JobSpec,
    loaded: LoadedItems,
    prompts: PromptStep,
    attempts: pd.DataFrame,
    validation: list[dict[str, Any]],
    engine_args: dict[str, Any],
    reused: int,
    fresh_output_tokens: int,
    timings: dict[str, float],
    started_at: datetime,
) -> dict[str, Any]:
    """Write accepted, rejected, every attempt, the GX results and the manifest into a new publication; switch to it."""
    final = latest_attempts(attempts)
    result = assemble(loaded.items, loaded.columns, loaded.rejected + prompts.built.rejected, final, job.sampling)
    manifest = build_manifest(
        job, {"name": prompts.model.name, "path": prompts.model.path}, engine_args, result.accepted,
        result.rejected, attempts, reused, fresh_output_tokens, timings, started_at, flow_run.get_id(),
        flow_run.get_flow_name(),
    )
    written, staging = stage(Path(job.output.dir), result.accepted, result.rejected, attempts, validation, manifest,
                             job.output.jsonl)
    finish_publication(job, written, staging, _artifact_key(job.name), f"{job.name}: run summary", "publish")
    return written


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
