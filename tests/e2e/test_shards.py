"""Sharded runs on a real Prefect server with two process workers, each holding its own CPU engine.

The sharded flow runs the way a user starts it (`batchgen run-sharded`), splits the example job into
2 shards, each a deployment run that a worker picks up, both at once. In the middle of the larger
shard its worker is killed (with its flow run and engine, like a machine dying): Prefect's heartbeat
automation marks that run Crashed, the sharded flow runs the shard again, the other worker resumes
it from the shard's committed chunks, and the merged publication holds every item exactly once.
One test, so that the suite starts three engines here rather than five.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import psutil
import pytest

from tests.servers import ARTIFACTS, ROOT, PrefectServer, worker

# alone: two workers' engines must run at once, which another engine test beside it on 2 cores can prevent
pytestmark = [pytest.mark.engine, pytest.mark.alone]

POOL = "batchgen"
BATCHGEN = str(Path(sys.executable).with_name("batchgen"))
JOB = "examples/product_descriptions.yaml"
ITEMS = 8
IDS = [f"p{i:05d}" for i in range(1, ITEMS + 1)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A server, the project's deployments, and two workers on the process pool."""
    if not (ROOT / "examples" / "data" / "products.csv").exists():
        subprocess.run([sys.executable, "examples/make_products.py"], cwd=ROOT, check=True)
    server = PrefectServer(tmp_path_factory.mktemp("prefect-home"), "shards-server.log").start()
    with ExitStack() as stack:
        stack.callback(server.stop)
        assert server.prefect("work-pool", "create", POOL, "--type", "process").returncode == 0
        deployed = server.prefect("deploy", "--all", "--prefect-file", "deployments/prefect.yaml",
                                  BATCHGEN_ROOT=str(ROOT))
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        workers = {name: stack.enter_context(worker(server, POOL, name)) for name in ("shard-worker-1", "shard-worker-2")}
        yield server, workers


def run_sharded(server: PrefectServer, out: Path, *extra: str) -> subprocess.Popen:
    log_path = ARTIFACTS / f"run-sharded-{out.parent.name}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [BATCHGEN, "run-sharded", JOB, "--shards", "2", "--limit", str(ITEMS), "--output-dir", str(out),
             "--set", "retry.max_passes=1", *extra],
            cwd=ROOT, env=server.env(BATCHGEN_CRASH_AFTER_SECONDS="60"), stdout=log, stderr=subprocess.STDOUT)
    proc.log_path = log_path
    return proc


def finish(proc: subprocess.Popen, timeout: float = 900) -> None:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 0, proc.log_path.read_text(errors="replace")[-4000:]


def merged(out: Path) -> dict:
    """The merged publication's manifest, after checking exactly-once and the file hashes."""
    from batchgen.publish import current_publication, verify_publication

    manifest = verify_publication(current_publication(out))
    pub = current_publication(out)
    ids = list(pd.read_parquet(pub / "accepted" / "accepted.parquet")["item_id"]) + list(
        pd.read_parquet(pub / "rejected" / "rejected.parquet")["item_id"])
    assert sorted(ids) == IDS  # every item once
    assert manifest["counts"]["items"] == ITEMS
    assert len(manifest["shards"]) == 2
    assert sum(s["counts"]["items"] for s in manifest["shards"]) == ITEMS
    return manifest


def _largest_shard() -> tuple[int, int]:
    """(index, size) of the shard holding the most of the test's items."""
    from batchgen.shards import shard_of

    sizes = Counter(shard_of(item_id, 2) for item_id in IDS)
    index, size = sizes.most_common(1)[0]
    return index, size


def _running_shard(server: PrefectServer, out: Path, index: int, size: int, timeout: float = 600):
    """(shard folder, flow run id) of shard `index` once it has committed a chunk but has more to generate.

    The shard must be far from done when it is killed: a shard whose last chunk is committed may
    validate and publish before the kill lands (the 8 test items split 1 and 7 between the shards).
    """
    from batchgen.shards import shard_dir

    shard = shard_dir(out, index, 2)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        committed = len(list((shard / ".batchgen" / "results").glob("*.parquet")))
        if committed > size - 3 or (shard / "current").exists():
            raise RuntimeError(f"shard {index} got too far ({committed} of {size} chunks) before it was seen")
        if committed:
            from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

            with server.client() as client:
                for run in client.read_flow_runs(flow_run_filter=FlowRunFilter(
                        tags=FlowRunFilterTags(all_=["batchgen-shard"]))):
                    if run.parameters.get("output_dir") == str(shard) and run.state.is_running():
                        return shard, str(run.id)
        time.sleep(0.5)
    raise TimeoutError(f"shard {index} committed no chunk in time")


def _runner_of(workers: dict, run_id: str) -> str:
    """The worker that runs flow run `run_id`. Both workers may try to submit a scheduled run: the one the server
    turns away logs `submitting flow run` too, then `Aborted submission of flow run`."""
    for name in workers:
        log = (ARTIFACTS / f"{name}.log").read_text(errors="replace")
        if f"submitting flow run '{run_id}'" in log and f"Aborted submission of flow run '{run_id}'" not in log:
            return name
    raise AssertionError(f"no worker runs flow run {run_id}")


def _taken_up_at(client, run_id) -> datetime:
    """When a worker took flow run `run_id` up: its first Pending state (the worker's process is starting)."""
    pending = [state.timestamp for state in client.read_flow_run_states(run_id) if state.type.value == "PENDING"]
    assert pending, f"flow run {run_id} was never taken up by a worker"
    return min(pending)


def test_two_shards_run_at_once_and_a_killed_worker_s_shard_is_rerun_without_loss(cluster, tmp_path):
    server, workers = cluster
    out = tmp_path / "out"
    index, size = _largest_shard()
    assert size >= 4, "the test needs a shard with chunks left to generate when it is killed"
    # One sequence at a time and a commit per output, so that the shard's commits land one by one and it can be
    # killed half-way (fed all at once, its requests would finish together); the rerun resumes the first pass,
    # no retry pass needed.
    proc = run_sharded(server, out, "--set", "sampling.max_tokens=24", "--set", "chunk_size=1",
                       "--set", "engine.max_num_seqs=1", "--set", "retry.max_passes=0")
    shard, run_id = _running_shard(server, out, index, size)
    victim = _runner_of(workers, run_id)
    root = psutil.Process(workers[victim].pid)
    for process in [root, *root.children(recursive=True)]:  # the worker, its flow run, the engine: all at once
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    killed_at = datetime.now(timezone.utc)
    committed_at_kill = len(list((shard / ".batchgen" / "results").glob("*.parquet")))
    finish(proc)
    manifest = merged(out)
    runs = [s["flow_run_id"] for s in manifest["shards"]]
    assert len(set(runs)) == 2
    with server.client() as client:
        killed = client.read_flow_run(run_id)
        other = client.read_flow_run(runs[1 - index])
        taken = {run.id: _taken_up_at(client, run.id) for run in (killed, other)}
    assert killed.state.type.value == "CRASHED", killed.state
    # The two shards ran at the same time, each on its own worker (its own process and engine): both were taken up
    # by a worker before the kill. (Not their Running times: on 2 cores the first engine's threads can hold both
    # cores while the other shard's process is still starting, and it only reaches Running once they are killed.)
    assert max(taken.values()) < min(killed_at, other.end_time), \
        f"the shards ran one after the other: taken up at {sorted(taken.values())}, killed at {killed_at}, " \
        f"the other shard ran {other.start_time}-{other.end_time}"
    survivor = next(name for name in workers if name != victim)
    assert _runner_of(workers, str(other.id)) == survivor
    rerun = json.loads((shard / "current" / "manifest.json").read_text())
    assert rerun["flow_run_id"] != run_id  # a new run of the same shard ...
    assert rerun["counts"]["reused"] >= committed_at_kill >= 1  # ... resumed from what was committed
    assert all(s["flow_run_id"] != run_id for s in manifest["shards"])
    for position, entry in enumerate(manifest["shards"]):
        shard_pub = out / "shards" / f"{position + 1}-of-2" / "current"
        assert json.loads((shard_pub / "manifest.json").read_text())["input"]["shard_index"] == position
    assert (out / "current" / "report.html").is_file()
