"""Where inputs come from: folders and globs of Parquet files, datasets save_to_disk folders, s3:// URLs."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen.items import DataError, load_items
from batchgen.job import InputSpec
from tests.servers import moto_s3

BUCKET = "inputs"


def parquet_parts(folder, parts: list[list[str]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for index, ids in enumerate(parts):
        pq.write_table(pa.table({"sku": ids, "name": [f"name of {i}" for i in ids]}),
                       folder / f"part-{index:05d}.parquet")


def test_a_folder_of_parquet_files_is_one_table_in_file_order(tmp_path):
    folder = tmp_path / "items"
    parquet_parts(folder, [["a", "b"], ["c"]])
    parquet_parts(folder / "region=eu", [["d"]])  # a partition's subfolder
    (folder / "_SUCCESS").write_text("")  # what writers leave beside the data: skipped
    (folder / ".part-00000.parquet.crc").write_bytes(b"\x00")
    loaded = load_items(InputSpec(path=str(folder), id_column="sku"))
    assert list(loaded.items["item_id"]) == ["a", "b", "c", "d"]
    assert list(loaded.items["row_number"]) == [1, 2, 3, 4]  # counted across the files
    assert loaded.columns == ["sku", "name"]


def test_limit_stops_before_the_files_it_does_not_need(tmp_path):
    folder = tmp_path / "items"
    parquet_parts(folder, [["a", "b", "c"]])
    (folder / "part-00001.parquet").write_bytes(b"not parquet at all")  # never opened
    loaded = load_items(InputSpec(path=str(folder), id_column="sku", limit=2))
    assert list(loaded.items["item_id"]) == ["a", "b"]
    with pytest.raises(DataError, match="part-00001.parquet: not a readable Parquet file"):
        load_items(InputSpec(path=str(folder), id_column="sku"))


def test_a_glob_names_the_files(tmp_path):
    parquet_parts(tmp_path / "data", [["a"], ["b"], ["c"]])
    loaded = load_items(InputSpec(path=str(tmp_path / "data" / "part-0000[02].parquet"), id_column="sku"))
    assert list(loaded.items["item_id"]) == ["a", "c"]
    with pytest.raises(DataError, match=r"nothing-\*.parquet: no input file matches"):
        load_items(InputSpec(path=str(tmp_path / "data" / "nothing-*.parquet")))


def test_a_glob_of_csv_files_numbers_rows_across_them(tmp_path):
    (tmp_path / "a.csv").write_text("sku,name\ns1,Mug\ns2,Lamp\n", encoding="utf-8")
    (tmp_path / "b.csv").write_text("sku,name\ns3,Kettle\ns1,Mug again\n", encoding="utf-8")
    loaded = load_items(InputSpec(path=str(tmp_path / "*.csv"), id_column="sku"))
    assert list(loaded.items["item_id"]) == ["s1", "s2", "s3"]
    [duplicate] = loaded.rejected
    assert (duplicate.row_number, duplicate.reasons) == (4, ["duplicate_id"])


def test_a_folder_without_tables_is_named(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DataError, match="is a directory without parquet files"):
        load_items(InputSpec(path=str(tmp_path)))


def test_a_datasets_save_to_disk_folder(tmp_path):
    import datasets

    rows = {"question": [f"q{i}" for i in range(7)], "topic": ["a", "b"] * 3 + ["c"], "n": list(range(7))}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "saved"), num_shards=3)
    assert len(list((tmp_path / "saved").glob("*.arrow"))) > 1  # several Arrow files, read in order
    loaded = load_items(InputSpec(path=str(tmp_path / "saved")))
    assert list(loaded.items["question"]) == rows["question"]
    assert list(loaded.items["n"]) == rows["n"]
    assert list(loaded.items["row_number"]) == list(range(1, 8))
    assert list(load_items(InputSpec(path=str(tmp_path / "saved"), limit=3)).items["question"]) == ["q0", "q1", "q2"]

    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(DataError, match=r"DatasetDict folder \(splits: train\); set input.path to one split's"):
        load_items(InputSpec(path=str(tmp_path / "dict")))
    assert len(load_items(InputSpec(path=str(tmp_path / "dict" / "train"))).items) == 7


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    import boto3

    with moto_s3(tmp_path_factory.mktemp("moto") / "server.log", (BUCKET,)) as endpoint:
        yield boto3.client("s3", endpoint_url=endpoint)


def test_inputs_at_an_s3_url(s3, tmp_path):
    s3.put_object(Bucket=BUCKET, Key="one/items.csv", Body=b"sku,name\ns1,Mug\ns2,Lamp\n")
    loaded = load_items(InputSpec(path=f"s3://{BUCKET}/one/items.csv", id_column="sku"))
    assert list(loaded.items["name"]) == ["Mug", "Lamp"]

    for index, ids in enumerate([["a", "b"], ["c"]]):
        sink = io.BytesIO()
        pq.write_table(pa.table({"sku": ids}), sink)
        s3.put_object(Bucket=BUCKET, Key=f"parts/part-{index}.parquet", Body=sink.getvalue())
    s3.put_object(Bucket=BUCKET, Key="parts/_SUCCESS", Body=b"")
    assert list(load_items(InputSpec(path=f"s3://{BUCKET}/parts", id_column="sku")).items["item_id"]) == \
        ["a", "b", "c"]
    assert list(load_items(InputSpec(path=f"s3://{BUCKET}/parts/part-1.*", id_column="sku")).items["item_id"]) == \
        ["c"]
    assert list(load_items(InputSpec(path=f"s3://{BUCKET}/parts", id_column="sku", limit=1)).items["item_id"]) == \
        ["a"]

    s3.put_object(Bucket=BUCKET, Key="one/items.json", Body=json.dumps([{"sku": "j1"}, {"sku": "j2"}]).encode())
    assert list(load_items(InputSpec(path=f"s3://{BUCKET}/one/items.json", id_column="sku")).items["item_id"]) == \
        ["j1", "j2"]

    with pytest.raises(DataError, match=f"s3://{BUCKET}/one/missing.csv: input file not found"):
        load_items(InputSpec(path=f"s3://{BUCKET}/one/missing.csv"))
    with pytest.raises(DataError, match="credentials must not be written into the job file"):
        load_items(InputSpec(path=f"s3://key:secret@{BUCKET}/one/items.csv"))


def test_a_save_to_disk_folder_at_an_s3_url(s3, tmp_path):
    """The folder's Arrow files in state.json's order, as a local save_to_disk folder is read."""
    import datasets

    rows = {"question": [f"q{i}" for i in range(5)], "n": list(range(5))}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "saved"), num_shards=2)
    for path in (tmp_path / "saved").iterdir():
        s3.put_object(Bucket=BUCKET, Key=f"saved/{path.name}", Body=path.read_bytes())
    loaded = load_items(InputSpec(path=f"s3://{BUCKET}/saved"))
    assert list(loaded.items["question"]) == rows["question"] and list(loaded.items["n"]) == rows["n"]

    s3.put_object(Bucket=BUCKET, Key="broken/state.json", Body=b"{\"_data_files\": 3}")
    s3.put_object(Bucket=BUCKET, Key="broken/dataset_info.json", Body=b"{}")
    with pytest.raises(DataError, match=f"s3://{BUCKET}/broken: state.json of a datasets save_to_disk folder "
                                        "cannot be read"):
        load_items(InputSpec(path=f"s3://{BUCKET}/broken"))
