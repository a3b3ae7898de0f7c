"""Every bad input of issue 4, as a user meets it: `batchgen check` (no engine) on the broken file.

Either the command exits 3 (2 for a job that does not fit the file) with one line naming the
file, the line or row, and the field; or it exits 0 and lists the row among `would_reject`
with its reason. Never a traceback. The README's "Nothing lost" table mirrors these cases.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from batchgen.cli import EXIT_BAD_DATA, EXIT_BAD_JOB, app

HEADER = "product_id,name,feature\n"


def check(tmp_path: Path, data: Path, **job: Any) -> tuple[int, str, dict | None]:
    """Run `batchgen check` on a job over `data`; returns exit code, stderr and the parsed report."""
    spec = {
        "input": {"path": str(data), "id_column": "product_id"},
        "prompt": {"template": "Describe {{ name }}: {{ feature }}."},
        "output": {"dir": str(tmp_path / "out")},
    }
    for section, values in job.items():
        spec[section] = {**spec.get(section, {}), **values}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    result = CliRunner().invoke(app, ["check", str(path)])
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    report = json.loads(result.stdout) if result.exit_code == 0 else None
    return result.exit_code, result.stderr, report


def rejects(report: dict) -> dict[int, tuple[list[str], str]]:
    return {r["row"]: (r["reasons"], r["detail"]) for r in report["would_reject"]}


def jsonl(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines),
                    encoding="utf-8")
    return path


# ------------------------------------------------------------ the file cannot be read as a table: exit 3

@pytest.mark.parametrize("body, where, what", [
    (HEADER + "p1,Mug,hot\np2,Boots\n", "line 3", "expected 3 fields (product_id, name, feature), found 2"),
    (HEADER + "p1,Mug,hot\np2,Boots,dry,extra\n", "line 3", "found 4"),
    (HEADER + 'p1,Mug,hot\np2,"Boots"x,dry\n', "line 3", "',' expected after '\"'"),
    (HEADER + 'p1,Mug,hot\np2,"Boots,dry\np3,Lamp,bright\n', "line 3",
     "a quoted field opened on this line is never closed"),
], ids=["ragged-short", "ragged-long", "text-after-quote", "unclosed-quote"])
def test_ragged_or_badly_quoted_csv_exits_3_naming_file_and_line(tmp_path, body, where, what):
    data = tmp_path / "items.csv"
    data.write_text(body, encoding="utf-8")
    code, err, _ = check(tmp_path, data)
    assert code == EXIT_BAD_DATA
    assert f"{data}: {where}: " in err and what in err


@pytest.mark.parametrize("name", ["items.csv", "items.jsonl"])  # Parquet: see the corrupt-file tests
def test_non_utf8_bytes_exit_3_naming_file_line_and_byte(tmp_path, name):
    data = tmp_path / name
    first = HEADER if name.endswith(".csv") else '{"product_id": "p1", "name": "Mug", "feature": "hot"}\n'
    data.write_bytes(first.encode() + b"p2,Caf\xe9,hot\n")
    code, err, _ = check(tmp_path, data)
    assert code == EXIT_BAD_DATA
    assert f"{data}: line 2: not UTF-8 (byte 0xe9" in err


@pytest.mark.parametrize("name, body, what", [
    ("items.csv", b"", "input file is empty"),
    ("items.jsonl", b"", "input file is empty"),
    ("items.parquet", b"", "input file is empty"),
    ("items.csv", HEADER.encode(), "input file has no rows, only a header (product_id, name, feature)"),
    ("items.jsonl", b"\n\n", "input file has no rows"),
], ids=["csv", "jsonl", "parquet", "csv-header-only", "jsonl-blank-lines"])
def test_empty_file_exits_3(tmp_path, name, body, what):
    data = tmp_path / name
    data.write_bytes(body)
    code, err, _ = check(tmp_path, data)
    assert code == EXIT_BAD_DATA and f"{data}: {what}" in err


def test_empty_parquet_table_exits_3_listing_its_schema(tmp_path):
    data = tmp_path / "items.parquet"
    pq.write_table(pa.table({"product_id": pa.array([], pa.string()), "name": pa.array([], pa.string())}), data)
    code, err, _ = check(tmp_path, data)
    assert code == EXIT_BAD_DATA and f"{data}: input file has no rows (Parquet schema: product_id, name)" in err


def test_missing_file_and_directory_exit_3(tmp_path):
    code, err, _ = check(tmp_path, tmp_path / "nope.csv")
    assert code == EXIT_BAD_DATA and f"{tmp_path / 'nope.csv'}: input file not found" in err
    (tmp_path / "folder.csv").mkdir()
    code, err, _ = check(tmp_path, tmp_path / "folder.csv")
    assert code == EXIT_BAD_DATA and f"{tmp_path / 'folder.csv'}: is a directory" in err


# ------------------------------------------------------------ Parquet with the wrong schema

def test_not_parquet_behind_a_parquet_suffix_exits_3(tmp_path):
    data = tmp_path / "items.parquet"
    data.write_text(HEADER + "p1,Mug,hot\n", encoding="utf-8")  # a CSV, renamed
    code, err, _ = check(tmp_path, data)
    assert code == EXIT_BAD_DATA and f"{data}: not a readable Parquet file" in err


def test_truncated_parquet_exits_3(tmp_path):
    data = tmp_path / "items.parquet"
    pq.write_table(pa.table({"product_id": ["p1", "p2"], "name": ["Mug", "Boots"], "feature": ["hot", "dry"]}), data)
    data.write_bytes(data.read_bytes()[:-20])  # a copy cut short
    code, err, _ = check(tmp_path, data)
    assert code == EXIT_BAD_DATA and f"{data}: not a readable Parquet file" in err


def test_parquet_without_a_column_the_template_needs_exits_2_naming_file_and_column(tmp_path):
    data = tmp_path / "items.parquet"
    pq.write_table(pa.table({"product_id": ["p1"], "title": ["Mug"], "feature": ["hot"]}), data)
    code, err, _ = check(tmp_path, data)
    assert code == EXIT_BAD_JOB
    assert f"the template uses column 'name', which the input {data} does not have" in err
    assert "(columns: product_id, title, feature)" in err


def test_parquet_without_the_id_column_exits_3(tmp_path):
    data = tmp_path / "items.parquet"
    pq.write_table(pa.table({"sku": ["p1"], "name": ["Mug"], "feature": ["hot"]}), data)
    code, err, _ = check(tmp_path, data)
    assert code == EXIT_BAD_DATA and f"{data}: input.id_column 'product_id' is not a column" in err


@pytest.mark.parametrize("ids", [
    pa.array([[1], [2]], pa.list_(pa.int64())),
    pa.array([{"a": 1}, {"a": 2}]),
    pa.array([b"p1", b"p2"], pa.binary()),
    pa.array([True, False]),
], ids=["list", "struct", "binary", "bool"])
def test_parquet_id_column_of_a_type_without_valid_ids_exits_3_naming_field_and_type(tmp_path, ids):
    data = tmp_path / "items.parquet"
    pq.write_table(pa.table({"product_id": ids, "name": ["Mug", "Boots"], "feature": ["hot", "dry"]}), data)
    code, err, _ = check(tmp_path, data)
    assert code == EXIT_BAD_DATA
    kind = str(ids.type).split("<")[0]  # Parquet names list items "element" on the way back
    assert f"{data}: field product_id (input.id_column) has Parquet type {kind}" in err
    assert "ids must be text or integers" in err


# ------------------------------------------------------------ bad rows: listed as rejected, the rest goes on

def test_invalid_jsonl_lines_are_rejected_with_their_line(tmp_path):
    data = jsonl(tmp_path / "items.jsonl", [
        {"product_id": "p1", "name": "Mug", "feature": "hot"},
        '{"product_id": "p2", "name": "Boots"',  # cut off
        '["p3", "Lamp", "bright"]',  # JSON, not an object
        {"product_id": "p4", "name": "Kettle", "feature": "fast"},
    ])
    code, _, report = check(tmp_path, data)
    assert code == 0 and report["would_generate"] == 2
    found = rejects(report)
    assert found[2][0] == ["invalid_json"] and found[2][1].startswith("line 2: ")
    assert found[3] == (["invalid_json"], "line 3: expected a JSON object, got list")


def test_byte_order_mark_is_accepted(tmp_path):
    data = tmp_path / "items.csv"
    data.write_bytes("\ufeff".encode() + (HEADER + "p1,Mug,hot\np2,Boots,dry\n").encode())
    code, _, report = check(tmp_path, data)  # the id column is the first one: the BOM must not stick to it
    assert code == 0 and report["would_generate"] == 2 and report["would_reject"] == []


def test_duplicate_ids_are_rejected_naming_the_first_row(tmp_path):
    data = tmp_path / "items.csv"
    data.write_text(HEADER + "p1,Mug,hot\np2,Boots,dry\np1,Mug again,hot\n", encoding="utf-8")
    code, _, report = check(tmp_path, data)
    assert code == 0 and report["would_generate"] == 2
    assert rejects(report) == {3: (["duplicate_id"], "row 3: same id as row 1")}  # data rows: the header is not one


def test_ids_of_the_wrong_type_or_null_are_rejected_per_row(tmp_path):
    data = jsonl(tmp_path / "items.jsonl", [
        {"product_id": "p1", "name": "Mug", "feature": "hot"},
        {"product_id": ["p2"], "name": "Boots", "feature": "dry"},
        {"product_id": {"sku": 3}, "name": "Lamp", "feature": "bright"},
        {"product_id": True, "name": "Kettle", "feature": "fast"},
        {"product_id": 2.5, "name": "Pen", "feature": "smooth"},
        {"product_id": None, "name": "Cup", "feature": "small"},
        {"product_id": 7, "name": "Bag", "feature": "roomy"},  # a whole number is a fine id
    ])
    code, _, report = check(tmp_path, data)
    assert code == 0 and report["would_generate"] == 2
    assert rejects(report) == {
        2: (["bad_id"], "row 2: product_id is a list; ids must be text or whole numbers"),
        3: (["bad_id"], "row 3: product_id is an object; ids must be text or whole numbers"),
        4: (["bad_id"], "row 4: product_id is true; ids must be text or whole numbers"),
        5: (["bad_id"], "row 5: product_id is 2.5; ids must be text or whole numbers"),
        6: (["missing_id"], "row 6: product_id is empty"),
    }


def test_parquet_integer_ids_with_nulls_keep_their_ids(tmp_path):
    # pandas writes an integer column with a gap as float64: 1.0, NaN, 3.0
    data = tmp_path / "items.parquet"
    pd.DataFrame({"product_id": [1, None, 3], "name": ["Mug", "Boots", "Lamp"],
                  "feature": ["hot", "dry", "bright"]}).to_parquet(data)
    code, _, report = check(tmp_path, data)
    assert code == 0 and report["would_generate"] == 2
    assert rejects(report) == {2: (["missing_id"], "row 2: product_id is empty")}


def test_template_column_of_bytes_is_rejected_per_row(tmp_path):
    data = tmp_path / "items.parquet"
    pq.write_table(pa.table({"product_id": ["p1", "p2"], "name": pa.array([b"Mug", b"Boots"], pa.binary()),
                             "feature": ["hot", "dry"]}), data)
    code, _, report = check(tmp_path, data)
    assert code == 0 and report["would_generate"] == 0
    reason = (["wrong_type"], "row 1: name is bytes; a template needs text, numbers, lists or mappings")
    assert rejects(report)[1] == reason


def test_template_columns_of_numbers_lists_and_mappings_render(tmp_path):
    data = jsonl(tmp_path / "items.jsonl", [
        {"product_id": "p1", "name": "Mug", "feature": 350, "tags": ["a", "b"], "size": {"ml": 350}},
        {"product_id": "p2", "name": "Boots", "feature": "dry", "tags": "c", "size": 42},  # types vary by row
    ])
    code, _, report = check(tmp_path, data,
                            prompt={"template": "{{ name }} ({{ feature }}): {{ tags | join(', ') }} {{ size }}"})
    assert code == 0 and report["would_generate"] == 2 and report["would_reject"] == []


def test_keyword_column_that_is_not_text_is_rejected_per_row(tmp_path):
    data = jsonl(tmp_path / "items.jsonl", [
        {"product_id": "p1", "name": "Mug", "feature": "hot"},
        {"product_id": "p2", "name": ["Boots"], "feature": "dry"},
        {"product_id": "p3", "name": 42, "feature": "a number is compared as its text"},
    ])
    code, _, report = check(tmp_path, data, prompt={"template": "Describe {{ feature }}."},
                            expectations={"keyword_column": "name"})
    assert code == 0 and report["would_generate"] == 2
    assert rejects(report) == {2: (["wrong_type"], "row 2: name (expectations.keyword_column) is list; "
                                                   "a keyword must be text or a number")}
