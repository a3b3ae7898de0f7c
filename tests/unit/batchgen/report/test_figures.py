
"""The report's numbers (batchgen.report.figures): pass rates per pass and over all passes, throughput per chunk and
over the run."""

from __future__ import annotations

import pytest

from batchgen.report.figures import pass_rates, throughput, throughput_over_time
from batchgen.report.read import load_publication
from tests.unit.batchgen.report.publication import cells, table


def test_throughput_counts_only_chunks_finished_in_this_run(published):
    root, _, _ = published
    chunks = throughput(load_publication(root))
    assert list(chunks["seconds"]) == [10.0, 25.0]  # the reused chunk (before the start) is left out
    assert list(chunks["tokens"]) == [37, 4]
    assert list(chunks["tokens_per_second"]) == [37 / 8.0, 4 / 5.0]
    assert list(chunks["cumulative_tokens"]) == [37, 41]

def test_pass_rates_over_all_passes_are_weighted_by_rows(report):
    _, page = report
    lines = [cells(row) for row in table(page, "expectations").split("<tr>")[2:]]
    overall = {line[1]: line for line in lines if line[0] == "all passes (by rows)"}
    # first pass: 5 rows, 1 failed; retry 1: 1 row, 0 failed -> 5 of 6 rows (83.3%), not the mean of 80% and 100%
    assert overall["length"][3:] == ["6", "1", "83.3%"]

def test_throughput_curve_holds_the_run_tokens_for_one_chunk_or_many(report):
    root, _ = report
    rates = throughput_over_time(load_publication(root))
    area = float(((rates["end"] - rates["start"]) * rates["tokens_per_second"]).sum())
    assert area == pytest.approx(41)  # the tokens generated in this run (the reused chunk left out)
    assert rates["start"].min() == pytest.approx(2.0)  # the first chunk started 8 s before it finished at 10 s

    one = load_publication(root)
    one.chunks = one.chunks.iloc[:1]
    single = throughput_over_time(one)
    assert len(single) == 1 and single["tokens_per_second"].iloc[0] == pytest.approx(37 / 8.0)


def outcome(name: str | None, rows: int | None, failed: int | None, kind: str = "expect_column_values_to_x") -> dict:
    """One expectation's entry in a stored GX validation result."""
    return {"expectation_config": {"type": kind, "meta": {"batchgen_id": name} if name else {},
                                   "description": f"{name or kind} described"},
            "result": {"element_count": rows, "unexpected_count": failed}}


def test_pass_rates_of_hand_made_results_per_pass_and_over_all_passes():
    first = {"results": [outcome("length", 10, 2), outcome(None, 10, 0, "expect_gx_own"), outcome("keyword", None, None)]}
    retry = {"results": [outcome("length", 2, 1)]}

    lines = [(line["pass"], line["expectation"], line["rows"], line["failed"], line["pass_rate"])
             for line in pass_rates([first, retry])]

    assert lines == [
        ("first pass", "length", 10, 2, 0.8),
        ("first pass", "expect_gx_own", 10, 0, 1.0),  # an expectation without a batchgen id goes by its GX type
        ("first pass", "keyword", None, None, None),  # nothing evaluated: no rate, and left out of the totals
        ("retry 1", "length", 2, 1, 0.5),
        ("all passes (by rows)", "length", 12, 3, 0.75),
        ("all passes (by rows)", "expect_gx_own", 10, 0, 1.0),
    ]
    assert [line["pass"] for line in pass_rates([first])] == ["first pass"] * 3  # one pass: no totals
    assert pass_rates([first])[1]["description"] == "expect_gx_own described"
