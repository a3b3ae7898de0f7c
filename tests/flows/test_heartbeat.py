"""The batch flow's heartbeat (batchgen/heartbeat.py): the events crash detection watches, sent from the flow's
body while Prefect's own heartbeat thread is off for the call."""

from __future__ import annotations

import time

from batchgen.job import job_from_dict
from tests.conftest import product_job
from tests.flows.test_batch_generation_flow import stand_in  # noqa: F401  (fixture)


def heartbeat_events(flow_run_id) -> list:
    """The heartbeat events the server holds for one flow run (the events worker sends them in the background:
    read until they stop changing)."""
    from prefect import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    query = EventFilter(event=EventNameFilter(name=["prefect.flow-run.heartbeat"]),
                        resource=EventResourceFilter(id=[f"prefect.flow-run.{flow_run_id}"]))
    seen, deadline = None, time.monotonic() + 15
    while time.monotonic() < deadline:
        with get_client(sync_client=True) as client:
            events = client.read_events(filter=query, limit=50).events
        if events and seen is not None and len(events) == len(seen):
            return events
        seen = events
        time.sleep(1.0)
    return seen or []


def test_a_run_sends_one_heartbeat_per_period_for_its_flow_run(tmp_path, prefect_server, stand_in):  # noqa: F811
    from flows.batch_generation import batch_generation

    job = job_from_dict(product_job(tmp_path, 6, expectations={"keyword_column": None}))
    manifest = batch_generation(job)  # seconds long, under the 180 s default period

    [event] = heartbeat_events(manifest.flow_run_id)  # one: batchgen's, at the start; Prefect's own thread is off
    assert event.resource.id == f"prefect.flow-run.{manifest.flow_run_id}"
    flows = [r for r in event.related if r.role == "flow"]
    assert [r.name for r in flows] == ["batch-generation"]


def test_options_keep_the_quick_heartbeat():
    from batchgen.heartbeat import QuickHeartbeatFlow
    from flows.batch_generation import batch_generation

    assert isinstance(batch_generation, QuickHeartbeatFlow)
    assert isinstance(batch_generation.with_options(retries=3), QuickHeartbeatFlow)


def test_a_quick_flow_with_heartbeats_off_sends_none(tmp_path, prefect_server, stand_in):  # noqa: F811
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from flows.batch_generation import batch_generation

    job = job_from_dict(product_job(tmp_path, 4, expectations={"keyword_column": None}))
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        manifest = batch_generation(job)
    assert heartbeat_events(manifest.flow_run_id) == []
