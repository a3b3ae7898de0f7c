"""`batchgen ui --port N` and `batchgen deploy JOB`, on a real Prefect server started by `batchgen ui` itself.

One server for the module, on a free (so non-default) port: its UI must talk to its own API, `batchgen deploy`
registers a deployment of a job file of the test's own, the UI's Custom run form shows that deployment's
parameters as typed fields and, filled in headless Chromium, creates a run, which a real process worker runs on
the real engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import product_job
from tests.servers import ARTIFACTS, ROOT, PrefectServer, _stop, prefect_home, wait_for_flow_run, worker

BATCHGEN = [sys.executable, "-m", "batchgen.cli"]
POOL = "my-pool"
NAME = "my-products"
ITEMS = 2


class UiServer(PrefectServer):
    """The server as a user starts it: `batchgen ui --port N`, with nothing telling the UI where its API is."""

    def start(self, timeout: float = 180) -> UiServer:
        prefect_home(self.home)
        ARTIFACTS.mkdir(exist_ok=True)
        env = self.env(PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="5")
        for name in ("PREFECT_API_URL", "PREFECT_UI_API_URL", "PREFECT_SERVER_UI_API_URL"):
            env.pop(name, None)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([*BATCHGEN, "ui", "--port", str(self.port)], env=env, cwd=ROOT, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"batchgen ui exited with {self.proc.returncode}; see {self.log}")
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(1)
        _stop(self.proc)
        raise TimeoutError(f"batchgen ui did not answer in {timeout} s; see {self.log}")


def batchgen(server: PrefectServer, *args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([*BATCHGEN, *args], cwd=ROOT, env=server.env(**env), capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = UiServer(tmp_path_factory.mktemp("prefect-home"), "deploy-cli-server.log")
    assert srv.port != 4200
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def job_file(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("my-job")
    job = product_job(folder, 5, sampling={"max_tokens": 48}, retry={"max_passes": 1})
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job, allow_unicode=True), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def deployed(server, job_file):
    result = batchgen(server, "deploy", str(job_file), "--cron", "0 3 * * *", "--name", NAME, "--pool", POOL)
    assert result.returncode == 0, result.stdout + result.stderr
    with server.client() as client:
        return json.loads(result.stdout), client.read_deployment_by_name(f"batch-generation/{NAME}")


def test_the_ui_on_a_non_default_port_is_told_its_own_api(server):
    with urllib.request.urlopen(f"{server.url}/ui-settings", timeout=10) as reply:
        settings = json.loads(reply.read())
    assert settings["api_url"] == server.api_url  # not http://127.0.0.1:4200/api


def test_deploy_registers_the_job_file_with_its_schedule_on_the_pool(server, deployed, job_file):
    printed, deployment = deployed
    assert printed["deployment"] == f"batch-generation/{NAME}" and printed["id"] == str(deployment.id)
    assert printed["pool_created"] is True
    assert deployment.parameters == {"job": str(job_file.resolve())}
    assert [s.schedule.cron for s in deployment.schedules] == ["0 3 * * *"]
    assert [s.schedule.timezone for s in deployment.schedules] == ["UTC"]
    assert deployment.work_pool_name == POOL and deployment.entrypoint == "flows/batch_generation.py:batch_generation"
    assert deployment.pull_steps == [{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}]
    with server.client() as client:
        assert client.read_work_pool(POOL).type == "process"


def test_the_form_is_a_job_path_and_typed_common_overrides_with_bounds(deployed):
    _, deployment = deployed
    form = deployment.parameter_openapi_schema
    properties = form["properties"]
    assert list(properties) == ["job", "limit", "max_tokens", "temperature", "output_dir", "overrides"]
    assert form["required"] == ["job"]
    assert properties["job"]["type"] == "string" and "JobSpec" not in json.dumps(form)
    typed = {name: next(t for t in spec["anyOf"] if t["type"] != "null") for name, spec in properties.items()
             if name != "job"}
    assert typed["limit"] == {"type": "integer", "minimum": 1}
    assert typed["max_tokens"] == {"type": "integer", "minimum": 1}
    assert typed["temperature"] == {"type": "number", "minimum": 0}
    assert typed["output_dir"] == {"type": "string"}
    assert typed["overrides"] == {"type": "array", "items": {"type": "string"}}
    assert all(spec["description"] for spec in properties.values())


def test_the_server_refuses_a_run_outside_the_bounds(server, deployed):
    from prefect.exceptions import PrefectHTTPStatusError

    _, deployment = deployed
    with server.client() as client, pytest.raises(PrefectHTTPStatusError) as refused:
        client.create_flow_run_from_deployment(deployment.id, parameters={"limit": 0})
    assert refused.value.response.status_code == 409
    assert "limit" in refused.value.response.text


def _set_field(page, name: str, kind: str, value: str) -> None:
    """Fill one optional field of Prefect's run form: switch it from None to its type, then type the value."""
    field = page.locator(".p-label").filter(has_text=f"{name} (Optional)")
    field.get_by_role("button", name=kind, exact=True).click()
    field.locator("input, textarea").first.fill(value)


@pytest.fixture(scope="module")
def form_run(server, deployed, tmp_path_factory):
    """A run created the way a user does it: the deployments list, then Custom run's form, filled and submitted."""
    from tests.browser import browser_page, open_page, screenshot

    _, deployment = deployed
    out = tmp_path_factory.mktemp("form-run") / "out"
    with browser_page() as page:
        try:
            # The deployments list comes from the API: it shows only when the UI talks to this server.
            open_page(page, f"{server.url}/deployments", wait_for_text=NAME, timeout_ms=90_000)
            assert "Can't connect" not in page.inner_text("body")
            open_page(page, f"{server.url}/deployments/deployment/{deployment.id}/run", wait_for_text="max_tokens",
                      timeout_ms=90_000)
            for text in ("Only the first N input rows.", "Sampling temperature (sampling.temperature)",
                         "The job file (YAML)"):
                page.get_by_text(text).first.wait_for(timeout=30_000)
            form = page.inner_text("body")
            job_value = page.locator(".p-label").filter(has_text="The job file").locator("textarea").input_value()
            _set_field(page, "limit", "int", str(ITEMS))
            _set_field(page, "max_tokens", "int", "24")
            _set_field(page, "temperature", "float", "0")
            _set_field(page, "output_dir", "str", str(out))
            screenshot(page, "ui-deploy-custom-run-form")
            with page.expect_response(lambda r: r.url.endswith("/create_flow_run") and r.request.method == "POST",
                                      timeout=60_000) as created:
                page.get_by_role("button", name="Submit").click()
            assert created.value.status == 201, created.value.text()
            run_id = created.value.json()["id"]
        except BaseException:
            screenshot(page, "ui-deploy-custom-run-form-failed")
            raise
    with server.client() as client:
        return client.read_flow_run(run_id), out, form, job_value


def test_the_browser_form_shows_the_fields_and_creates_a_typed_run(deployed, form_run, job_file):
    run, out, form, job_value = form_run
    _, deployment = deployed
    assert "JobSpec" not in form
    assert job_value == str(job_file.resolve())  # the deployment's job, prefilled
    assert run.deployment_id == deployment.id
    assert run.parameters == {"job": str(job_file.resolve()), "limit": ITEMS, "max_tokens": 24, "temperature": 0,
                              "output_dir": str(out), "overrides": None}


@pytest.mark.engine
def test_the_run_from_the_form_publishes_the_job_on_a_worker(server, form_run):
    run, out, _, _ = form_run
    with worker(server, POOL, "deploy-cli-worker"), server.client() as client:
        finished = wait_for_flow_run(client, run.id, log=ARTIFACTS / "deploy-cli-worker.log")
    assert finished.state.type.value == "COMPLETED", finished.state
    manifest = json.loads((out / "current" / "manifest.json").read_text())
    assert manifest["flow_run_id"] == str(run.id)
    assert manifest["counts"]["items"] == ITEMS
    assert manifest["sampling"]["temperature"] == 0 and manifest["sampling"]["max_tokens"] == 24
    published = (list(pd.read_parquet(out / "current" / "accepted")["item_id"])
                 + list(pd.read_parquet(out / "current" / "rejected")["item_id"]))
    assert sorted(published) == [f"p{i:05d}" for i in range(1, ITEMS + 1)]


def test_deploy_without_a_server_says_how_to_start_one(tmp_path, job_file):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "home")}
    env.pop("PREFECT_API_URL", None)
    result = subprocess.run([*BATCHGEN, "deploy", str(job_file)], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 1
    assert "no Prefect server" in result.stderr and "batchgen ui" in result.stderr
    assert "Traceback" not in result.stderr
