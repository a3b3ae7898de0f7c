"""The deployments in deployments/prefect.yaml, on a real Prefect server, a real process worker and the real engine.

One server and one worker for the module: `prefect deploy --all` registers the project's deployments, a run is
created through the API the way the UI's Run button does it, an interval schedule fires a second run into the
same output folder, and the server is restarted to show that run history survives it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pytest

from tests.servers import ARTIFACTS, ROOT, PrefectServer, wait_for_flow_run, worker

pytestmark = pytest.mark.engine

POOL = "batchgen"  # the pool named in deployments/prefect.yaml
ITEMS = 4


def published(out: Path) -> Path:
    """The folder of the output's current publication."""
    return out / "current" if (out / "current").exists() else out


def verify(pub: Path) -> dict:
    """The publication's manifest, after checking that every file it lists has the recorded hash."""
    import hashlib

    manifest = json.loads((pub / "manifest.json").read_text())
    for name, meta in manifest["files"].items():
        assert hashlib.sha256((pub / name).read_bytes()).hexdigest() == meta["sha256"], name
    return manifest


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not (ROOT / "examples" / "data" / "products.csv").exists():  # what `make demo` makes; deployments read it
        subprocess.run([sys.executable, "examples/make_products.py"], cwd=ROOT, check=True)
    srv = PrefectServer(tmp_path_factory.mktemp("prefect-home"), "deployments-server.log").start()
    try:
        created = srv.prefect("work-pool", "create", POOL, "--type", "process")
        assert created.returncode == 0, created.stdout + created.stderr
        deployed = srv.prefect("deploy", "--all", "--prefect-file", "deployments/prefect.yaml",
                               BATCHGEN_ROOT=str(ROOT))
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        with worker(srv, POOL, "deployments-worker"):
            yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("deployed") / "out"


@pytest.fixture(scope="module")
def ui_run(server, out_dir):
    """A run of the nightly deployment created through the API, with the form's overrides."""
    with server.client() as client:
        deployment = client.read_deployment_by_name("batch-generation/product-descriptions-nightly")
        run = client.create_flow_run_from_deployment(
            deployment.id, parameters={"limit": ITEMS, "max_tokens": 24, "output_dir": str(out_dir)})
        finished = wait_for_flow_run(client, run.id, log=ARTIFACTS / "deployments-worker.log")
        return deployment, finished


def test_prefect_yaml_registers_the_deployments_with_the_schedule_and_form(server):
    with server.client() as client:
        nightly = client.read_deployment_by_name("batch-generation/product-descriptions-nightly")
        names = {d.name for d in client.read_deployments()}
    assert {"product-descriptions-nightly", "product-descriptions", "product-descriptions-zh"} <= names
    assert nightly.work_pool_name == POOL
    assert [s.schedule.cron for s in nightly.schedules] == ["0 2 * * *"]
    assert nightly.parameters == {"job": "examples/product_descriptions.yaml"}
    form = nightly.parameter_openapi_schema["properties"]
    assert {"job", "limit", "max_tokens", "output_dir", "overrides"} <= set(form)
    assert form["limit"]["description"] == "Only the first N input rows."
    assert nightly.pull_steps == [{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}]


def test_a_run_started_like_the_ui_button_completes_and_publishes(server, ui_run, out_dir):
    deployment, run = ui_run
    assert run.state.type.value == "COMPLETED", run.state
    assert run.deployment_id == deployment.id
    # The deployment's job parameter merged with the form's overrides.
    assert run.parameters == {"job": "examples/product_descriptions.yaml", "limit": ITEMS, "max_tokens": 24,
                              "output_dir": str(out_dir)}
    manifest = verify(published(out_dir))
    assert manifest["flow_run_id"] == str(run.id)
    assert manifest["counts"]["items"] == ITEMS
    accepted = pd.read_parquet(published(out_dir) / "accepted" / "accepted.parquet")
    rejected = pd.read_parquet(published(out_dir) / "rejected" / "rejected.parquet")
    assert sorted(list(accepted["item_id"]) + list(rejected["item_id"])) == [f"p{i:05d}" for i in range(1, ITEMS + 1)]
    with server.client() as client:
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])))
    kinds = {a.type for a in artifacts}
    assert {"markdown", "table", "progress"} <= kinds
    summary = next(a for a in artifacts if a.type == "markdown")
    assert str(manifest["counts"]["accepted"]) in summary.data


def test_an_interval_schedule_fires_a_run_that_republishes_without_mixing(server, ui_run, out_dir):
    """A schedule firing on unchanged input regenerates nothing and publishes a new complete set."""
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId
    from prefect.client.schemas.schedules import IntervalSchedule

    deployment, first = ui_run
    earlier = verify(published(out_dir))
    with server.client() as client:
        temporary = client.create_deployment(
            flow_id=deployment.flow_id, name="every-minute", work_pool_name=POOL,
            entrypoint=deployment.entrypoint, pull_steps=deployment.pull_steps,
            parameter_openapi_schema=deployment.parameter_openapi_schema,
            parameters={**first.parameters},
            schedules=[DeploymentScheduleCreate(schedule=IntervalSchedule(
                interval=timedelta(minutes=1), anchor_date=datetime.now(timezone.utc) + timedelta(seconds=5)))],
        )
        deadline = datetime.now(timezone.utc) + timedelta(minutes=3)
        runs = []
        while not runs and datetime.now(timezone.utc) < deadline:
            time.sleep(2)
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                deployment_id=FlowRunFilterDeploymentId(any_=[temporary])))
        assert runs, "the schedule created no run"
        fired = min(runs, key=lambda r: r.expected_start_time)
        assert fired.auto_scheduled
        finished = wait_for_flow_run(client, fired.id, log=ARTIFACTS / "deployments-worker.log")
        client.delete_deployment(temporary)  # no more runs once the test has what it needs
    assert finished.state.type.value == "COMPLETED", finished.state
    manifest = verify(published(out_dir))
    assert manifest["flow_run_id"] == str(finished.id) != earlier["flow_run_id"]
    assert manifest["tokens"]["generated_this_run"] == 0  # nothing regenerated: every attempt reused
    assert manifest["counts"]["reused"] == manifest["counts"]["attempts"] == earlier["counts"]["attempts"]
    assert manifest["counts"]["accepted"] == earlier["counts"]["accepted"]


def test_the_flow_run_page_shows_completed_and_the_summary(server, ui_run):
    from tests.browser import browser_page, open_page, screenshot

    _, run = ui_run
    with browser_page() as page:
        try:
            open_page(page, f"{server.url}/runs/flow-run/{run.id}", wait_for_text="Completed", timeout_ms=90_000)
            page.get_by_text("Artifacts", exact=True).first.click()
            summary = page.get_by_text("product-descriptions: run summary").first
            summary.wait_for(timeout=60_000)
            summary.scroll_into_view_if_needed()
        finally:
            screenshot(page, "ui-flow-run-artifacts")


def test_run_history_survives_a_server_restart(server, ui_run):
    _, run = ui_run
    server.stop()
    server.start()
    with server.client() as client:
        again = client.read_flow_run(run.id)
    assert again.state.type.value == "COMPLETED"
    assert again.parameters == run.parameters


def test_a_server_on_postgresql_runs_the_deployment_and_keeps_its_history(ui_run, out_dir, tmp_path):
    """The same deployment on a server whose database is PostgreSQL (Debian's, on loopback).

    The run's parameters are the UI run's, so its results are in the output's store already: the run
    needs no engine, and everything it does goes through the PostgreSQL-backed server.
    """
    from tests.servers import Postgres

    _, first = ui_run
    database = Postgres().start()
    server = PrefectServer(tmp_path / "prefect-home", "postgres-server.log",
                           env={"PREFECT_API_DATABASE_CONNECTION_URL": database.url})
    try:
        server.start()
        assert server.prefect("work-pool", "create", POOL, "--type", "process").returncode == 0
        deployed = server.prefect("deploy", "--all", "--prefect-file", "deployments/prefect.yaml",
                                  BATCHGEN_ROOT=str(ROOT))
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        with worker(server, POOL, "postgres-worker"), server.client() as client:
            deployment = client.read_deployment_by_name("batch-generation/product-descriptions")
            run = client.create_flow_run_from_deployment(deployment.id, parameters=first.parameters)
            finished = wait_for_flow_run(client, run.id, log=ARTIFACTS / "postgres-worker.log")
        assert finished.state.type.value == "COMPLETED", finished.state
        assert verify(published(out_dir))["flow_run_id"] == str(run.id)
        # The run history is in PostgreSQL, not in a SQLite file.
        assert database.query(f"select state_type from flow_run where id = '{run.id}'") == "COMPLETED"
        assert not (tmp_path / "prefect-home" / "prefect.db").exists()
    finally:
        server.stop()
        database.stop()
