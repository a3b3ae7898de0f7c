"""Finished work survives: SIGKILL in the middle of generation, and an engine worker dying mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

from tests.conftest import ROOT, product_job

pytestmark = pytest.mark.engine


def start_run(tmp_path: Path, job: dict) -> tuple[subprocess.Popen, Path]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    log = open(tmp_path / f"run-{time.time_ns()}.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "batchgen.cli", "run", str(path)], cwd=ROOT, env=env,
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return process, Path(log.name)


def committed(out: Path) -> list[Path]:
    return sorted((out / ".batchgen" / "results").glob("chunk-*.parquet"))


def wait_for_commits(process: subprocess.Popen, out: Path, count: int, log: Path, timeout: float = 420) -> None:
    deadline = time.monotonic() + timeout
    while len(committed(out)) < count:
        assert process.poll() is None, f"the run ended before {count} commits:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {count} commits after {timeout} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)


def check_exactly_once(out: Path, ids: list[str]) -> None:
    results = pd.read_parquet(out / "current" / "results.parquet")
    rejected = pd.read_parquet(out / "current" / "rejected.parquet")
    published = list(results["item_id"]) + list(rejected["item_id"])
    assert sorted(published) == sorted(ids)


def crash_job(tmp_path: Path) -> dict:
    # Small chunks so that commits land early; no retries so the work is one pass.
    return product_job(tmp_path, 40, sampling={"max_tokens": 32}, retry={"max_passes": 0}, chunk_size=8)


def test_rerun_after_sigkill_reuses_committed_results(tmp_path):
    job = crash_job(tmp_path)
    out = tmp_path / "out"
    process, log = start_run(tmp_path, job)
    wait_for_commits(process, out, 2, log)
    os.killpg(process.pid, signal.SIGKILL)  # the run, its engine and its temporary Prefect server
    process.wait(timeout=60)
    rows_before = sum(len(pd.read_parquet(p)) for p in committed(out))
    assert rows_before >= 16 and not (out / "current").exists()

    rerun, log = start_run(tmp_path, job)
    assert rerun.wait(timeout=900) == 0, log.read_text()[-3000:]
    manifest = json.loads((out / "current" / "manifest.json").read_text())
    ids = list(pd.read_csv(tmp_path / "products.csv", dtype=str)["product_id"])
    check_exactly_once(out, ids)
    assert manifest["counts"]["items"] == 40
    assert manifest["counts"]["reused"] >= rows_before  # every committed result, none generated twice
    attempts = pd.read_parquet(out / "current" / "attempts.parquet")
    assert not attempts.duplicated(["item_id", "candidate", "attempt"]).any()
    assert manifest["counts"]["reused"] + manifest["tokens"]["generated_this_run"] > 0


def engine_core_processes(root: psutil.Process) -> list[psutil.Process]:
    found = []
    for child in root.children(recursive=True):
        try:
            name = " ".join(child.cmdline()) + " " + child.name()
        except psutil.Error:
            continue
        if "VLLM::" in name:  # vLLM titles its processes VLLM::EngineCore and VLLM::Worker
            found.append(child)
    return sorted(found, key=lambda p: "Worker" not in p.name())  # the model worker first


def test_engine_worker_death_is_retried_with_a_fresh_engine(tmp_path):
    job = crash_job(tmp_path)
    out = tmp_path / "out"
    process, log = start_run(tmp_path, job)
    wait_for_commits(process, out, 1, log)
    victims = engine_core_processes(psutil.Process(process.pid))
    assert victims, "no engine process found under the run"
    victims[0].kill()

    assert process.wait(timeout=900) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "EngineDeadError" in text and "Retry 1/1 will start" in text  # Prefect's task retry did the rest
    manifest = json.loads((out / "current" / "manifest.json").read_text())
    ids = list(pd.read_csv(tmp_path / "products.csv", dtype=str)["product_id"])
    check_exactly_once(out, ids)
    assert manifest["counts"]["reused"] >= 8  # the chunk committed before the crash was not redone
