"""The records that travel between stages: schemas derived from them, tallies that add up, the manifest model."""

from __future__ import annotations

import dataclasses
import json
import pickle

import pyarrow as pa
import pytest

from batchgen.records import (
    ACCEPTED_BASE_SCHEMA, ATTEMPT_SCHEMA, ATTEMPTS_SCHEMA, REJECTED_SCHEMA, Attempt, Counts, EngineStats, Manifest,
    Rejection, RunTotals, Tally, arrow_schema, columns_of,
)


def attempt(**values) -> Attempt:
    base = dict(item_id="p1", candidate=0, attempt=1, strategy="first", request_key="k", request_id="r",
                prompt="<p>", prompt_token_ids=[1, 2], n_prompt_tokens=2, text="t", token_ids=[3],
                n_output_tokens=1, new_output_tokens=1, cumulative_logprob=-0.5, finish_reason="stop",
                stop_reason=None, max_tokens=8, temperature=None, lora=None, logprobs=None, prompt_logprobs=None,
                chunk_seconds=0.1, chunk_finished_at=None)
    return Attempt(**{**base, **values})


def test_the_store_schema_is_the_attempt_record_field_by_field():
    names = [f.name for f in dataclasses.fields(Attempt)]
    assert ATTEMPT_SCHEMA.names == names
    assert ATTEMPT_SCHEMA.field("candidate").type == pa.int32()  # the Annotated Arrow type, not Python's int
    assert ATTEMPT_SCHEMA.field("chunk_finished_at").type == pa.timestamp("us", tz="UTC")
    assert ATTEMPTS_SCHEMA.names == names + ["passed", "failed"]  # the published attempts add the verdict


def test_attempts_become_a_table_of_that_schema_column_by_column():
    rows = [attempt(item_id="a"), attempt(item_id="b", cumulative_logprob=None, finish_reason="length")]
    table = pa.Table.from_pydict(columns_of(rows, Attempt), schema=ATTEMPT_SCHEMA)
    assert table.column("item_id").to_pylist() == ["a", "b"]
    assert table.column("cumulative_logprob").to_pylist() == [-0.5, None]
    assert [Attempt(**row) for row in table.to_pylist()] == rows  # and back, unchanged


def test_published_tables_take_their_columns_from_the_records():
    # the accepted table's columns are an attempt's (same types), with the row number from the input
    for name in ("candidate", "text", "cumulative_logprob", "max_tokens"):
        assert ACCEPTED_BASE_SCHEMA.field(name).type == ATTEMPT_SCHEMA.field(name).type
    assert ACCEPTED_BASE_SCHEMA.field("row_number").type == pa.int64()
    assert REJECTED_SCHEMA.names == [f.name for f in dataclasses.fields(Rejection) if f.name != "input"]


def test_a_record_without_an_arrow_type_is_refused():
    @dataclasses.dataclass
    class Untyped:
        name: str

    with pytest.raises(TypeError, match="Untyped.name: no Arrow type"):
        arrow_schema(Untyped)


def test_tallies_of_disjoint_windows_add_up_to_the_run():
    first = Tally(items=3, accepted=2, rejected=1, rejected_by_reason={"keyword": 1}, prompt_tokens=30)
    second = Tally(items=2, accepted=1, rejected=1, rejected_by_reason={"keyword": 1, "length": 1},
                   rescued=1, rescued_by_reason={"truncated": 1}, prompt_tokens=20)
    run = sum([first, second], Tally())
    assert isinstance(run, Tally)
    assert (run.items, run.accepted, run.rejected, run.prompt_tokens) == (5, 3, 2, 50)
    assert run.rejected_by_reason == {"keyword": 2, "length": 1}
    assert run.rescued_by_reason == {"truncated": 1}
    assert run.rates().pass_rate == 0.6
    assert "prompt_tokens" not in run.counts().to_json()  # the manifest keeps tokens apart
    assert Counts().rates().pass_rate is None  # no items: no rate, not a division by zero


def test_engine_stats_of_overlapping_tasks_sum_their_work_and_span_their_times():
    a = EngineStats(reused=1, fresh_output_tokens=10, engine_seconds=2.0, first_added_at=5.0, last_output_at=7.0)
    b = EngineStats(fresh_output_tokens=5, engine_seconds=1.5, first_added_at=6.0, last_output_at=9.0,
                    first_commit_at=6.5)
    both = a + b
    assert (both.reused, both.fresh_output_tokens, both.engine_seconds) == (1, 15, 3.5)
    assert (both.first_added_at, both.last_output_at, both.first_commit_at) == (5.0, 9.0, 6.5)
    timings = RunTotals(engine=both).timings(started=4.0, before_publish=10.0)
    assert timings["generate"] == 4.0 and timings["engine_calls"] == 3.5  # overlap: engine time, not the sum
    assert timings["first_request"] == 1.0 and timings["first_output"] == 2.5
    assert timings["last_output"] == 5.0  # then 1.0 s of the last windows' validation and staging
    assert timings["total_before_publish"] == 6.0
    assert "last_output" not in RunTotals().timings(started=4.0, before_publish=4.5)  # nothing generated


def test_run_totals_fold_each_pass_s_validation_results_into_one():
    def result(pass_: int, failing: list[str]) -> dict:
        return {"success": not failing, "statistics": {}, "meta": {"pass": pass_}, "results": [{
            "success": not failing, "expectation_config": {"type": "expect_x", "kwargs": {}, "meta": {}},
            "result": {"element_count": 2, "unexpected_count": len(failing), "unexpected_list": failing}}]}

    window_one = RunTotals(validation=[[result(1, ["a"])], [result(2, [])]])
    window_two = RunTotals(validation=[[result(1, ["c", "d"])]])
    both = RunTotals() + window_one + window_two
    assert [len(results) for results in both.validation] == [1, 1]  # one result per pass, not one per window
    [[first], [second]] = both.validation
    assert first["results"][0]["result"] == {"element_count": 4, "unexpected_count": 3,
                                             "unexpected_list": ["a", "c", "d"]}
    assert first["results"][0]["success"] is False
    assert second == result(2, [])  # only window one had a second pass
    assert window_one.validation[0] == [result(1, ["a"])]  # the windows' own results are left as they were


def test_the_manifest_reads_as_attributes_and_as_its_json():
    manifest = Manifest(job="j", counts=Tally(items=4, accepted=3).counts(),
                        files={"accepted/accepted.parquet": {"sha256": "ab", "rows": 3}}, future_field=1)
    written = json.loads(json.dumps(manifest.to_json()))
    assert manifest.counts.accepted == manifest["counts"]["accepted"] == written["counts"]["accepted"] == 3
    assert manifest["files"]["accepted/accepted.parquet"]["rows"] == 3
    assert manifest == written and Manifest.model_validate(written) == manifest  # round trip, extra fields kept
    assert manifest.get("publication", "none yet") == "none yet" and "shards" not in written
    assert pickle.loads(pickle.dumps(manifest)) == manifest  # Prefect may persist a flow's result
    with pytest.raises(KeyError):
        manifest["no_such_field"]
