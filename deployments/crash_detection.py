"""Crash detection for deployment runs whose machine died: Prefect's heartbeat automation.

A worker's flow-run process sends a heartbeat event every PREFECT_FLOWS_HEARTBEAT_FREQUENCY
seconds (deployments/prefect.yaml sets 30 for the batchgen pool). If a run's heartbeats stop
without a final state, this automation marks the run Crashed, so whoever waits on it (the
sharded flow's run-shard task) sees it end and starts the shard again on another worker.
"""

from __future__ import annotations

import os
from datetime import timedelta

AUTOMATION_NAME = "batchgen: crash flow runs that stopped sending heartbeats"


def crash_after_seconds() -> int:
    """Three missed heartbeats at the pool's 30 s by default; BATCHGEN_CRASH_AFTER_SECONDS changes it."""
    return int(os.environ.get("BATCHGEN_CRASH_AFTER_SECONDS", "90"))


def ensure_crash_detection() -> None:
    """Create the automation on the current Prefect server unless it exists."""
    from prefect.automations import Automation
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    with get_client(sync_client=True) as client:
        if client.read_automations_by_name(AUTOMATION_NAME):
            return
    Automation(
        name=AUTOMATION_NAME,
        description="Marks a flow run Crashed when its heartbeats stop (its machine or worker died).",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", "prefect.flow-run.Completed", "prefect.flow-run.Failed",
                    "prefect.flow-run.Cancelled", "prefect.flow-run.Crashed"},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=crash_after_seconds()),
        ),
        actions=[ChangeFlowRunState(state=StateType.CRASHED,
                                    message="Marked Crashed by batchgen: no heartbeat from its process.")],
    ).create()
