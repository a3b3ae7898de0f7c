"""Shard assignment and the merge of shard publications (pure logic, real Parquet)."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from batchgen.assemble import LostItemsError
from batchgen.items import LoadedItems, Rejection
from batchgen.job import JobError, job_from_dict
from batchgen.publish import RESULTS, current_publication, verify_publication
from batchgen.shards import expected_ids, select_shard, shard_dir, shard_of
from tests.frames import publish_shard
from tests.publications import merge


def loaded(n: int, rejected: int = 0) -> LoadedItems:
    items = pd.DataFrame({"item_id": pd.Series([f"id{i}" for i in range(n)], dtype="string"),
                          "row_number": range(2, n + 2), "name": [f"thing {i}" for i in range(n)]})
    rejections = [Rejection(f"row-{100 + i}", 100 + i, "load", ["missing_id"], "no id") for i in range(rejected)]
    return LoadedItems(items=items, rejected=rejections, columns=["name"])


def test_shard_of_is_stable_across_processes():
    here = [shard_of(f"id{i}", 4) for i in range(50)]
    code = "from batchgen.shards import shard_of; print([shard_of(f'id{i}', 4) for i in range(50)])"
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", "PATH": ""}).stdout
    assert str(here) == there.strip()
    assert set(here) == {0, 1, 2, 3}  # 50 ids reach every shard


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_shards_partition_items_and_rejections(count):
    whole = loaded(40, rejected=5)
    parts = [select_shard(whole, i, count) for i in range(count)]
    ids = [i for p in parts for i in expected_ids(p)]
    assert sorted(ids) == sorted(expected_ids(whole))  # every item in exactly one shard


def test_shard_fields_come_in_pairs_and_in_range():
    base = {"input": {"path": "x.csv"}, "prompt": {"template": "{{ a }}"}, "output": {"dir": "out"}}
    job_from_dict({**base, "input": {"path": "x.csv", "shard_count": 2, "shard_index": 1}})
    with pytest.raises(JobError, match="together"):
        job_from_dict({**base, "input": {"path": "x.csv", "shard_count": 2}})
    with pytest.raises(JobError, match="not below"):
        job_from_dict({**base, "input": {"path": "x.csv", "shard_count": 2, "shard_index": 2}})


def test_merge_publishes_every_item_once_or_refuses(tmp_path):
    out = tmp_path / "out"
    publish_shard(out, 0, 2, ["a", "b"], ["c"])
    publish_shard(out, 1, 2, ["d"], [])
    dirs = [shard_dir(out, i, 2) for i in range(2)]
    written, staging = merge(out, dirs, ["a", "b", "c", "d"], {"job": "merged"}, jsonl=False)
    staging.commit()
    manifest = verify_publication(current_publication(out))
    assert manifest["counts"]["items"] == 4 and manifest["counts"]["accepted"] == 3
    assert manifest["counts"]["rejected_by_reason"] == {"keyword": 1}
    assert [s["flow_run_id"] for s in manifest["shards"]] == ["run-0", "run-1"]
    results = pd.read_parquet(current_publication(out) / RESULTS)
    assert sorted(results["item_id"]) == ["a", "b", "d"]

    with pytest.raises(LostItemsError, match="1 items missing"):
        merge(out, dirs, ["a", "b", "c", "d", "e"], {}, jsonl=False)
    publish_shard(out, 1, 2, ["d", "a"], [])  # a shard that also published another shard's item
    with pytest.raises(LostItemsError, match="1 published twice"):
        merge(out, dirs, ["a", "b", "c", "d"], {}, jsonl=False)


def test_merge_copies_tables_in_batches_with_the_same_rows(tmp_path, monkeypatch):
    import batchgen.shards as shards

    out = tmp_path / "out"
    first, second = [f"a{i}" for i in range(9)], [f"b{i}" for i in range(5)]
    publish_shard(out, 0, 2, first, ["ra"])
    publish_shard(out, 1, 2, second, ["rb1", "rb2"])
    dirs = [shard_dir(out, i, 2) for i in range(2)]
    pieces: list[int] = []
    real = shards._pieces

    def counted(paths):
        for piece in real(paths):
            pieces.append(piece.num_rows)
            yield piece

    monkeypatch.setattr(shards, "BATCH_ROWS", 4)
    monkeypatch.setattr(shards, "_pieces", counted)
    _, staging = merge(out, dirs, first + second + ["ra", "rb1", "rb2"], {"job": "merged"}, jsonl=True)
    staging.commit()
    manifest = verify_publication(current_publication(out))
    assert max(pieces) == 4  # no piece larger than a batch
    results = pd.read_parquet(current_publication(out) / RESULTS)
    assert list(results["item_id"]) == first + second  # shard order, each shard's order
    expected = pd.concat([pd.read_parquet(d / "current" / RESULTS) for d in dirs], ignore_index=True)
    pd.testing.assert_frame_equal(results, expected)
    assert manifest["counts"]["items"] == 17 and manifest["counts"]["rejected"] == 3
    assert manifest["counts"]["rejected_by_reason"] == {"keyword": 3}
    lines = (current_publication(out) / "jsonl" / "rejected.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["item_id"] for line in lines) == ["ra", "rb1", "rb2"]
