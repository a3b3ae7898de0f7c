"""Validation with the real Great Expectations suite built from the job's expectations."""

from __future__ import annotations

import pandas as pd
import pytest

from batchgen.job import ExpectationsSpec
from expectations.suite import build_suite
from expectations.validate import validate_rows

SPEC = ExpectationsSpec(
    min_chars=20, max_chars=120, keyword_column="name",
    must_match=[r"[.!。]$"],  # ends a sentence
    must_not_match=[r"https?://", r"(?i)\bbuy now\b"],
    require_stop=True,
)

# item_id -> (text, finish_reason, keyword, expected failures)
CASES = {
    "good": ("The Aurora Mug keeps coffee hot for hours.", "stop", "aurora mug", set()),
    "too-short": ("Aurora Mug.", "stop", "Aurora Mug", {"length"}),
    "too-long": ("The Aurora Mug " + "is lovely " * 12 + "indeed.", "stop", "Aurora Mug", {"length"}),
    "no-keyword": ("A lovely mug that keeps coffee hot all day.", "stop", "Aurora Mug", {"keyword"}),
    "no-period": ("The Aurora Mug keeps coffee hot for hours", "stop", "Aurora Mug", {"must_match"}),
    "spam": ("The Aurora Mug, see https://spam.example now.", "stop", "Aurora Mug", {"must_not_match"}),
    "spam-2": ("Buy now: the Aurora Mug keeps coffee hot!", "stop", "Aurora Mug", {"must_not_match"}),
    "cut": ("The Aurora Mug keeps coffee hot for hours and", "length", "Aurora Mug", {"must_match", "truncated"}),
    "all-bad": ("buy now", "length", "Aurora Mug",
                {"length", "keyword", "must_match", "must_not_match", "truncated"}),
    "中文": ("星辰保温杯，一键研磨，学生的好选择，保温一整天。", "stop", "星辰保温杯", set()),
}


@pytest.fixture(scope="module")
def validation():
    rows = pd.DataFrame({
        "item_id": list(CASES),
        "candidate": [0] * len(CASES),
        "attempt": [1] * len(CASES),
        "text": [c[0] for c in CASES.values()],
        "finish_reason": [c[1] for c in CASES.values()],
    })
    keywords = pd.Series({item: c[2] for item, c in CASES.items()}, dtype="string")
    return validate_rows(rows, SPEC, keywords, suite_name="unit-outputs")


@pytest.mark.parametrize("item_id", list(CASES))
def test_each_row_fails_exactly_its_expectations(validation, item_id):
    verdicts = validation.verdicts.set_index("row_key")
    key = f"{item_id}#0#1"
    assert set(verdicts.at[key, "failed"]) == CASES[item_id][3]
    assert len(verdicts.at[key, "failed"]) == len(CASES[item_id][3])  # no id listed twice
    assert bool(verdicts.at[key, "passed"]) is (not CASES[item_id][3])


def test_every_row_gets_one_verdict(validation):
    assert sorted(validation.verdicts["row_key"]) == sorted(f"{i}#0#1" for i in CASES)


def test_result_and_statistics_are_gx_results(validation):
    assert validation.result["success"] is False
    stats = validation.statistics
    assert stats["evaluated_expectations"] == 6  # length, keyword, must_match, 2 x must_not_match, truncated
    assert stats["successful_expectations"] == 0
    ids = sorted(r["expectation_config"]["meta"]["batchgen_id"] for r in validation.result["results"])
    assert ids == ["keyword", "length", "must_match", "must_not_match", "must_not_match", "truncated"]


def test_candidates_and_attempts_of_one_item_are_judged_separately():
    rows = pd.DataFrame({
        "item_id": ["p1", "p1", "p1"],
        "candidate": [0, 1, 0],
        "attempt": [1, 1, 2],
        "text": ["short", "A long enough output.", "Another long enough output."],
        "finish_reason": ["length", "stop", "stop"],
    })
    spec = ExpectationsSpec(min_chars=10)

    verdicts = validate_rows(rows, spec, None, "unit-candidates").verdicts.set_index("row_key")

    assert set(verdicts.loc["p1#0#1", "failed"]) == {"length", "truncated"}
    assert list(verdicts.loc["p1#1#1", "failed"]) == []
    assert list(verdicts.loc["p1#0#2", "failed"]) == []


def test_keyword_check_is_case_insensitive_and_per_item():
    rows = pd.DataFrame({
        "item_id": ["a", "b"], "candidate": [0, 0], "attempt": [1, 1],
        "text": ["THE AURORA MUG, hot.", "The Aurora Mug, hot."], "finish_reason": ["stop", "stop"],
    })
    keywords = pd.Series(["aurora mug", "Trail Boots"], index=["a", "b"], dtype="string")
    verdicts = validate_rows(rows, ExpectationsSpec(keyword_column="name", require_stop=False), keywords,
                             "unit-keywords").verdicts.set_index("row_key")
    assert list(verdicts.loc["a#0#1", "failed"]) == []
    assert list(verdicts.loc["b#0#1", "failed"]) == ["keyword"]


def test_missing_keyword_fails_the_keyword_check():
    # The flow builds keywords with .astype("string"): an empty keyword cell is pd.NA.
    rows = pd.DataFrame({
        "item_id": ["a", "b"], "candidate": [0, 0], "attempt": [1, 1],
        "text": ["The Aurora Mug, hot.", "Something."], "finish_reason": ["stop", "stop"],
    })
    keywords = pd.Series(["Aurora Mug", pd.NA], index=["a", "b"], dtype="string")

    verdicts = validate_rows(rows, ExpectationsSpec(keyword_column="name"), keywords,
                             "unit-missing-keyword").verdicts.set_index("row_key")

    assert list(verdicts.loc["a#0#1", "failed"]) == []
    assert list(verdicts.loc["b#0#1", "failed"]) == ["keyword"]


def test_no_expectations_means_every_row_passes():
    rows = pd.DataFrame({"item_id": ["a"], "candidate": [0], "attempt": [1], "text": [""],
                         "finish_reason": ["length"]})
    validation = validate_rows(rows, ExpectationsSpec(require_stop=False), None, "unit-empty")
    assert validation.verdicts.to_dict(orient="list") == {"row_key": ["a#0#1"], "passed": [True], "failed": [[]]}


# ---------------------------------------------------------------- the suite

@pytest.mark.parametrize(("spec", "expected"), [
    (ExpectationsSpec(), ["truncated"]),
    (ExpectationsSpec(require_stop=False), []),
    (ExpectationsSpec(min_chars=5, require_stop=False), ["length"]),
    (ExpectationsSpec(max_chars=50, require_stop=False), ["length"]),
    (SPEC, ["length", "keyword", "must_match", "must_not_match", "must_not_match", "truncated"]),
])
def test_suite_has_one_expectation_per_configured_check(spec, expected):
    suite = build_suite(spec, "unit-suite")
    assert [e.meta["batchgen_id"] for e in suite.expectations] == expected


def test_suite_expectations_carry_the_job_values():
    suite = build_suite(SPEC, "unit-suite-values")
    by_id: dict[str, list] = {}
    for expectation in suite.expectations:
        by_id.setdefault(expectation.meta["batchgen_id"], []).append(expectation)
    [length] = by_id["length"]
    assert (length.column, length.min_value, length.max_value) == ("text", 20, 120)
    assert [e.regex for e in by_id["must_match"]] == [r"[.!。]$"]
    assert [e.regex for e in by_id["must_not_match"]] == [r"https?://", r"(?i)\bbuy now\b"]
    [truncated] = by_id["truncated"]
    assert (truncated.column, list(truncated.value_set)) == ("finish_reason", ["stop"])
    [keyword] = by_id["keyword"]
    assert (keyword.column, list(keyword.value_set)) == ("keyword_present", [True])


def test_merged_windows_read_like_one_validation_of_all_rows():
    """GX results of disjoint windows of one pass, merged: the counts of one validation of every row."""
    from expectations.validate import merge_results

    rows = pd.DataFrame({
        "item_id": list(CASES), "candidate": [0] * len(CASES), "attempt": [1] * len(CASES),
        "text": [c[0] for c in CASES.values()], "finish_reason": [c[1] for c in CASES.values()],
    })
    keywords = pd.Series({item: c[2] for item, c in CASES.items()}, dtype="string")
    whole = validate_rows(rows, SPEC, keywords, suite_name="unit-outputs").result
    parts = [validate_rows(rows.iloc[a:b], SPEC, keywords, suite_name="unit-outputs").result
             for a, b in [(0, 3), (3, 7), (7, len(CASES))]]

    merged = merge_results(parts)

    def figures(result):
        return [(o["expectation_config"]["type"], o["success"], o["result"]["element_count"],
                 o["result"]["unexpected_count"], round(o["result"]["unexpected_percent"], 6),
                 sorted(map(str, o["result"]["unexpected_list"]))) for o in result["results"]]

    assert figures(merged) == figures(whole)
    assert merged["success"] == whole["success"] is False
    assert {k: merged["statistics"][k] for k in ("evaluated_expectations", "successful_expectations")} == \
        {k: whole["statistics"][k] for k in ("evaluated_expectations", "successful_expectations")}
    assert merge_results([]) == {"success": True, "results": [], "statistics": {}}


def test_merged_results_list_a_bounded_number_of_failing_rows():
    from expectations import validate

    rows = pd.DataFrame({"item_id": [f"i{n}" for n in range(30)], "candidate": 0, "attempt": 1,
                         "text": "short", "finish_reason": "stop"})
    one = validate_rows(rows, ExpectationsSpec(min_chars=20), None, suite_name="unit-outputs").result
    merged = validate.merge_results([one] * 50)  # 1,500 failing rows

    [outcome] = [o for o in merged["results"] if o["expectation_config"]["meta"].get("batchgen_id") == "length"]
    assert outcome["result"]["unexpected_count"] == 1500 and outcome["result"]["element_count"] == 1500
    assert len(outcome["result"]["unexpected_list"]) == validate.LISTED_ROWS
    assert len(outcome["result"]["partial_unexpected_list"]) == validate.PARTIAL_ROWS


@pytest.mark.parametrize("spec", [
    ExpectationsSpec(),
    ExpectationsSpec(min_chars=1, keyword_column="name", must_match=["a", "b"], must_not_match=["c"]),
    ExpectationsSpec(max_chars=9, require_stop=False),
])
@pytest.mark.parametrize("schema", [None, {"type": "object"}])
def test_the_ids_retry_on_may_name_are_the_suites_own(spec, schema):
    from expectations.suite import build_suite

    suite_ids = {e.meta["batchgen_id"] for e in build_suite(spec, "s", schema).expectations}
    assert set(spec.ids("json_schema" if schema else None)) == suite_ids


def test_gx_expectations_of_the_job_judge_each_output_under_their_id():
    spec = ExpectationsSpec(require_stop=False, gx=[
        {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "text", "regex": "^[A-Z]"},
         "id": "capitalised"},
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "n_output_tokens", "max_value": 5}},
    ])
    rows = pd.DataFrame({"item_id": ["a", "b", "c"], "candidate": 0, "attempt": 1, "finish_reason": "stop",
                         "text": ["Fine.", "lower case", "Long one"], "n_output_tokens": [2, 3, 9]})

    validation = validate_rows(rows, spec, None, "unit-gx")

    assert validation.verdicts["failed"].tolist() == [
        [], ["capitalised"], ["expect_column_values_to_be_between"]]
    assert set(spec.ids()) == {"capitalised", "expect_column_values_to_be_between"}
    types = [r["expectation_config"]["type"] for r in validation.result["results"]]
    assert types == ["expect_column_values_to_match_regex", "expect_column_values_to_be_between"]


@pytest.mark.parametrize(("entry", "message"), [
    ({"type": "expect_nothing"}, "expectations.gx.0: 'expect_nothing' is not a Great Expectations expectation type"),
    ({"type": "expect_column_values_to_match_regex", "kwargs": {"column": "text", "regexx": "a"}},
     "expectations.gx.0: expect_column_values_to_match_regex: kwargs.regexx: not an argument of this expectation"),
    ({"type": "expect_column_values_to_match_regex", "kwargs": {"column": "txt", "regex": "a"}},
     "column 'txt' is not an output column; the outputs have text, finish_reason"),
    ({"type": "expect_column_mean_to_be_between", "kwargs": {"column": "n_output_tokens"}},
     "judges the whole table, not each output"),
    ({"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "text"}, "id": "length"},
     "id 'length' is a built-in expectation's"),
])
def test_a_gx_expectation_gx_refuses_is_a_job_error_naming_it(tmp_path, entry, message):
    from batchgen.job import JobError, job_from_dict
    from tests.unit.test_job import job_with

    with pytest.raises(JobError) as err:
        job_from_dict(job_with(expectations={"gx": [entry]}), base_dir=tmp_path)
    assert message in str(err.value)


def test_retry_on_may_name_a_gx_expectation(tmp_path):
    from batchgen.job import job_from_dict
    from tests.unit.test_job import job_with

    job = job_from_dict(job_with(expectations={"gx": [{"type": "expect_column_values_to_match_regex", "id": "caps",
                                                       "kwargs": {"column": "text", "regex": "^[A-Z]"}}]},
                                 retry={"on": ["truncated", "caps"]}), base_dir=tmp_path)
    assert job.retry.on == ["truncated", "caps"]
