"""The flow's steps as the Prefect UI shows them: one task run per step, named by its window and pass."""

from __future__ import annotations

import asyncio
import time

import pytest

from batchgen.job import job_from_dict
from tests.conftest import product_job
from tests.flows.test_batch_generation_flow import stand_in  # noqa: F401  (fixture)


@pytest.mark.parametrize("in_stream", [True, False])
def test_task_runs_are_named_by_window_and_pass(tmp_path, prefect_server, stand_in, in_stream):  # noqa: F811
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.batch_generation import batch_generation

    job = job_from_dict(product_job(tmp_path, 12, expectations={"keyword_column": None},
                                    retry={"max_passes": 2, "in_stream": in_stream}, window_size=6,
                                    windows_in_flight=2))
    manifest = batch_generation(job)
    assert manifest.counts.items == 12 and manifest.counts.accepted == 12

    async def task_runs():
        async with get_client() as client:
            return await client.read_task_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[manifest.flow_run_id])))

    async def artifacts():
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

        async with get_client() as client:
            return await client.read_artifacts(artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[manifest.flow_run_id])))

    # two windows of 6; everything is cut off at 12 tokens, the first retry ends every output: in the stream of
    # the first generate task (in_stream: it followed up every cut-off output, so no retry pass is planned after
    # it), or in a retry pass after validation, after which a plan finds nothing to retry (it runs, no generate
    # follows). Each attempt is validated on its own, a pass each.
    expected = ["check-job", "load-items", "publish"]
    for window in ("w1", "w2"):
        expected += [f"build-prompts-{window}", f"generate-{window}", f"validate-{window}",
                     f"validate-{window}-retry1", f"stage-window-{window}"]
        if not in_stream:
            expected += [f"plan-retry-{window}-retry1", f"generate-{window}-retry1", f"plan-retry-{window}-retry2"]
    # the server records task runs from their events in the background (a busy SQLite server under CI's load took
    # a minute once): wait for every one to be there, completed, as the UI would show them once it has caught up
    deadline = time.monotonic() + 120
    while True:
        runs = asyncio.run(task_runs())
        settled = sorted(run.name for run in runs) == sorted(expected) and all(run.state.is_completed()
                                                                            for run in runs)
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sorted(run.name for run in runs) == sorted(expected)
    assert all(run.state.is_completed() for run in runs)
    # each validate and generate task's artifact belongs to its task run: an expectations table per validation,
    # a progress per generate task, done. Prefect's client sends a request again when its answer is late
    # (PREFECT_API_REQUEST_TIMEOUT), and a server too busy to answer in time has then made the artifact twice, the
    # task's updates going to one of them (CI once; made to happen with PREFECT_API_REQUEST_TIMEOUT=0.03): so each
    # task run's own artifacts are compared, with the progress the task last set
    by_id = {run.id: run.name for run in runs}
    made = asyncio.run(artifacts())
    tables = {by_id[a.task_run_id] for a in made if a.type == "table"}
    assert tables == {run.name for run in runs if run.name.startswith("validate-")}
    progress: dict[str, float] = {}
    for a in made:
        if a.type == "progress":
            name = by_id[a.task_run_id]
            progress[name] = max(float(a.data), progress.get(name, 0.0))
    assert progress == {run.name: 100.0 for run in runs if run.name.startswith("generate-")}
    # the publish task says where its time went, in its own log: the seal, the report and its parts, the commit
    publish = next(run.id for run in runs if run.name == "publish")
    lines = publish_log(publish)
    steps = [line for line in lines if line.startswith("publish: in ")]
    assert len(steps) == 1, lines
    for part in ("seal ", "report ", "read ", "data docs ", "charts ", "page ", "commit ", "artifact "):
        assert part in steps[0], steps[0]


def publish_log(task_run_id, wait: float = 60.0) -> list[str]:
    """The messages logged by a task run, as the Prefect UI shows them (logs reach the server in batches: waits up
    to `wait` seconds for the summary line)."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterTaskRunId

    async def read():
        async with get_client() as client:
            return await client.read_logs(log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=[task_run_id])))

    deadline = time.monotonic() + wait
    while True:
        lines = [log.message for log in asyncio.run(read())]
        if any(line.startswith("publish: in ") for line in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)
