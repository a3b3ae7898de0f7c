"""Assembly of accepted/rejected tables, and the published dataset."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest

from batchgen.assemble import Assembled, LostItemsError, assemble, check_exactly_once
from batchgen.items import load_items
from batchgen.job import InputSpec
from batchgen.publish import REJECTED, RESULTS
from batchgen.records import ATTEMPTS_SCHEMA, Rejection
from batchgen.retry import latest_attempts
from tests.publications import generated, publish_frames

COLUMNS = ["name", "feature"]


def make_items(rows: list[tuple[str, str, str]]) -> pd.DataFrame:
    return pd.DataFrame({
        "item_id": pd.Series([r[0] for r in rows], dtype="string"),
        "row_number": pd.Series(range(2, len(rows) + 2), dtype="int64"),
        "name": [r[1] for r in rows],
        "feature": [r[2] for r in rows],
    })


def with_verdicts(rows: list[Any], failed: list[list[str]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    frame["failed"] = failed
    frame["passed"] = [not f for f in failed]
    return frame


@pytest.fixture
def scenario():
    """Five items: two generated and passing, one failing, one rejected at the prompt stage, one lost;
    plus a load-stage rejection that never became an item."""
    items = make_items([
        ("p1", "耳机", "降噪"),
        ("p2", "Aurora Mug", "hot"),
        ("p3", "Trail Boots", "dry"),
        ("p4", "Blank", ""),
        ("p5", "Lost Lamp", "bright"),
    ])
    early = [
        Rejection("line-9", 9, "load", ["invalid_json"], "line 9: Expecting value"),
        Rejection("p4", 5, "prompt", ["missing_field"], "row 5: feature is empty",
                  {"name": "Blank", "feature": ""}),
    ]
    attempts = pd.concat([
        # p1: candidate 0 fails, candidate 1 passes -> candidate 1 is published
        with_verdicts(generated("p1", ["短", "这款耳机降噪出色，通勤首选。"]), [["length"], []]),
        # p2: cut off on the first pass, fixed by a retry
        with_verdicts(generated("p2", ["The Aurora Mug keeps"], ["length"]), [["truncated"]]),
        with_verdicts(generated("p2", ["The Aurora Mug keeps coffee hot."], attempt=2, candidate=0, max_tokens=32),
                      [[]]),
        # p3: every candidate fails
        with_verdicts(generated("p3", ["Buy now", "Click https://x"]), [["keyword", "length"], ["must_not_match"]]),
    ], ignore_index=True)
    return SimpleNamespace(items=items, early=early, attempts=attempts)


def test_every_item_is_published_exactly_once(scenario):
    result = assemble(scenario.items, COLUMNS, scenario.early, latest_attempts(scenario.attempts))

    accepted = list(result.accepted["item_id"])
    rejected = list(result.rejected["item_id"])
    assert sorted(accepted) == ["p1", "p2"]
    assert sorted(rejected) == ["line-9", "p3", "p4", "p5"]
    assert set(accepted).isdisjoint(rejected)


def test_the_first_passing_candidate_is_accepted(scenario):
    result = assemble(scenario.items, COLUMNS, scenario.early, latest_attempts(scenario.attempts))
    accepted = result.accepted.set_index("item_id")

    assert accepted.at["p1", "candidate"] == 1
    assert accepted.at["p1", "text"] == "这款耳机降噪出色，通勤首选。"
    assert accepted.at["p1", "input"] == {"name": "耳机", "feature": "降噪"}
    assert accepted.at["p1", "row_number"] == 2
    assert accepted.at["p1", "request_id"] == "req-p1-1"
    # the retry's output is the one published for p2
    assert (accepted.at["p2", "attempt"], accepted.at["p2", "strategy"]) == (2, "grow")
    assert accepted.at["p2", "text"] == "The Aurora Mug keeps coffee hot."
    assert accepted.at["p2", "max_tokens"] == 32


def test_a_lower_passing_candidate_wins_over_a_higher_one():
    items = make_items([("p1", "Mug", "hot")])
    final = with_verdicts(generated("p1", ["bad", "good one", "good two"]), [["length"], [], []])
    result = assemble(items, COLUMNS, [], final)
    assert list(result.accepted["candidate"]) == [1]


def test_rejections_carry_their_stage_and_reasons(scenario):
    result = assemble(scenario.items, COLUMNS, scenario.early, latest_attempts(scenario.attempts))
    rejected = result.rejected.set_index("item_id")

    assert (rejected.at["line-9", "stage"], list(rejected.at["line-9", "reasons"])) == ("load", ["invalid_json"])
    assert rejected.at["line-9", "detail"] == "line 9: Expecting value"
    assert (rejected.at["p4", "stage"], list(rejected.at["p4", "reasons"])) == ("prompt", ["missing_field"])
    assert rejected.at["p4", "detail"] == "row 5: feature is empty"
    # a generated item whose candidates all failed: candidate 0 is reported, with its failures
    assert rejected.at["p3", "stage"] == "validate"
    assert list(rejected.at["p3", "reasons"]) == ["keyword", "length"]
    assert rejected.at["p3", "candidate"] == 0
    assert rejected.at["p3", "text"] == "Buy now"
    assert rejected.at["p3", "detail"] == "candidate 0 of 2 failed: keyword, length"
    # an item the engine never answered is not silently dropped
    assert (rejected.at["p5", "stage"], list(rejected.at["p5", "reasons"])) == ("generate", ["not_generated"])
    assert rejected.at["p5", "input"] == {"name": "Lost Lamp", "feature": "bright"}


def test_check_exactly_once_raises_on_a_duplicate(scenario):
    result = assemble(scenario.items, COLUMNS, scenario.early, latest_attempts(scenario.attempts))
    broken = Assembled(accepted=result.accepted,
                       rejected=pd.concat([result.rejected, result.accepted[["item_id"]].iloc[:1]], ignore_index=True))

    with pytest.raises(LostItemsError, match=r"1 duplicated \['p1'\]"):
        check_exactly_once(scenario.items, scenario.early, broken)


def test_check_exactly_once_raises_on_a_missing_item(scenario):
    result = assemble(scenario.items, COLUMNS, scenario.early, latest_attempts(scenario.attempts))
    broken = Assembled(accepted=result.accepted.iloc[1:], rejected=result.rejected)
    with pytest.raises(LostItemsError, match=r"1 missing \['p1'\]"):
        check_exactly_once(scenario.items, scenario.early, broken)


# ---------------------------------------------------------------- publish

def publish_scenario(scenario, out_dir: Path, jsonl: bool = True) -> dict[str, Any]:
    result = assemble(scenario.items, COLUMNS, scenario.early, latest_attempts(scenario.attempts))
    validation = [{"success": False, "results": [], "statistics": {"evaluated_expectations": 1}}]
    return publish_frames(out_dir, result.accepted, result.rejected, scenario.attempts, validation,
                          {"job": "unit", "counts": {"items": 6}}, jsonl)


def test_publish_writes_every_file(scenario, tmp_path):
    out = tmp_path / "out"
    manifest = publish_scenario(scenario, out)

    assert sorted(p.name for p in out.iterdir()) == [".batchgen", "current", "publications"]
    names = sorted(str(p.relative_to(out / "current")) for p in (out / "current").rglob("*") if p.is_file())
    assert names == sorted(["accepted/accepted.parquet", "rejected/rejected.parquet", "attempts/attempts.parquet",
                            "validation.json", "manifest.json", "README.md", "jsonl/accepted.jsonl",
                            "jsonl/rejected.jsonl", "jsonl/attempts.jsonl"])
    assert json.loads((out / "current" / "manifest.json").read_text(encoding="utf-8")) == manifest
    assert manifest["job"] == "unit" and manifest["counts"]["items"] == 6
    assert json.loads((out / "current" / "validation.json").read_text(encoding="utf-8"))[0]["success"] is False
    assert pq.read_table(out / "current" / "accepted").num_rows == 2  # a table is its folder
    assert pq.read_table(out / "current" / "rejected").num_rows == 4
    assert pq.read_table(out / "current" / "attempts").num_rows == len(scenario.attempts)
    assert pq.read_table(out / "current" / "attempts" / "attempts.parquet").schema.equals(ATTEMPTS_SCHEMA)


def test_publish_without_jsonl_writes_no_mirrors(scenario, tmp_path):
    out = tmp_path / "out"
    manifest = publish_scenario(scenario, out, jsonl=False)
    assert not list((out / "current").rglob("*.jsonl"))
    assert sorted(manifest["files"]) == ["README.md", "accepted/accepted.parquet", "attempts/attempts.parquet",
                                         "rejected/rejected.parquet", "validation.json"]


@pytest.mark.parametrize("stem", ["accepted", "rejected", "attempts"])
def test_parquet_and_jsonl_rows_agree(scenario, tmp_path, stem):
    out = tmp_path / "out"
    publish_scenario(scenario, out)

    from_parquet = pq.read_table(out / "current" / stem / f"{stem}.parquet").to_pylist()
    lines = (out / "current" / "jsonl" / f"{stem}.jsonl").read_text(encoding="utf-8").splitlines()
    from_jsonl = [json.loads(line) for line in lines]

    assert len(from_parquet) == len(from_jsonl) > 0
    assert from_jsonl == from_parquet


def test_published_rows_hold_the_values(scenario, tmp_path):
    out = tmp_path / "out"
    publish_scenario(scenario, out)
    results = {r["item_id"]: r for r in pq.read_table(out / "current" / "accepted").to_pylist()}
    rejected = {r["item_id"]: r for r in pq.read_table(out / "current" / "rejected").to_pylist()}

    assert results["p1"]["candidate"] == 1
    assert (results["p1"]["name"], results["p1"]["feature"]) == ("耳机", "降噪")  # the input's columns, flat
    assert "input" not in results["p1"]
    assert results["p2"]["attempt"] == 2
    assert rejected["line-9"]["candidate"] is None
    assert (rejected["line-9"]["name"], rejected["line-9"]["feature"]) == (None, None)
    assert (rejected["p4"]["name"], rejected["p4"]["feature"]) == ("Blank", "")
    assert rejected["p3"]["reasons"] == ["keyword", "length"]
    assert rejected["p5"]["reasons"] == ["not_generated"]


def test_jsonl_keeps_non_ascii_characters(scenario, tmp_path):
    out = tmp_path / "out"
    publish_scenario(scenario, out)
    raw = (out / "current" / "jsonl" / "accepted.jsonl").read_bytes()
    assert "耳机".encode("utf-8") in raw
    assert "这款耳机降噪出色".encode("utf-8") in raw
    assert b"\\u" not in raw
    assert "耳机".encode("utf-8") in (out / "current" / "jsonl" / "attempts.jsonl").read_bytes()


def test_manifest_records_the_sha256_and_rows_of_each_file(scenario, tmp_path):
    out = tmp_path / "out"
    manifest = publish_scenario(scenario, out)

    files = manifest["files"]
    assert sorted(files) == sorted(["accepted/accepted.parquet", "jsonl/accepted.jsonl", "rejected/rejected.parquet",
                                    "jsonl/rejected.jsonl", "attempts/attempts.parquet", "jsonl/attempts.jsonl",
                                    "validation.json", "README.md"])
    for name, entry in files.items():
        assert entry["sha256"] == hashlib.sha256((out / "current" / name).read_bytes()).hexdigest(), name
    assert files["accepted/accepted.parquet"]["rows"] == files["jsonl/accepted.jsonl"]["rows"] == 2
    assert files["rejected/rejected.parquet"]["rows"] == 4
    assert files["attempts/attempts.parquet"]["rows"] == len(scenario.attempts)


def test_publish_leaves_no_temporary_files(scenario, tmp_path):
    out = tmp_path / "out"
    publish_scenario(scenario, out)
    publish_scenario(scenario, out)  # publishing again adds a publication and switches to it
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == [".batchgen"]
    for publication in (out / "publications").iterdir():
        assert [p.name for p in publication.rglob("*") if p.name.startswith(".")] == []


def test_republish_replaces_the_previous_publication(scenario, tmp_path):
    out = tmp_path / "out"
    publish_scenario(scenario, out)
    scenario.attempts = scenario.attempts[scenario.attempts["item_id"] != "p3"]
    manifest = publish_scenario(scenario, out)
    rejected = {r["item_id"]: r for r in pq.read_table(out / "current" / "rejected").to_pylist()}
    assert rejected["p3"]["reasons"] == ["not_generated"]
    assert manifest["files"]["rejected/rejected.parquet"]["sha256"] == hashlib.sha256(
        (out / "current" / "rejected" / "rejected.parquet").read_bytes()).hexdigest()


def test_input_with_an_empty_csv_cell_publishes(tmp_path):
    # load -> assemble -> publish, with one empty cell in a column the prompt does not use
    path = tmp_path / "items.csv"
    path.write_text("product_id,name,note\np1,Mug,\np2,Boots,waterproof\n", encoding="utf-8")
    loaded = load_items(InputSpec(path=str(path), id_column="product_id"))
    attempts = pd.concat([with_verdicts(generated("p1", ["A sturdy mug."]), [[]]),
                          with_verdicts(generated("p2", ["Dry feet."]), [[]])], ignore_index=True)
    result = assemble(loaded.items, loaded.columns, loaded.rejected, latest_attempts(attempts))

    publish_frames(tmp_path / "out", result.accepted, result.rejected, attempts, [], {}, True, id_column="product_id")

    rows = {r["item_id"]: r for r in pq.read_table(tmp_path / "out" / "current" / "accepted").to_pylist()}
    assert {k: rows["p1"][k] for k in ("name", "note")} == {"name": "Mug", "note": None}
    assert "product_id" not in rows["p1"]  # one id column: item_id holds it
    assert rows["p2"]["note"] == "waterproof"


def test_row_rejected_for_an_empty_field_publishes(tmp_path, tokenizer):
    # the documented path for an empty template field: missing_field rejection, published with its input
    from batchgen.job import PromptSpec
    from batchgen.prompts import build_prompts

    path = tmp_path / "items.csv"
    path.write_text("product_id,name,feature\np1,Mug,hot\np2,Boots,\n", encoding="utf-8")
    loaded = load_items(InputSpec(path=str(path), id_column="product_id"))
    built = build_prompts(loaded.items, PromptSpec(template="{{ name }}: {{ feature }}"), tokenizer, 2048,
                          loaded.columns)
    attempts = with_verdicts(generated("p1", ["A sturdy mug."]), [[]])
    result = assemble(loaded.items, loaded.columns, loaded.rejected + built.rejected, latest_attempts(attempts))

    publish_frames(tmp_path / "out", result.accepted, result.rejected, attempts, [], {}, True, id_column="product_id")

    [rejected] = pq.read_table(tmp_path / "out" / "current" / "rejected").to_pylist()
    assert (rejected["item_id"], rejected["reasons"]) == ("p2", ["missing_field"])
    assert {k: rejected[k] for k in ("name", "feature")} == {"name": "Boots", "feature": None}


def test_check_published_once_refuses_a_staging_that_lost_or_doubled_an_item(tmp_path):
    import pyarrow as pa

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
