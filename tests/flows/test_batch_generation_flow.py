"""The flow's orchestration under a real Prefect server, with a stand-in engine (fast; logic only).

The proof that generation works is the end-to-end tier on the real engine (tests/e2e).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pyarrow.parquet as pq
import pytest

from batchgen.job import job_from_dict
from tests.conftest import product_job
from tests.engines import stand_in_engine


class StandInLLM:
    """Answers like an engine: budgets under 24 tokens are cut off, larger ones end with a stop."""

    def __init__(self):
        self.calls: list[int] = []

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append(len(prompts))
        outputs = []
        for i, (prompt, sp) in enumerate(zip(prompts, params)):
            completions = []
            for index in range(sp.n):
                if sp.max_tokens >= 24:
                    ids, text, reason = [7] * 9, f"A fine product, candidate {index}.", "stop"
                else:
                    ids, text, reason = [7] * sp.max_tokens, "cut " * sp.max_tokens, "length"
                completions.append(SimpleNamespace(index=index, text=text, token_ids=ids, cumulative_logprob=-1.5,
                                                   finish_reason=reason, stop_reason=None))
            outputs.append(SimpleNamespace(request_id=str(i), outputs=completions,
                                           prompt_token_ids=prompt["prompt_token_ids"]))
        return outputs


@pytest.fixture
def stand_in(monkeypatch):
    llm = StandInLLM()
    engine = stand_in_engine(llm)
    monkeypatch.setattr("tasks.generate.get_engine", lambda spec: engine)
    return llm


def commits(out) -> int:
    """Files in the run's result store: one per commit of finished outputs."""
    return len(list((out / ".batchgen" / "results").glob("chunk-*.parquet")))


def test_flow_retries_cut_off_items_and_publishes_each_item_once(tmp_path, prefect_server, stand_in):
    from prefect import get_client
    from flows.batch_generation import batch_generation

    job = job_from_dict(product_job(tmp_path, 20, expectations={"keyword_column": None},
                                    retry={"max_passes": 2}))
    manifest = batch_generation(job)

    counts = manifest["counts"]
    assert counts["items"] == 20
    assert counts["truncated_first_pass"] == 20  # 12 tokens: everything is cut off
    assert counts["truncated_final"] == 0  # 24 tokens on the retry pass: everything stops
    assert counts["accepted"] == 20 and counts["rejected"] == 0
    # every first-pass request goes into the engine at once (one step); the cut-off outputs of each commit (chunk_size
    # 16: 16, then 4) follow into the same stream as soon as they are committed
    assert stand_in.calls == [20, 16, 4]
    out = tmp_path / "out"
    sizes = [pq.read_metadata(path).num_rows for path in (out / ".batchgen" / "results").glob("chunk-*.parquet")]
    assert sum(sizes) == 40 and max(sizes) <= 16  # both attempts' outputs, committed at most 16 at a time

    results = pd.read_parquet(out / "current" / "accepted" / "accepted.parquet")
    assert sorted(results["item_id"]) == sorted(f"p{i:05d}" for i in range(1, 21))
    assert set(results["attempt"]) == {2} and set(results["max_tokens"]) == {24}
    assert json.loads((out / "current" / "manifest.json").read_text())["counts"] == counts
    assert manifest["flow_name"] == "batch-generation"

    # The run is a Prefect flow run with its summary artifact.
    async def flow_run_and_artifacts():
        async with get_client() as client:
            run = await client.read_flow_run(manifest["flow_run_id"])
            artifacts = await client.read_artifacts()
            return run, artifacts
    import asyncio

    run, artifacts = asyncio.run(flow_run_and_artifacts())
    assert run.state.is_completed()
    summaries = [a for a in artifacts if a.key == "test-products-summary" and a.flow_run_id == run.id]
    assert summaries and "| accepted | 20 (100.0%) |" in summaries[0].data
    # each generate task's progress, made once its requests were in the engine, ends done; one generate task, the
    # retries in its stream (by task run: a server too slow to answer in time may have made its artifact twice,
    # tests/flows/test_flow_task_runs.py)
    progress = [a for a in artifacts if a.type == "progress" and a.flow_run_id == run.id]
    assert len({a.task_run_id for a in progress}) == 1 and max(float(a.data) for a in progress) == 100.0
    # ... with the run report's figures; the report and Data Docs are part of the publication.
    assert "| attempt | length | stop |\n| --- | --- | --- |\n| 1 | 20 | 0 |\n| 2 | 0 | 20 |" in summaries[0].data
    assert "| retry 1 | truncated | 20 | 0 | 100.0% |" in summaries[0].data
    assert (out / "current" / "report.html").is_file() and (out / "current" / "data_docs" / "index.html").is_file()


def test_rerun_of_an_unchanged_job_regenerates_nothing(tmp_path, prefect_server, stand_in):
    from flows.batch_generation import batch_generation

    from batchgen import store

    job = job_from_dict(product_job(tmp_path, 10, expectations={"keyword_column": None}))
    first = batch_generation(job)
    # the run let go of its store's cached keys (a served deployment's process would keep every run's otherwise)
    assert not [path for path in (*store._KEYS, *store._OWNED) if path.startswith(str(tmp_path))]
    calls = len(stand_in.calls)
    second = batch_generation(job)
    assert len(stand_in.calls) == calls  # the engine was not asked again
    assert second["counts"]["reused"] == first["counts"]["attempts"]
    assert second["tokens"]["generated_this_run"] == 0
    assert second["counts"]["accepted"] == first["counts"]["accepted"]


def test_rejections_from_every_stage_are_published_with_reasons(tmp_path, prefect_server, stand_in):
    from flows.batch_generation import batch_generation

    data = tmp_path / "items.jsonl"
    data.write_text(
        '{"id": "a", "q": "What is vLLM?"}\n'
        '{"id": "b", "q": ""}\n'
        'not json\n'
        '{"id": "a", "q": "duplicate id"}\n'
        '{"id": "c", "q": "Tell me about Prefect."}\n',
        encoding="utf-8",
    )
    job = job_from_dict({
        "input": {"path": str(data), "id_column": "id"},
        "prompt": {"template": "{{ q }}"},
        "sampling": {"max_tokens": 30},
        "expectations": {"must_not_match": ["fine"]},
        "retry": {"max_passes": 0},
        "output": {"dir": str(tmp_path / "out")},
    })
    manifest = batch_generation(job)
    rejected = pd.read_parquet(tmp_path / "out" / "current" / "rejected" / "rejected.parquet")
    reasons = {row.item_id: list(row.reasons) for row in rejected.itertuples()}
    assert reasons["b"] == ["missing_field"]
    assert reasons["line-3"] == ["invalid_json"]
    assert reasons["a@row-4"] == ["duplicate_id"]
    assert reasons["a"] == ["must_not_match"] and reasons["c"] == ["must_not_match"]
    assert manifest["counts"]["items"] == 5 and manifest["counts"]["accepted"] == 0


class FailingTwice(StandInLLM):
    """Dies on every engine step after the first, twice: the generate task and its own retry fail, so the flow
    fails."""

    def __init__(self):
        super().__init__()
        self.failures = 0

    def generate(self, prompts, params, use_tqdm=False):
        if self.calls and self.failures < 2:
            self.failures += 1
            self.calls.append(-len(prompts))
            raise RuntimeError("engine died (stand-in)")
        return super().generate(prompts, params, use_tqdm)


def test_flow_retry_resumes_from_committed_chunks_and_publishes_once(tmp_path, prefect_server, monkeypatch):
    import asyncio

    from prefect import get_client
    from flows.batch_generation import batch_generation

    llm = FailingTwice()
    engine = stand_in_engine(llm, per_step=16)  # an engine that finishes 16 requests a step
    monkeypatch.setattr("tasks.generate.get_engine", lambda spec: engine)
    job = job_from_dict(product_job(tmp_path, 20, sampling={"max_tokens": 30}, expectations={"keyword_column": None},
                                    retry={"max_passes": 0}))
    assert batch_generation.retries == 1  # the flow's own default
    manifest = batch_generation.with_options(retry_delay_seconds=0)(job)

    # attempt 1: the first step's 16 outputs are committed, the second step fails; the task's retry fails again;
    # the flow retry reuses the 16 committed results and generates only the last 4.
    assert llm.calls == [16, -4, -4, 4]
    assert manifest["counts"]["reused"] == 16 and manifest["counts"]["accepted"] == 20
    out = tmp_path / "out"
    assert [p.name for p in (out / "publications").iterdir()] == [manifest["publication"]]  # published once
    assert json.loads((out / ".batchgen" / "publications.json").read_text()) == [manifest["publication"]]
    assert sorted(pd.read_parquet(out / "current" / "accepted" / "accepted.parquet")["item_id"]) == [
        f"p{i:05d}" for i in range(1, 21)]

    async def read_run():
        async with get_client() as client:
            return await client.read_flow_run(manifest["flow_run_id"])

    run = asyncio.run(read_run())
    assert run.state.is_completed() and run.run_count == 2  # one flow run, retried once by Prefect


def test_windows_publish_what_one_window_publishes(tmp_path, prefect_server, stand_in):
    """20 items in windows of 6 (6, 6, 6, 2): the same items, counts and verdicts as one window of 20."""
    from flows.batch_generation import batch_generation

    def run(window_size: int, out: str) -> tuple[dict, pd.DataFrame, pd.DataFrame, list]:
        job = job_from_dict(product_job(tmp_path, 20, expectations={"keyword_column": None},
                                        retry={"max_passes": 1}, window_size=window_size,
                                        output={"dir": str(tmp_path / out)}))
        manifest = batch_generation(job)
        current = tmp_path / out / "current"
        return (manifest, pd.read_parquet(current / "accepted" / "accepted.parquet"),
                pd.read_parquet(current / "attempts" / "attempts.parquet"),
                json.loads((current / "validation.json").read_text()))

    whole, whole_results, whole_attempts, whole_validation = run(2048, "whole")
    calls_whole = list(stand_in.calls)
    stand_in.calls.clear()
    windowed, results, attempts, validation = run(6, "windowed")

    # one window: the first pass, then its cut-off outputs grown in the same stream once committed (16, then 4);
    # windows of 6: a window's first pass goes in once the last one's has its outputs (its retries still running
    # beside it), so the engine never holds more than two windows' requests
    assert calls_whole == [20, 16, 4]
    assert sum(stand_in.calls) == 40 and max(stand_in.calls) <= 12
    assert windowed["counts"] == {**whole["counts"], "reused": windowed["counts"]["reused"]}
    assert windowed["tokens"]["output"] == whole["tokens"]["output"]
    assert sorted(results["item_id"]) == sorted(whole_results["item_id"]) == [f"p{i:05d}" for i in range(1, 21)]
    assert results["item_id"].is_unique and len(attempts) == len(whole_attempts) == 40
    assert list(results.sort_values("item_id")["text"]) == list(whole_results.sort_values("item_id")["text"])
    # validation.json: one merged GX result per pass, as if the pass had been validated in one go
    assert len(validation) == len(whole_validation) == 2
    for merged, single in zip(validation, whole_validation):
        assert [r["result"]["element_count"] for r in merged["results"]] == \
            [r["result"]["element_count"] for r in single["results"]]
        assert [r["result"]["unexpected_count"] for r in merged["results"]] == \
            [r["result"]["unexpected_count"] for r in single["results"]]
        assert merged["success"] == single["success"]
    # the staging pieces are gone from the publication, and the manifest lists every file it holds
    current = tmp_path / "windowed" / "current"
    assert not (current / ".parts").exists()
    assert {"accepted/accepted.parquet", "rejected/rejected.parquet", "attempts/attempts.parquet",
            "jsonl/accepted.jsonl", "README.md"} <= set(windowed["files"])


class SlowSteps(StandInLLM):
    """An engine that needs 100 ms a step and finishes 2 requests a step; remembers the requests it held at each
    step (running and waiting)."""

    def __init__(self):
        super().__init__()
        self.steps: list[list[str]] = []


def test_overlapping_windows_feed_one_engine_and_publish_each_item_once(tmp_path, prefect_server, monkeypatch):
    import time

    from flows.batch_generation import batch_generation

    llm = SlowSteps()
    engine = stand_in_engine(llm, per_step=2)
    core_step = engine.llm.llm_engine.step

    def step():  # each request held: (its submission, first pass or retry by its budget)
        llm.steps.append([(request_id.split("-")[0], "first" if params.max_tokens == 12 else "retry")
                          for request_id, _, params in engine.llm.llm_engine.pending])
        time.sleep(0.1)
        return core_step()

    engine.llm.llm_engine.step = step
    monkeypatch.setattr("tasks.generate.get_engine", lambda spec: engine)
    # Cut-off outputs committed with the first pass's last ones (not within 0.25 s each), so that a window's
    # retries are still running when its first pass is done and the next window's first pass comes in.
    monkeypatch.setattr("batchgen.generation.FOLLOW_UP_COMMIT_SECONDS", 3600.0)

    def run(in_flight: int, out: str) -> tuple[dict, pd.DataFrame]:
        job = job_from_dict(product_job(tmp_path, 30, expectations={"keyword_column": None}, retry={"max_passes": 1},
                                        window_size=8, windows_in_flight=in_flight,
                                        output={"dir": str(tmp_path / out)}))
        manifest = batch_generation(job)
        return manifest, pd.read_parquet(tmp_path / out / "current" / "attempts" / "attempts.parquet")

    def first_passes_at_once(steps: list) -> list:
        return [step for step in steps if len({tag for tag, kind in step if kind == "first"}) > 1]

    overlapped, attempts = run(3, "overlapped")
    assert first_passes_at_once(llm.steps), "the engine never held two windows' first passes: no overlap"
    llm.steps.clear()
    sequential, sequential_attempts = run(1, "sequential")
    assert not first_passes_at_once(llm.steps)  # one window's first pass at a time ...
    # ... the next one's beside the last one's retries, which do not hold it back
    assert [step for step in llm.steps if {kind for _, kind in step} == {"first", "retry"}]

    assert overlapped["counts"] == {**sequential["counts"], "reused": overlapped["counts"]["reused"]}
    assert overlapped["counts"]["items"] == 30 and overlapped["counts"]["retry_attempts"] == 30
    results = pd.read_parquet(tmp_path / "overlapped" / "current" / "accepted" / "accepted.parquet")
    assert sorted(results["item_id"]) == [f"p{i:05d}" for i in range(1, 31)]  # every item once
    assert not attempts.duplicated(["item_id", "candidate", "attempt"]).any() and len(attempts) == 60
    assert len(sequential_attempts) == 60


def test_a_job_mistake_stops_the_flow_in_its_first_task_before_any_engine(tmp_path, prefect_server, stand_in):
    """A deployment or UI run does not go through `batchgen run`'s checks: the flow's check-job task stops it."""
    from batchgen.job import JobError
    from flows.batch_generation import batch_generation

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the output folder should be", encoding="utf-8")
    job = job_from_dict(product_job(tmp_path, 4, output={"dir": str(blocker)}))
    with pytest.raises(JobError, match="output.dir: .* is a file, not a folder"):
        batch_generation.with_options(retries=0)(job)
    assert stand_in.calls == []  # nothing was generated


class AlwaysFailing(StandInLLM):
    def generate(self, prompts, params, use_tqdm=False):
        raise RuntimeError("engine died (stand-in)")


def test_a_failed_run_leaves_no_staged_copy_of_the_data(tmp_path, prefect_server, monkeypatch):
    from flows.batch_generation import batch_generation

    engine = stand_in_engine(AlwaysFailing())
    monkeypatch.setattr("tasks.generate.get_engine", lambda spec: engine)
    job = job_from_dict(product_job(tmp_path, 6, expectations={"keyword_column": None}, retry={"max_passes": 0}))
    with pytest.raises(Exception, match="engine died"):
        batch_generation.with_options(retries=0)(job)
    out = tmp_path / "out"
    assert not (out / "current").exists()
    assert not (out / "publications").exists() or not any((out / "publications").iterdir())
