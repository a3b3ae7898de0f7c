"""A publication opened as a dataset: datasets, duckdb, polars and pandas read each table with one line.

The publication is a real one (a CSV loaded by load_items, assembled, published with the card); the
engine's outputs are made by hand, since what is checked here is the layout, not the generation (the
engine run's publication goes through the same readers in tests/e2e/test_engine_end_to_end.py).
"""

from __future__ import annotations

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from batchgen.assemble import assemble
from batchgen.items import load_items
from batchgen.job import InputSpec
from batchgen.publish import CARD, REJECTED, RESULTS
from batchgen.retry import latest_attempts
from batchgen.schema import INPUT_COLUMN_KEY, published_input_names
from tests.dataset_checks import check_readers
from tests.publications import generated, publish_frames
from tests.unit.test_assemble_publish import with_verdicts

# The input has columns named like batchgen's own (text, stage) and one named like a renamed one (input_text).
CSV = ("sku,name,text,stage,input_text\n"
       "s1,Mug,keeps coffee hot,draft,a\n"
       "s2,Boots,dry feet,final,b\n"
       "\n"  # a blank line is not a row
       "s3,Lamp,bright,draft,c\n"
       "s1,Mug again,duplicate,draft,d\n")


@pytest.fixture
def publication(tmp_path):
    path = tmp_path / "items.csv"
    path.write_text(CSV, encoding="utf-8")
    loaded = load_items(InputSpec(path=str(path), id_column="sku"))
    attempts = pd.concat([with_verdicts(generated("s1", ["The Mug keeps coffee hot."]), [[]]),
                          with_verdicts(generated("s2", ["Boots."]), [["length"]]),
                          with_verdicts(generated("s3", ["The Lamp is bright."]), [[]])], ignore_index=True)
    result = assemble(loaded.items, loaded.columns, loaded.rejected, latest_attempts(attempts))
    manifest = {"job": "readers", "model": {"name": "SmolLM2-135M-Instruct"},
                "prompt": {"style": "chat", "system": None, "template": "Describe {{ name }}."},
                "counts": {"items": 4, "accepted": len(result.accepted), "rejected": len(result.rejected),
                           "rejected_by_reason": {"duplicate_id": 1, "length": 1}}}
    written = publish_frames(tmp_path / "out", result.accepted, result.rejected, attempts, [], manifest, True,
                             id_column="sku")
    return tmp_path / "out", written, path


def test_every_reader_opens_each_table(publication, tmp_path):
    out, manifest, _ = publication
    tables = check_readers(out, manifest, tmp_path / "hf-cache")
    assert sorted(tables["accepted"]["item_id"]) == ["s1", "s3"]
    assert sorted(tables["rejected"]["item_id"]) == ["s1@row-4", "s2"]


def test_input_columns_are_flat_under_their_own_names_or_prefixed(publication):
    out, _, _ = publication
    accepted = pd.read_parquet(out / "current" / "accepted").set_index("item_id")
    # text and stage are batchgen's columns: the input's are input_text (taken by the input itself, so
    # input_input_text) and input_stage; the id column is item_id, not repeated
    assert list(accepted.columns[accepted.columns.get_loc("prompt") + 1:][:4]) == [
        "name", "input_input_text", "input_stage", "input_text"]
    assert "sku" not in accepted.columns
    assert accepted.loc["s1", "text"] == "The Mug keeps coffee hot."  # the output
    assert accepted.loc["s1", "input_input_text"] == "keeps coffee hot"  # the input's text
    assert (accepted.loc["s1", "input_stage"], accepted.loc["s1", "input_text"]) == ("draft", "a")
    rejected = pd.read_parquet(out / "current" / "rejected").set_index("item_id")
    assert rejected.loc["s2", "stage"] == "validate" and rejected.loc["s2", "input_stage"] == "final"
    assert rejected.loc["s1@row-4", "name"] == "Mug again"
    # each published input column says which input column it is
    field = pq.read_schema(out / "current" / RESULTS).field("input_input_text")
    assert field.metadata[INPUT_COLUMN_KEY] == b"text"


def test_row_number_finds_the_row_in_the_input(publication):
    out, _, path = publication
    frame = pd.read_csv(path, dtype=str)  # what a user reads the input with
    for table in ("accepted", "rejected"):
        for row in pd.read_parquet(out / "current" / table).itertuples():
            assert frame.iloc[row.row_number - 1]["name"] == row.name, (table, row.item_id)
    rejected = pd.read_parquet(out / "current" / REJECTED.split("/")[0]).set_index("item_id")
    assert rejected.loc["s1@row-4", "row_number"] == 4  # the blank line is not counted


def test_the_card_names_the_tables_model_template_and_counts(publication):
    out, manifest, _ = publication
    text = (out / "current" / CARD).read_text(encoding="utf-8")
    header = yaml.safe_load(text.split("---\n")[1])
    assert [c["config_name"] for c in header["configs"]] == ["accepted", "rejected", "attempts"]
    assert header["configs"][0]["default"] is True
    assert header["configs"][1]["data_files"] == [{"split": "train", "path": "rejected/*.parquet"}]
    assert "`SmolLM2-135M-Instruct`" in text and "Describe {{ name }}." in text
    assert "| 4 | 2 | 2 |" in text  # items, accepted, rejected
    assert "| duplicate_id | 1 |" in text
    assert "| input_input_text | string | input column `text`, renamed" in text
    assert manifest["files"][CARD]["sha256"]  # the card is part of the verified publication


@pytest.mark.parametrize("names, taken, expected", [
    (["name", "text"], {"text"}, {"name": "name", "text": "input_text"}),
    (["text", "input_text"], {"text"}, {"text": "input_input_text", "input_text": "input_text"}),
    (["item_id", "reasons"], {"item_id", "reasons"}, {"item_id": "input_item_id", "reasons": "input_reasons"}),
])
def test_published_input_names(names, taken, expected):
    assert published_input_names(names, taken) == expected
