"""Loading the input table: formats (JSON arrays too), ids, rejections and unreadable files."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen.items import DataError, content_id, json_elements, load_items
from batchgen.job import InputSpec

HEADER = ["product_id", "name", "feature"]
ROWS = [
    ["p1", "Aurora Mug", "keeps coffee hot"],
    ["p2", "星辰保温杯", "一键研磨"],
    ["p3", "Trail Boots", "waterproof, light"],  # a comma inside a field
]


def write_csv(path: Path, header: list[str], rows: list[list[Any]], bom: bool = False) -> Path:
    with open(path, "w", encoding="utf-8-sig" if bom else "utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def write_parquet(path: Path, records: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(records), path)
    return path


def records(header: list[str], rows: list[list[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(header, row)) for row in rows]


def write_table(tmp_path: Path, fmt: str, header: list[str], rows: list[list[Any]]) -> Path:
    if fmt == "csv":
        return write_csv(tmp_path / "items.csv", header, rows)
    if fmt == "jsonl":
        return write_jsonl(tmp_path / "items.jsonl", records(header, rows))
    return write_parquet(tmp_path / "items.parquet", records(header, rows))


def item_records(loaded) -> list[dict[str, Any]]:
    return loaded.items.drop(columns=["row_number"]).to_dict(orient="records")


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_each_format_gives_the_same_items(tmp_path, fmt):
    loaded = load_items(InputSpec(path=str(write_table(tmp_path, fmt, HEADER, ROWS)), id_column="product_id"))

    assert loaded.rejected == []
    assert loaded.columns == HEADER
    assert list(loaded.items.columns) == ["item_id", "row_number", *HEADER]
    assert item_records(loaded) == [{"item_id": r[0], **dict(zip(HEADER, r))} for r in ROWS]


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_row_numbers_count_data_rows_from_one(tmp_path, fmt):
    loaded = load_items(InputSpec(path=str(write_table(tmp_path, fmt, HEADER, ROWS)), id_column="product_id"))
    assert list(loaded.items["row_number"]) == [1, 2, 3]  # a CSV header is not a row
    frame = {"csv": pd.read_csv, "jsonl": lambda p: pd.read_json(p, lines=True), "parquet": pd.read_parquet}[fmt](
        tmp_path / f"items.{fmt}")
    # what a user does to find an item's row in the input
    assert [frame.iloc[n - 1]["product_id"] for n in loaded.items["row_number"]] == list(loaded.items["item_id"])


def test_explicit_format_overrides_the_suffix(tmp_path):
    path = write_jsonl(tmp_path / "items.txt", records(HEADER, ROWS))
    loaded = load_items(InputSpec(path=str(path), format="jsonl", id_column="product_id"))
    assert list(loaded.items["item_id"]) == ["p1", "p2", "p3"]


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_without_id_column_the_id_is_a_content_hash(tmp_path, fmt):
    header, rows = ["name", "feature"], [r[1:] for r in ROWS]
    spec = InputSpec(path=str(write_table(tmp_path, fmt, header, rows)))

    first, second = load_items(spec), load_items(spec)

    ids = list(first.items["item_id"])
    assert ids == list(second.items["item_id"])  # stable across calls
    assert len(set(ids)) == 3
    assert ids == [content_id(dict(zip(header, row))) for row in rows]
    assert all(i.startswith("h") and len(i) == 16 for i in ids)


def test_content_hash_is_the_same_across_formats(tmp_path):
    header, rows = ["name", "feature"], [r[1:] for r in ROWS]
    ids = []
    for fmt in ("csv", "jsonl", "parquet"):
        folder = tmp_path / fmt
        folder.mkdir()
        ids.append(list(load_items(InputSpec(path=str(write_table(folder, fmt, header, rows)))).items["item_id"]))
    assert ids[0] == ids[1] == ids[2]


def test_identical_rows_without_id_give_one_item_and_a_duplicate_item_rejection(tmp_path):
    path = write_csv(tmp_path / "items.csv", ["name", "feature"],
                     [["Mug", "hot"], ["Boots", "dry"], ["Mug", "hot"]])

    loaded = load_items(InputSpec(path=str(path)))

    assert list(loaded.items["name"]) == ["Mug", "Boots"]
    assert len(loaded.rejected) == 1
    rejection = loaded.rejected[0]
    assert rejection.reasons == ["duplicate_item"]
    assert rejection.row_number == 3
    assert rejection.stage == "load"
    assert "same content as row 1" in rejection.detail
    assert rejection.input == {"name": "Mug", "feature": "hot"}
    assert rejection.item_id != loaded.items["item_id"].iloc[0]  # a rejection never reuses a kept id


def test_duplicate_id_is_rejected_naming_the_earlier_row(tmp_path):
    path = write_csv(tmp_path / "items.csv", HEADER,
                     [["p1", "Mug", "hot"], ["p2", "Boots", "dry"], ["p1", "Other mug", "cold"]])

    loaded = load_items(InputSpec(path=str(path), id_column="product_id"))

    assert list(loaded.items["item_id"]) == ["p1", "p2"]
    assert list(loaded.items["name"]) == ["Mug", "Boots"]  # the first row with the id wins
    [rejection] = loaded.rejected
    assert rejection.reasons == ["duplicate_id"]
    assert rejection.row_number == 3
    assert "row 3" in rejection.detail and "same id as row 1" in rejection.detail
    assert rejection.input["name"] == "Other mug"


@pytest.mark.parametrize("empty_id", ["", "   "])
def test_empty_id_is_rejected_as_missing_id(tmp_path, empty_id):
    path = write_csv(tmp_path / "items.csv", HEADER, [["p1", "Mug", "hot"], [empty_id, "Boots", "dry"]])

    loaded = load_items(InputSpec(path=str(path), id_column="product_id"))

    assert list(loaded.items["item_id"]) == ["p1"]
    [rejection] = loaded.rejected
    assert rejection.reasons == ["missing_id"]
    assert rejection.row_number == 2
    assert "product_id is empty" in rejection.detail


def test_jsonl_null_id_is_rejected_as_missing_id(tmp_path):
    path = write_jsonl(tmp_path / "items.jsonl", [{"product_id": None, "name": "Mug"}, {"product_id": 7, "name": "B"}])
    loaded = load_items(InputSpec(path=str(path), id_column="product_id"))
    assert list(loaded.items["item_id"]) == ["7"]  # ids are text
    assert [r.reasons for r in loaded.rejected] == [["missing_id"]]


def test_jsonl_invalid_line_is_rejected_and_the_other_lines_load(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_text(
        '{"product_id": "p1", "name": "Mug"}\n'
        '{"product_id": "p2", "name": \n'
        '\n'
        '["not", "an", "object"]\n'
        '{"product_id": "p3", "name": "Boots"}\n',
        encoding="utf-8",
    )

    loaded = load_items(InputSpec(path=str(path), id_column="product_id"))

    assert list(loaded.items["item_id"]) == ["p1", "p3"]
    assert list(loaded.items["row_number"]) == [1, 4]  # the blank line is not a row; unreadable lines are
    assert [(r.row_number, r.reasons) for r in loaded.rejected] == [(2, ["invalid_json"]), (3, ["invalid_json"])]
    assert loaded.rejected[0].detail.startswith("line 2:")  # the message names the file's line
    assert loaded.rejected[1].item_id == "line-4"
    assert "expected a JSON object, got list" in loaded.rejected[1].detail


def test_jsonl_string_with_unicode_line_separator_is_one_row(tmp_path):
    # json.dumps(..., ensure_ascii=False) writes U+2028 / U+2029 / U+0085 unescaped inside strings;
    # they are valid JSON and must not split the line (only "\n" ends a JSONL record).
    path = write_jsonl(tmp_path / "items.jsonl", [
        {"product_id": "p1", "name": "Mug", "feature": "hot\u2028and\u2029light\x85too"},
        {"product_id": "p2", "name": "Boots", "feature": "dry"},
    ])

    loaded = load_items(InputSpec(path=str(path), id_column="product_id"))

    assert loaded.rejected == []
    assert list(loaded.items["item_id"]) == ["p1", "p2"]
    assert loaded.items["feature"].iloc[0] == "hot\u2028and\u2029light\x85too"
    assert list(loaded.items["row_number"]) == [1, 2]


def test_csv_cell_with_unicode_line_separator_stays_in_its_cell(tmp_path):
    path = write_csv(tmp_path / "items.csv", HEADER, [["p1", "Mug", "hot\u2028cold"], ["p2", "Boots", "dry"]])

    loaded = load_items(InputSpec(path=str(path), id_column="product_id"))

    assert list(loaded.items["feature"]) == ["hot\u2028cold", "dry"]


def test_csv_quoted_cell_with_newline_is_one_row(tmp_path):
    path = write_csv(tmp_path / "items.csv", HEADER, [["p1", "Mug", "line one\nline two"], ["p2", "Boots", "dry"]])
    loaded = load_items(InputSpec(path=str(path), id_column="product_id"))
    assert list(loaded.items["feature"]) == ["line one\nline two", "dry"]
    assert list(loaded.items["row_number"]) == [1, 2]  # a record over two lines is one row


def test_csv_with_windows_line_endings(tmp_path):
    path = tmp_path / "items.csv"
    path.write_bytes(b'product_id,name,feature\r\np1,Mug,"two\r\nlines"\r\np2,Boots,dry\r\n')
    loaded = load_items(InputSpec(path=str(path), id_column="product_id"))
    assert loaded.columns == HEADER
    assert list(loaded.items["item_id"]) == ["p1", "p2"]
    assert list(loaded.items["feature"]) == ["two\r\nlines", "dry"]


def test_csv_with_utf8_bom_loads_with_a_clean_first_column(tmp_path):
    path = write_csv(tmp_path / "items.csv", HEADER, ROWS, bom=True)
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")

    loaded = load_items(InputSpec(path=str(path), id_column="product_id"))

    assert loaded.columns[0] == "product_id"
    assert list(loaded.items["item_id"]) == ["p1", "p2", "p3"]


def test_non_utf8_bytes_raise_data_error_naming_file_and_line(tmp_path):
    path = tmp_path / "items.csv"
    path.write_bytes(b"product_id,name\np1,Mug\np2,Caf\xe9 cup\n")

    with pytest.raises(DataError) as info:
        load_items(InputSpec(path=str(path), id_column="product_id"))

    message = str(info.value)
    assert str(path) in message
    assert "line 3" in message
    assert "not UTF-8" in message and "0xe9" in message


def test_ragged_csv_raises_data_error_naming_the_line(tmp_path):
    path = tmp_path / "items.csv"
    path.write_text("product_id,name,feature\np1,Mug,hot\np2,Boots\np3,Cap,red\n", encoding="utf-8")

    with pytest.raises(DataError) as info:
        load_items(InputSpec(path=str(path), id_column="product_id"))

    message = str(info.value)
    assert str(path) in message
    assert "line 3" in message
    assert "expected 3 fields" in message and "found 2" in message


@pytest.mark.parametrize("name", ["items.csv", "items.jsonl", "items.parquet"])
def test_empty_file_raises_data_error(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"")
    with pytest.raises(DataError, match=r"items\.\w+: input file is empty"):
        load_items(InputSpec(path=str(path)))


def test_missing_file_raises_data_error(tmp_path):
    with pytest.raises(DataError, match=r"nope\.csv: input file not found"):
        load_items(InputSpec(path=str(tmp_path / "nope.csv")))


def test_directory_raises_data_error(tmp_path):
    folder = tmp_path / "data.csv"
    folder.mkdir()
    with pytest.raises(DataError, match=r"is a directory"):
        load_items(InputSpec(path=str(folder)))


def test_unknown_suffix_tells_to_set_input_format(tmp_path):
    path = tmp_path / "items.xlsx"
    path.write_text("product_id\np1\n", encoding="utf-8")
    with pytest.raises(DataError) as info:
        load_items(InputSpec(path=str(path)))
    assert "'.xlsx'" in str(info.value)
    assert "set input.format" in str(info.value)


def test_garbage_parquet_raises_data_error(tmp_path):
    path = tmp_path / "items.parquet"
    path.write_bytes(b"this is not parquet at all")
    with pytest.raises(DataError, match="not a readable Parquet file"):
        load_items(InputSpec(path=str(path)))


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_limit_keeps_the_first_rows(tmp_path, fmt):
    rows = [[f"p{i}", f"name {i}", f"feature {i}"] for i in range(1, 8)]
    loaded = load_items(InputSpec(path=str(write_table(tmp_path, fmt, HEADER, rows)), id_column="product_id", limit=3))
    assert list(loaded.items["item_id"]) == ["p1", "p2", "p3"]
    assert loaded.rejected == []


def test_limit_drops_rejections_past_the_cutoff(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_text('not json\n{"product_id": "p1"}\n{"product_id": "p2"}\n{"product_id": "p3"}\n[1]\n',
                    encoding="utf-8")
    loaded = load_items(InputSpec(path=str(path), id_column="product_id", limit=2))
    assert list(loaded.items["item_id"]) == ["p1", "p2"]
    assert [r.row_number for r in loaded.rejected] == [1]  # line 5 is past the limit


def test_limit_larger_than_the_file_keeps_everything(tmp_path):
    loaded = load_items(InputSpec(path=str(write_table(tmp_path, "csv", HEADER, ROWS)), id_column="product_id",
                                  limit=100))
    assert len(loaded.items) == 3


def test_empty_csv_cell_is_none(tmp_path):
    path = write_csv(tmp_path / "items.csv", HEADER, [["p1", "Mug", ""], ["p2", "Boots", "dry"]])

    loaded = load_items(InputSpec(path=str(path), id_column="product_id"))

    rows = loaded.items.to_dict(orient="records")  # how the pipeline reads the items
    assert rows[0]["feature"] is None
    assert rows[1]["feature"] == "dry"


def test_unknown_id_column_raises_data_error(tmp_path):
    path = write_table(tmp_path, "csv", HEADER, ROWS)
    with pytest.raises(DataError, match=r"input.id_column 'sku' is not a column"):
        load_items(InputSpec(path=str(path), id_column="sku"))


@pytest.mark.parametrize("reserved", ["item_id", "row_number"])
def test_reserved_column_name_raises_data_error(tmp_path, reserved):
    path = write_csv(tmp_path / "items.csv", ["product_id", reserved], [["p1", "x"]])
    with pytest.raises(DataError, match=f"'{reserved}' is reserved"):
        load_items(InputSpec(path=str(path), id_column="product_id"))


def test_jsonl_rows_with_different_keys_get_every_column(tmp_path):
    path = write_jsonl(tmp_path / "items.jsonl", [{"product_id": "p1", "name": "Mug"},
                                                  {"product_id": "p2", "color": "red"}])
    loaded = load_items(InputSpec(path=str(path), id_column="product_id"))
    assert loaded.columns == ["product_id", "name", "color"]
    rows = loaded.items.to_dict(orient="records")
    assert rows[0]["name"] == "Mug" and rows[1]["color"] == "red"


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_limit_stops_reading_the_file(tmp_path, fmt):
    # past the first rows the file is broken (a ragged row, then, past the first block read, bytes that are
    # not UTF-8): with a limit it is never read
    path = tmp_path / f"items.{fmt}"
    if fmt == "csv":
        path.write_bytes(b"product_id,name\np1,Mug\np2,Lamp\np3,ragged,row\n" + b"p9,x\n" * 30_000 + b"\xff\xfe")
    else:
        path.write_bytes(b'{"product_id": "p1"}\nnot json\n{"product_id": "p2"}\n' + b"[1]\n" * 30_000 + b"\xff\xfe\n")
    loaded = load_items(InputSpec(path=str(path), id_column="product_id", limit=2))
    assert list(loaded.items["item_id"]) == ["p1", "p2"]
    with pytest.raises(DataError, match="line 4: expected 2 fields" if fmt == "csv" else "not UTF-8"):  # no limit
        load_items(InputSpec(path=str(path), id_column="product_id"))


def test_parquet_limit_reads_only_the_first_rows(tmp_path):
    path = tmp_path / "items.parquet"
    pq.write_table(pa.table({"product_id": [f"p{i}" for i in range(10_000)], "name": ["x"] * 10_000}), path,
                   row_group_size=1000)
    loaded = load_items(InputSpec(path=str(path), id_column="product_id", limit=1500))
    assert list(loaded.items["item_id"]) == [f"p{i}" for i in range(1500)]
    assert list(loaded.items["row_number"])[-1] == 1500


def test_labels_equal_to_input_ids_get_a_suffix(tmp_path):
    path = tmp_path / "items.csv"
    path.write_text("product_id,name\nrow-2,Mug\n,Lamp\np1,Kettle\np1,Kettle\np1@row-4,Cup\n", encoding="utf-8")
    loaded = load_items(InputSpec(path=str(path), id_column="product_id"))
    assert list(loaded.items["item_id"]) == ["row-2", "p1", "p1@row-4"]
    assert [(r.item_id, r.reasons) for r in loaded.rejected] == [("row-2~2", ["missing_id"]),
                                                                  ("p1@row-4~2", ["duplicate_id"])]


def test_csv_cell_longer_than_pythons_field_limit_loads(tmp_path):
    path = tmp_path / "items.csv"
    path.write_text(f"product_id,name\np1,{'x' * 200_000}\np2,Lamp\n", encoding="utf-8")
    loaded = load_items(InputSpec(path=str(path), id_column="product_id"))
    assert [len(name) for name in loaded.items["name"]] == [200_000, 4]


def test_a_checked_load_is_taken_once_by_the_next_load_of_the_unchanged_file(tmp_path):
    """`batchgen run` parses the input once: its checks keep their load, the flow's load-items task takes it."""
    import os

    from batchgen.items import keep_for_next_load, load_items, take_kept_load
    from batchgen.job import InputSpec

    path = tmp_path / "items.csv"
    path.write_text("id,q\na,first\nb,second\n", encoding="utf-8")
    spec = InputSpec(path=str(path), id_column="id")
    loaded = load_items(spec)
    keep_for_next_load(spec, loaded)
    assert take_kept_load(InputSpec(path=str(path), id_column="id", limit=1)) is None  # another load
    assert take_kept_load(spec) is loaded
    assert take_kept_load(spec) is None  # given once

    keep_for_next_load(spec, loaded)
    path.write_text("id,q\na,changed\n", encoding="utf-8")
    os.utime(path, ns=(1, 1))
    assert take_kept_load(spec) is None  # the file changed since


def test_a_json_array_of_objects(tmp_path):
    path = tmp_path / "items.json"
    path.write_text(json.dumps([{"sku": "a", "name": "Mug"}, ["not", "an", "object"], {"sku": "b", "name": "Lamp"}],
                               indent=2), encoding="utf-8")
    loaded = load_items(InputSpec(path=str(path), id_column="sku"))
    assert list(loaded.items["item_id"]) == ["a", "b"]
    assert list(loaded.items["row_number"]) == [1, 3]
    [bad] = loaded.rejected
    assert bad.reasons == ["invalid_json"] and bad.row_number == 2
    assert bad.detail == "element 2 (line 6): expected a JSON object, got list"


@pytest.mark.parametrize("text, message", [
    ('{"sku": "a"}', "line 1: expected a JSON array of objects, found '{'"),
    ('[{"sku": "a"},\n {"sku": }]', "line 2: not a JSON array: Expecting value"),
    ('[{"sku": "a"} {"sku": "b"}]', "line 1: not a JSON array: expected ',' or ']', found '{'"),
    ('[{"sku": "a"},\n', "line 2: the JSON array is never closed"),
    ("[]", "input file has no rows (an empty JSON array)"),
])
def test_a_json_file_that_is_not_an_array_of_objects_names_the_line(tmp_path, text, message):
    path = tmp_path / "items.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=f"{path}: " + message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        load_items(InputSpec(path=str(path)))


def test_json_elements_across_small_blocks():
    values = [{"a": "x" * 10, "n": 12345}, 678, "text, with a comma ]", [1, 2], None, {"b": {"c": [3]}}]
    text = json.dumps(values, indent=1)
    for block in (1, 2, 3, 7, 64):
        assert [v for _, v in json_elements(io.StringIO(text), block=block)] == values, block
    assert [line for line, _ in json_elements(io.StringIO(text), block=5)][:2] == [2, 6]
