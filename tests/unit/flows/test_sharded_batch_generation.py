"""Waiting for a shard's flow run: a lost API answer does not start the shard again."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest

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
