"""The flow run's heartbeat, which stops the moment the run's work is done.

Prefect sends a `prefect.flow-run.heartbeat` event every PREFECT_FLOWS_HEARTBEAT_FREQUENCY seconds (default 180;
the deployments set 30) from a thread that sleeps in steps of one second, and the end of every flow call waits for
that thread's step: up to a second added to every run, half a second on average (a 50 ms flow took 1.1 s to call,
0.2 s without it). batchgen's flows send the same event themselves instead, from a thread that waits on an event
and ends at once: `QuickHeartbeatFlow` turns Prefect's own heartbeat off for the call and `heartbeats()`, inside the
flow, sends the events at the frequency the user's settings give. Runs started by a worker or runner (which do not
call the flow object) keep Prefect's own heartbeat, and `heartbeats()` then sends none.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect import Flow

# The frequency the caller's settings gave, while QuickHeartbeatFlow has turned Prefect's own heartbeat off.
_SECONDS: contextvars.ContextVar[int | None] = contextvars.ContextVar("batchgen_heartbeat_seconds", default=None)


class QuickHeartbeatFlow(Flow):
    """A Prefect flow whose calls run without Prefect's own heartbeat thread; its body sends the heartbeats with
    `heartbeats()`. Everything else is Prefect's Flow (options, deployments, the UI)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from prefect.context import SettingsContext, get_settings_context

        context = get_settings_context()
        settings = context.settings
        seconds = settings.flows.heartbeat_frequency
        if seconds is None or _SECONDS.get() is not None:  # no heartbeat asked for, or a nested call
            return super().__call__(*args, **kwargs)
        token = _SECONDS.set(int(seconds))
        # The caller's settings with the heartbeat off, copied as they are: Prefect's temporary_settings validates
        # every setting again from the environment (24-77 ms on 2 cores, before the run's first step).
        quiet = settings.model_copy(update={"flows": settings.flows.model_copy(update={"heartbeat_frequency": None})})
        try:
            with SettingsContext(profile=context.profile, settings=quiet):
                return super().__call__(*args, **kwargs)
        finally:
            _SECONDS.reset(token)

    def with_options(self, **kwargs: Any) -> QuickHeartbeatFlow:
        copy = super().with_options(**kwargs)
        copy.__class__ = type(self)
        return copy


def quick_heartbeat(flow: Flow) -> QuickHeartbeatFlow:
    """`flow` (made by Prefect's @flow) as a QuickHeartbeatFlow."""
    flow.__class__ = QuickHeartbeatFlow
    return flow  # type: ignore[return-value]


@contextmanager
def heartbeats() -> Iterator[None]:
    """Inside a QuickHeartbeatFlow's call: the run's heartbeat events, the first at once, then every configured
    number of seconds, until the block ends (at once). Elsewhere (a run whose Prefect heartbeat is on): nothing."""
    seconds = _SECONDS.get()
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    if seconds is None or context is None or context.flow_run is None:
        yield
        return
    resource, related = _template(context)
    stop = threading.Event()

    def beat() -> None:
        from prefect.events.utilities import emit_event

        while True:
            try:
                emit_event(event="prefect.flow-run.heartbeat", resource=resource, related=related)
            except Exception:  # a missed heartbeat must not fail the run (Prefect's own thread does the same)
                pass
            if stop.wait(seconds):
                return

    thread = threading.Thread(target=contextvars.copy_context().run, args=(beat,), name="batchgen-heartbeat",
                              daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()


def _template(context: Any) -> tuple[dict[str, str], list[Any]]:
    """The heartbeat event's resource and related resources, as Prefect's flow engine builds them."""
    from prefect import __version__
    from prefect.events.related import RelatedResource, tags_as_related_resources

    run = context.flow_run
    resource = {"prefect.resource.id": f"prefect.flow-run.{run.id}", "prefect.resource.name": run.name or "",
                "prefect.version": __version__}
    related: list[Any] = []
    if run.flow_id:
        related.append(RelatedResource.model_validate({
            "prefect.resource.id": f"prefect.flow.{run.flow_id}", "prefect.resource.role": "flow",
            "prefect.resource.name": context.flow.name if context.flow else ""}))
    if run.deployment_id:
        related.append(RelatedResource.model_validate({
            "prefect.resource.id": f"prefect.deployment.{run.deployment_id}", "prefect.resource.role": "deployment"}))
    return resource, related + tags_as_related_resources(set(run.tags or []))
