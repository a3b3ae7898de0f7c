"""`batchgen deploy`: register a deployment of any job file on a running Prefect server.

The deployment is the one `deployments/prefect.yaml` declares for the example jobs, for another job file:
the `batch-generation` flow from this project folder (a `set_working_directory` pull step), on a process work
pool, with the flow's parameter form and the job's path as its `job` parameter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENTRYPOINT = "flows/batch_generation.py:batch_generation"
# As in prefect.yaml: heartbeats let a run whose machine died be marked Crashed (the sharded flow reruns it).
JOB_VARIABLES = {"env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}}


class DeployError(RuntimeError):
    """No server to deploy to, or the server refused the deployment."""


def server_api_url() -> str:
    """PREFECT_API_URL, checked to answer: a deployment on Prefect's temporary server would vanish with it."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise DeployError("no Prefect server: start one (`batchgen ui`) and set PREFECT_API_URL, "
                          "e.g. PREFECT_API_URL=http://127.0.0.1:4200/api")
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=10) as reply:
            if reply.status == 200:
                return url
    except OSError as exc:
        raise DeployError(f"the Prefect server at {url} does not answer ({exc}); start it with `batchgen ui`") from None
    raise DeployError(f"the Prefect server at {url} does not answer its health check")


def ensure_pool(pool: str, api_url: str) -> bool:
    """Create the process work pool when it does not exist (as `prefect work-pool create` does); True if created."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(pool)
            return False
        except ObjectNotFound:
            pass
    prefect = str(Path(sys.executable).with_name("prefect"))
    created = subprocess.run([prefect, "--no-prompt", "work-pool", "create", pool, "--type", "process"],
                             capture_output=True, text=True, timeout=120, check=False,
                             env={**os.environ, "PREFECT_API_URL": api_url})
    if created.returncode != 0:
        raise DeployError(f"could not create the work pool {pool!r}: {(created.stderr or created.stdout).strip()}")
    return True


def schedules_for(cron: str | None, interval: int | None, timezone: str) -> list[Any]:
    from datetime import timedelta

    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.schedules import CronSchedule, IntervalSchedule

    if cron is not None:
        try:
            schedule = CronSchedule(cron=cron, timezone=timezone)
        except ValueError as exc:
            raise DeployError(f"--cron {cron!r}: {exc.errors()[0]['msg'] if hasattr(exc, 'errors') else exc}") from None
        return [DeploymentScheduleCreate(schedule=schedule, active=True)]
    if interval is not None:
        return [DeploymentScheduleCreate(schedule=IntervalSchedule(interval=timedelta(seconds=interval)), active=True)]
    return []


def deployment_parameters(job: Path, limit: int | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """The batch-generation flow's parameters a deployment of the job file runs with (`deploy` and `serve`)."""
    parameters: dict[str, Any] = {"job": str(Path(job).resolve())}
    if limit is not None:
        parameters["limit"] = limit
    if overrides:
        parameters["overrides"] = list(overrides)
    return parameters


def deploy_job(job: Path, name: str, pool: str = "batchgen", cron: str | None = None, interval: int | None = None,
               timezone: str = "UTC", limit: int | None = None, overrides: list[str] | None = None,
               description: str | None = None) -> dict[str, Any]:
    """Create or update the deployment `batch-generation/NAME` of the job file; returns what was registered."""
    api_url = server_api_url()
    schedules = schedules_for(cron, interval, timezone)
    from prefect.client.orchestration import get_client

    from flows.batch_generation import batch_generation

    parameters = deployment_parameters(job, limit, overrides)
    created_pool = ensure_pool(pool, api_url)
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name(batch_generation.name)
        deployment_id = client.create_deployment(
            flow_id=flow_id, name=name, work_pool_name=pool, entrypoint=ENTRYPOINT,
            pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}],
            parameter_openapi_schema=batch_generation.parameters.model_dump_for_openapi(),
            parameters=parameters, schedules=schedules, job_variables=JOB_VARIABLES, enforce_parameter_schema=True,
            tags=["batchgen"], description=f"{description or name}: registered by `batchgen deploy {job.name}`",
        )
    return {"deployment": f"{batch_generation.name}/{name}", "id": str(deployment_id), "pool": pool,
            "pool_created": created_pool, "parameters": parameters,
            "schedule": cron if cron is not None else (f"every {interval} s" if interval else None),
            "api_url": api_url, "next": f"prefect worker start --pool {pool} --limit 1"}
