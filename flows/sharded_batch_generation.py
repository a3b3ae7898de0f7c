"""The sharded-batch-generation flow: split a job into shards, run each as a deployment run, merge.

Each shard is a run of a `batch-generation` deployment on a work pool, so it runs on
whichever worker picks it up, with that worker's own engine; a worker started with
`--limit 1` holds one engine at a time. Shards publish into `<out>/shards/<i>-of-<n>/`
(shared storage every worker reaches) and keep their result stores there, so a shard
rerun elsewhere resumes from the last committed chunk. The merge publishes one dataset
with one manifest into `<out>/`, every item exactly once.

Run it as `batchgen run-sharded JOB --shards N`, or call `sharded_batch_generation(...)`.
"""

from __future__ import annotations

import batchgen  # noqa: F401  (first: sets process defaults before Prefect reads its settings)

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

from prefect import flow, task
from prefect.cache_policies import INPUTS, RUN_ID
from prefect.deployments import run_deployment
from prefect.runtime import flow_run
from pydantic import Field
import yaml

from batchgen.items import load_items
from batchgen.job import JOB_MISTAKE_TAG, JobSpec
from batchgen.shards import expected_ids, merge_shards, shard_dir, shard_url
from batchgen.records import Manifest
from batchgen.resolve import override_pairs, resolve_job
from deployments.crash_detection import ensure_crash_detection
from tasks.publish import finish_publication, open_publication

DEFAULT_DEPLOYMENT = "batch-generation/product-descriptions"


class ShardFailed(RuntimeError):
    """A shard's flow run ended in a state other than Completed."""


class ShardJobMistake(ShardFailed):
    """A shard's flow run failed on a mistake in the job (tagged batchgen.job.JOB_MISTAKE_TAG by
    flows.batch_generation): a new run of the shard would meet it again, so run-shard does not retry it."""


def _unless_job_mistake(task: Any, task_run: Any, state: Any) -> bool:
    """run-shard's retry_condition_fn: retry a failed or crashed shard run, not one that failed on a job mistake."""
    return not isinstance(state.data, ShardJobMistake)


# Within one run of this flow a finished shard is served from the task cache (a retry of
# the whole flow redoes only the shards that failed); a new run of the flow reruns every
# shard, which costs little: each shard's result store answers what was generated before.
@task(name="run-shard", retries=2, retry_delay_seconds=5, cache_policy=INPUTS + RUN_ID, persist_result=True,
      retry_condition_fn=_unless_job_mistake)
def run_shard_task(deployment: str, parameters: dict[str, Any], label: str) -> str:
    """Run one shard as a deployment run and wait for it; a failed or crashed run is retried as a new run, unless
    it failed on a mistake in the job (ShardJobMistake)."""
    run = run_deployment(name=deployment, parameters=parameters, timeout=0, as_subflow=True,
                         tags=["batchgen-shard"])
    if run.state is None or not run.state.is_final():  # created and scheduled: wait for a worker to run it
        run = wait_for_final_state(run.id, label)
    state = run.state
    if state is None or not state.is_completed():
        failed = ShardJobMistake if JOB_MISTAKE_TAG in (run.tags or []) else ShardFailed
        raise failed(f"{label}: flow run {run.name} ({run.id}) ended {state.name if state else 'without a state'}"
                     f": {state.message if state else ''}")
    print(f"{label}: flow run {run.name} completed")
    return str(run.id)


@task(name="merge-shards", cache_policy=None)
def merge_task(job: JobSpec, shard_dirs: list[Path], ids: list[str], started_at: datetime,
               shard_urls: list[str] | None = None) -> Manifest:
    """Publish the shards' outputs as one dataset with one manifest (checked: every item exactly once)."""
    identity = {"job": job.name, "job_fingerprint": job.fingerprint(), "flow_name": flow_run.get_flow_name(),
                "flow_run_id": flow_run.get_id(), "started_at": started_at.isoformat(),
                "input": job.input.model_dump(mode="json")}
    with open_publication(job) as publication:
        written = merge_shards(publication, shard_dirs, ids, identity, shard_urls)
        finish_publication(job, publication, "sharded-summary",
                           f"{job.name}: merged run summary ({len(shard_dirs)} shards)", "merge")
    return written


def write_shard_job(job: JobSpec, out_dir: Path) -> Path:
    """A job given as a JobSpec, written where every worker reads the shards (its paths are absolute already)."""
    path = out_dir / "shards" / "job.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(job.model_dump(mode="json"), allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


API_ERRORS_TOLERATED_SECONDS = 120.0  # a shard's run may outlast a busy API; longer than that is a real failure


def wait_for_final_state(flow_run_id: Any, label: str, poll_seconds: float = 5.0,
                         tolerate_seconds: float = API_ERRORS_TOLERATED_SECONDS) -> Any:
    """The flow run once its state is final, read from the API every `poll_seconds`. An API error while waiting
    (a busy server answering 500, a dropped connection) is retried for up to `tolerate_seconds` in a row: a
    shard that is running, or already done, is not started again because one answer was lost."""
    from prefect import get_client

    failing_since = None
    while True:
        try:
            with get_client(sync_client=True) as client:
                run = client.read_flow_run(flow_run_id)
            failing_since = None
            if run.state is not None and run.state.is_final():
                return run
        except Exception as exc:  # httpx and Prefect's HTTP errors alike: the server may answer again
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > tolerate_seconds:
                raise
            print(f"{label}: reading flow run {flow_run_id} failed ({type(exc).__name__}: {exc}); trying again")
        time.sleep(poll_seconds)


@flow(name="sharded-batch-generation", log_prints=True)
def sharded_batch_generation(
    job: JobSpec | str,
    shards: Annotated[int, Field(ge=1)] = 2,
    deployment: str = DEFAULT_DEPLOYMENT,
    limit: Annotated[int | None, Field(ge=1)] = None,
    max_tokens: Annotated[int | None, Field(ge=1)] = None,
    output_dir: str | None = None,
    overrides: list[str] | None = None,
) -> Manifest:
    """Run a job as N shards on a work pool's workers and publish one merged dataset; returns its manifest.

    Args:
        job: A job file path (as the workers see it: relative to the project folder, or absolute), or the job.
        shards: How many shards (deployment runs) to split the items into, by a stable hash of the item id.
        deployment: The batch-generation deployment each shard runs as (flow/deployment name).
        limit: Only the first N input rows.
        max_tokens: The first pass's sampling.max_tokens.
        output_dir: Publish here instead of the job's output.dir; must be storage every worker reaches.
        overrides: More job settings as key=value, e.g. sampling.temperature=0.2.
    """
    started_at = datetime.now(timezone.utc)
    spec = resolve_job(job, limit, max_tokens, output_dir, overrides)
    ensure_crash_detection()
    ids = expected_ids(load_items(spec.input))
    print(f"shards: {len(ids)} items into {shards} shards of {deployment}")
    base = override_pairs(limit, max_tokens, overrides)
    dirs = [shard_dir(spec.output.dir, i, shards) for i in range(shards)]
    # With output.publish_to, shards publish to <publish_to>/shards/<i>-of-<n> and the merge reads them
    # there, so <out>/shards/ need not be shared (it is each worker's working folder and result store).
    urls = [shard_url(spec.output.publish_to, i, shards) for i in range(shards)] if spec.output.publish_to else None
    if isinstance(job, JobSpec):  # deployment runs take a job path (their form's `job` is a path)
        job = write_shard_job(job, Path(spec.output.dir))
    futures = []
    for index, directory in enumerate(dirs):
        parameters = {
            "job": str(job),
            "output_dir": str(directory),
            # A shard's partial dataset never switches <publish_to>/current.json: it goes to its own place.
            "overrides": base + [f"input.shard_count={shards}", f"input.shard_index={index}",
                                 f"output.publish_to={urls[index] if urls else 'null'}"],
        }
        futures.append(run_shard_task.submit(deployment, parameters, f"shard {index + 1} of {shards}"))
    for future in futures:
        future.result()
    return merge_task(spec, dirs, ids, started_at, urls)
