"""Publish the dataset and the run's summary."""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from batchgen.assemble import LostItemsError, assemble
from batchgen.job import JobSpec
from batchgen.manifest import build_manifest, code_provenance, tally
from batchgen.progress import for_run, run_key
from batchgen.publish import CURRENT, PUBLICATIONS, REJECTED, RESULTS, Publication, ready_jsonl_writer
from batchgen.records import ATTEMPTS_SCHEMA, EngineStats, Manifest, RunTotals, Tally, Window
from batchgen.remote import CURRENT_JSON, upload_publication
from batchgen.report import preload as preload_report
from batchgen.report import start_chart_worker, start_charts, start_data_docs, write_report_and_markdown
from batchgen.retry import latest_attempts
from batchgen.summary import summary_markdown
from batchgen.table_figures import TableFigures
from batchgen.gx_results import merge_results
from tasks.prompts import PromptStep
from tasks.validate import Validated


def open_publication(job: JobSpec, preload: bool = True) -> Publication:
    """The run's publication (the one writer of its tables): staged, and discarded if the run fails before it
    is committed. Use it as a context manager. What publishing needs gets ready: the code's git state, the JSON-lines
    writer (with output.jsonl), and in the background the report's chart worker process and with `preload` the rest
    of the report (`preload_publish`)."""
    code_provenance()  # looked up meanwhile, not after the engine
    if job.output.jsonl:
        ready_jsonl_writer()
    if preload:
        preload_publish()
    elif charts_apart():
        # one chart worker now, ready for a short run's report (its imports take another core); preload_publish
        # starts the others once the engine has its first requests
        start_chart_worker(1)
    return Publication.open(Path(job.output.dir), jsonl=job.output.jsonl, keep=job.output.keep,
                            id_column=job.input.id_column)


def preload_publish() -> None:
    """The report's libraries and GX's page templates, loaded in a background thread of this process
    (batchgen.report.preload). The batch flow calls it once the engine has its first requests: before that, it
    would slow down the first window's prompts."""
    preload_report(chart_worker=charts_apart())


def charts_apart() -> bool:
    """Whether the report's charts are drawn in a worker process of their own: yes where the engine runs on an
    accelerator; no on CPU builds, where the engine's threads use every core and a process importing matplotlib
    beside them slowed its generation (2 cores: the flow's generation stage at 0.82 of raw vLLM against 0.99)."""
    from batchgen.engine import on_cpu

    return not on_cpu()


@task(name="stage-window", cache_policy=NO_CACHE, task_run_name="stage-window-{window.label}")
def stage_window_task(job: JobSpec, publication: Publication, window: Window, prompts: PromptStep | None,
                      engine: list[EngineStats], validated: list[Validated]) -> Tally:
    """Choose each item's published candidate in one window and write the window's rows into the publication,
    with the window's totals (its counts, GX results and figures); the window's items each end in accepted or
    rejected, exactly once. Returns the window's counts."""
    started = time.perf_counter()
    attempts = pd.concat([v.rows for v in validated], ignore_index=True) if validated else \
        pd.DataFrame(columns=ATTEMPTS_SCHEMA.names)
    rejected = window.rejected + (prompts.built.rejected if prompts is not None else [])
    result = assemble(window.items, window.columns, rejected, latest_attempts(attempts), job.sampling)
    engine = sum(engine, EngineStats())
    counted = tally(result.accepted, result.rejected, attempts, reused=engine.reused)
    seconds = Counter(load_and_prompts=prompts.seconds if prompts is not None else 0.0,
                      validate_and_stage=sum(v.seconds for v in validated) + time.perf_counter() - started)
    publication.add_window(window.index, result.accepted, result.rejected, attempts, window.inputs, RunTotals(
        tally=counted, engine=engine, validation=[[v.result] for v in validated], seconds=seconds,
        model=prompts.model if prompts is not None else None))
    progress = for_run(run_key(job))
    if progress is not None:
        progress.staged_window(window.label, counted.items)
    return counted


@task(name="publish", cache_policy=NO_CACHE, task_run_name="publish")
def publish_task(job: JobSpec, publication: Publication, started_at: datetime) -> Manifest:
    """Join the windows' rows into the accepted, rejected and attempts tables, add the GX results, the dataset card,
    the manifest and the report; switch `current` to it."""
    totals = publication.totals
    # The timings count from the flow's start (`started_at`), on the clock the tasks' figures use.
    started = publication.opened - (publication.opened_at - started_at).total_seconds()
    timings = totals.timings(started, publication.windows_done or time.perf_counter())
    sealing = time.perf_counter()
    manifest = build_manifest(job, totals, timings, started_at, flow_run.get_id(), flow_run.get_flow_name())
    validation = [merge_results(results) for results in totals.validation]
    # the Data Docs need only the validation results, the charts the figures the windows' rows added up to: workers
    # build them while the tables are sealed here
    data_docs = start_data_docs(publication.staging, validation, manifest.started_at)
    figures = publication.figures()
    charts = start_charts(publication.staging, figures, manifest, validation)
    written = publication.seal(manifest, validation)
    if publication.join_fallback is not None:
        get_run_logger().debug("publish: the windows' parts joined at seal (%s)", publication.join_fallback)
    check_published_once(publication.staging, totals.tally.items)
    steps = {"seal": time.perf_counter() - sealing}
    finish_publication(job, publication, _artifact_key(job.name), f"{job.name}: run summary", "publish", steps,
                       data_docs, charts, figures)
    return written


def log_publish_steps(label: str, steps: dict[str, float], report: dict[str, float]) -> None:
    """One log line of where publishing's time went (the run's last step, after the engine's last output): the
    seal (tables joined, hashed, manifest), the report and its parts, the commit and the summary artifact."""
    parts = ", ".join(f"{name.replace('_', ' ')} {seconds:.2f}" for name, seconds in report.items())
    get_run_logger().info("%s: in %.2f s: %s", label, sum(steps.values()), "; ".join(
        f"{name} {seconds:.2f}" + (f" ({parts})" if name == "report" and parts else "")
        for name, seconds in steps.items()))


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


def finish_publication(job: JobSpec, publication: Publication, artifact_key: str, artifact_description: str,
                       label: str, steps: dict[str, float] | None = None, data_docs: Any = None, charts: Any = None,
                       figures: TableFigures | None = None) -> Path:
    """Add the report to a sealed publication, switch `current` to it, post the summary, copy it to shared storage.
    `steps`: seconds of the publishing steps before this one (by name), logged with this one's in one line;
    `data_docs` and `charts`: the Data Docs and charts asked of workers already (batchgen.report.start_data_docs,
    start_charts); `figures`: the tables' figures as the publication's writer added them up."""
    # Anything else that belongs to this publication is written into it before the commit,
    # so that readers of <out>/current see it together with the data or not at all.
    # report.html and data_docs/ belong to this publication; the markdown is the report's figures, read once
    steps, report = dict(steps or {}), {}
    started = time.perf_counter()
    _, markdown = write_report_and_markdown(publication.staging, report, data_docs, charts, figures)
    committing = time.perf_counter()
    out_dir = Path(job.output.dir)
    published = publication.commit()
    written = publication.manifest
    posting = time.perf_counter()
    create_markdown_artifact(markdown=summary_markdown(written) + markdown, key=artifact_key,
                             description=artifact_description)
    steps.update(report=committing - started, commit=posting - committing, artifact=time.perf_counter() - posting)
    log_publish_steps(label, steps, report)
    counts = written.counts
    print(f"{label}: {counts.accepted} accepted, {counts.rejected} rejected of {counts.items} items "
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
