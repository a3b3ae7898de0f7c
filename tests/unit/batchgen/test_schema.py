"""The published tables' schemas: input columns under their own names, or prefixed when batchgen's own
columns take the name."""

from __future__ import annotations

import pickle

import pandas as pd
import pytest

from batchgen.schema import frame_input_codec, published_input_names


@pytest.mark.parametrize("names, taken, expected", [
    (["name", "text"], {"text"}, {"name": "name", "text": "input_text"}),
    (["text", "input_text"], {"text"}, {"text": "input_input_text", "input_text": "input_text"}),
    (["item_id", "reasons"], {"item_id", "reasons"}, {"item_id": "input_item_id", "reasons": "input_reasons"}),
])
def test_published_input_names(names, taken, expected):
    assert published_input_names(names, taken) == expected


def test_an_input_codec_gives_each_column_as_it_encodes_each_row():
    items = pd.DataFrame({"size": [1, "XL", 3], "tags": [["a"], ["b", "c"], []], "name": ["lamp", "chair", "table"]})
    struct, codec = frame_input_codec(items, ["size", "tags", "name"], [{"name": "stool", "note": "é"}])
    assert [f.name for f in struct] == ["size", "tags", "name", "note"]
    assert codec.as_json == {"size"}  # a number in one row and text in the next: kept as JSON text

    rows = [{"size": 1, "tags": ["a"], "name": "lamp"}, None, {}, {"size": "XL", "note": "é"},
            {"size": [1, 2], "tags": None, "name": "中"}]
    by_row = [codec(row) for row in rows]
    columns = codec.columns(rows, codec.names)

    assert columns == {name: [row.get(name) if row else None for row in by_row] for name in codec.names}
    assert columns["size"] == ["1", None, None, '"XL"', "[1, 2]"]
    assert codec.columns(rows, ["note"]) == {"note": [None, None, None, "é", None]}
    assert pickle.loads(pickle.dumps(codec)).columns(rows, ["size"]) == {"size": columns["size"]}
