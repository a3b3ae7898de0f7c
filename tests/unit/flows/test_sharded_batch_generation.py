"""Waiting for a shard's flow run: a lost API answer does not start the shard again."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest

from batchgen.job import JOB_MISTAKE_TAG
from flows import sharded_batch_generation as sharded


class FlakyClient:
    """read_flow_run fails `failures` times, then answers Running, then Completed."""

    def __init__(self, failures: int):
        self.failures, self.reads = failures, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def read_flow_run(self, flow_run_id):
        self.reads += 1
        if self.reads <= self.failures:
            raise httpx.HTTPStatusError("500 Internal Server Error: database is locked",
                                        request=httpx.Request("GET", "http://api"), response=httpx.Response(500))
        final = self.reads > self.failures + 1
        return SimpleNamespace(id=flow_run_id, state=SimpleNamespace(is_final=lambda: final, name="Completed"))


def test_api_errors_while_a_shard_runs_are_waited_out(monkeypatch, capsys):
    client = FlakyClient(failures=3)
    monkeypatch.setattr("prefect.get_client", lambda sync_client=True: client)
    run = sharded.wait_for_final_state("run-1", "shard 1 of 2", poll_seconds=0, tolerate_seconds=60)
    assert run.id == "run-1" and run.state.is_final()
    assert client.reads == 5  # three lost answers, one Running, one Completed: never a new run
    assert capsys.readouterr().out.count("trying again") == 3


def test_an_api_that_stays_down_fails_the_wait(monkeypatch):
    client = FlakyClient(failures=10**9)
    monkeypatch.setattr("prefect.get_client", lambda sync_client=True: client)
    with pytest.raises(httpx.HTTPStatusError, match="database is locked"):
        sharded.wait_for_final_state("run-1", "shard 1 of 2", poll_seconds=0.01, tolerate_seconds=0.05)


def _ended(tags: list[str], name: str = "Failed") -> SimpleNamespace:
    state = SimpleNamespace(is_final=lambda: True, is_completed=lambda: False, name=name, message="it broke")
    return SimpleNamespace(id="run-1", name="shard-run", state=state, tags=tags)


@pytest.mark.parametrize("tags, runs, error", [
    (["batchgen-shard"], 3, sharded.ShardFailed),  # failed or crashed: a new run, twice
    (["batchgen-shard", JOB_MISTAKE_TAG], 1, sharded.ShardJobMistake),  # a job mistake: once
])
def test_a_shard_that_failed_on_a_job_mistake_is_not_run_again(prefect_server, monkeypatch, tags, runs, error):
    """run-shard (a real task run on a Prefect server, its retries without their delay) starts a failed shard's
    run again, but not one its flow tagged as failed on a mistake in the job (batchgen.job.JOB_MISTAKE_TAG)."""
    started: list[str] = []
    monkeypatch.setattr(sharded, "run_deployment", lambda **kwargs: started.append(kwargs["name"]) or _ended(tags))
    with pytest.raises(error, match="shard 1 of 2: flow run shard-run .* ended Failed: it broke"):
        sharded.run_shard_task.with_options(retry_delay_seconds=0)("batch-generation/shards", {}, "shard 1 of 2")
    assert started == ["batch-generation/shards"] * runs
