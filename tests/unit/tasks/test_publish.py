"""The publish task's check that a staging holds each expected item exactly once."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen.assemble import LostItemsError
from batchgen.publish import REJECTED, RESULTS


def test_check_published_once_refuses_a_staging_that_lost_or_doubled_an_item(tmp_path):
    from tasks.publish import check_published_once

    def staging(name: str, results: list[str], rejected: list[str]) -> Path:
        folder = tmp_path / name
        (folder / "accepted").mkdir(parents=True)
        (folder / "rejected").mkdir()
        pq.write_table(pa.table({"item_id": pa.array(results, pa.string()), "text": ["x"] * len(results)}),
                       folder / RESULTS)
        pq.write_table(pa.table({"item_id": pa.array(rejected, pa.string())}), folder / REJECTED)
        return folder

    check_published_once(staging("good", ["a", "b"], ["c"]), 3)
    with pytest.raises(LostItemsError, match="2 published rows, 2 distinct items, 3 expected"):
        check_published_once(staging("lost", ["a", "b"], []), 3)
    with pytest.raises(LostItemsError, match="3 published rows, 2 distinct items, 3 expected"):
        check_published_once(staging("twice", ["a", "b"], ["a"]), 3)  # a window accepted it, another rejected it


@pytest.mark.parametrize(("cpu", "apart"), [(True, False), (False, True)])
def test_the_chart_worker_runs_only_where_the_engine_does_not_use_the_cores(monkeypatch, cpu, apart):
    """On CPU builds the engine's threads use every core, and a worker process importing matplotlib beside them
    slowed generation (benchmarks/results/cpu-paired/); on an accelerator the worker draws beside the Data Docs."""
    import batchgen.engine
    from tasks.publish import charts_apart

    monkeypatch.setattr(batchgen.engine, "on_cpu", lambda: cpu)
    assert charts_apart() is apart
