
"""Reading a publication (batchgen.report.read): what the report takes from it, and a clear error on a folder that
is not one."""

from __future__ import annotations

import shutil

import pytest

from batchgen.publish import ATTEMPTS
from batchgen.report import write_report
from batchgen.report.read import NotAPublicationError, expected_keyword, load_publication
from tests.unit.batchgen.report.publication import STARTED


def test_the_synthetic_publication_is_what_the_report_tests_need(published):
    root, manifest, _ = published
    assert manifest["counts"] == {**manifest["counts"], "accepted": 4, "rejected": 2}
    assert manifest["counts"]["rejected_by_reason"] == {"length": 1, "must_not_match": 1, "prompt_too_long": 1}

def test_a_directory_without_a_publication_is_named_in_the_error(tmp_path):
    (tmp_path / "manifest.json").write_text("{}", encoding="utf-8")
    with pytest.raises(NotAPublicationError, match="missing accepted/accepted.parquet, rejected/rejected.parquet"):
        write_report(tmp_path)
    with pytest.raises(NotAPublicationError, match="is not a directory"):
        write_report(tmp_path / "nowhere")


def test_a_publication_is_read_into_what_the_report_shows(published):
    root, manifest, _ = published
    pub = load_publication(root)
    assert pub.started_at == STARTED and pub.expectations == manifest["expectations"]
    # six attempts: five on the first pass (one cut off), p2's retry on the second
    assert {attempt: dict(row) for attempt, row in pub.finish.iterrows()} == {
        1: {"length": 1, "stop": 4}, 2: {"length": 0, "stop": 1}}
    assert pub.lengths.groupby("status").size().to_dict() == {"accepted": 4, "rejected": 1}  # p6 has no text
    assert [row["row_number"] for row in pub.accepted_sample] == [1, 2, 3, 5]
    assert [(row["item_id"], row["reasons"]) for row in pub.rejected_sample] == [
        ("p4", ["length", "must_not_match"]), ("p6", ["prompt_too_long"])]
    assert list(pub.chunks["tokens"]) == [37, 4]  # the kettle's chunk finished before the run started: reused


def test_a_manifest_that_is_not_batchgens_and_an_unreadable_table_are_named(published, tmp_path):
    root = tmp_path / "run"
    shutil.copytree(published[0], root)
    (root / "manifest.json").write_text('{"job": "someone else\'s"}', encoding="utf-8")
    with pytest.raises(NotAPublicationError, match=r"run/manifest\.json has no counts: not a batchgen manifest"):
        load_publication(root)
    shutil.copy(published[0] / "manifest.json", root / "manifest.json")
    (root / ATTEMPTS).write_bytes(b"not a parquet file")
    with pytest.raises(NotAPublicationError, match=r"run: cannot read the publication"):
        load_publication(root)


@pytest.mark.parametrize("row_input, expected", [
    ({"name": "Mug"}, "Mug"),
    ('{"name": 7}', "7"),  # an input whose columns change type is published as JSON text
    ("not json", None),
    ({"other": "Mug"}, None),
    (None, None),
])
def test_the_expected_keyword_is_the_row_inputs_keyword_column(row_input, expected):
    assert expected_keyword(row_input, "name") == expected
    assert expected_keyword(row_input, None) is None
