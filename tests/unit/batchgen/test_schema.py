"""The published tables' schemas: input columns under their own names, or prefixed when batchgen's own
columns take the name."""

from __future__ import annotations

import pytest

from batchgen.schema import published_input_names


@pytest.mark.parametrize("names, taken, expected", [
    (["name", "text"], {"text"}, {"name": "name", "text": "input_text"}),
    (["text", "input_text"], {"text"}, {"text": "input_input_text", "input_text": "input_text"}),
    (["item_id", "reasons"], {"item_id", "reasons"}, {"item_id": "input_item_id", "reasons": "input_reasons"}),
])
def test_published_input_names(names, taken, expected):
    assert published_input_names(names, taken) == expected
