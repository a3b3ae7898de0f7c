"""Crash detection (deployments/crash_detection.py) on a real temporary Prefect server: the heartbeat automation."""

from __future__ import annotations

from datetime import timedelta

import pytest

from deployments.crash_detection import AUTOMATION_NAME, ensure_crash_detection


def _remove_automation() -> None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        for automation in client.read_automations_by_name(AUTOMATION_NAME):
            client.delete_automation(automation.id)


@pytest.fixture
def server_without_automation(prefect_server):
    """The session's server as a sharded run first finds it; afterwards as this test found it (no 45 s one left)."""
    _remove_automation()
    yield
    _remove_automation()


def test_the_automation_is_created_once_and_crashes_runs_whose_heartbeats_stop(server_without_automation,
                                                                               monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType

    monkeypatch.setenv("BATCHGEN_CRASH_AFTER_SECONDS", "45")
    ensure_crash_detection()
    ensure_crash_detection()  # every sharded run calls it: a second call adds nothing

    with get_client(sync_client=True) as client:
        automations = client.read_automations_by_name(AUTOMATION_NAME)
    assert len(automations) == 1
    automation = automations[0]
    trigger = automation.trigger
    assert automation.enabled
    assert (trigger.posture, set(trigger.after), trigger.within) == (
        "Proactive", {"prefect.flow-run.heartbeat"}, timedelta(seconds=45))
    assert {"prefect.flow-run.Completed", "prefect.flow-run.Failed", "prefect.flow-run.Crashed"} <= trigger.expect
    assert trigger.for_each == {"prefect.resource.id"}
    assert [(action.type, action.state) for action in automation.actions] == [("change-flow-run-state",
                                                                                StateType.CRASHED)]
