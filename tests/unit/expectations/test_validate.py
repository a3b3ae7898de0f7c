"""Validation with the real Great Expectations suite built from the job's expectations."""

from __future__ import annotations

import contextlib
import threading

import pandas as pd
import pytest

from batchgen.job import ExpectationsSpec
from expectations.validate import validate_rows
from tests.jobs import SPEC

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


def test_merged_windows_read_like_one_validation_of_all_rows():
    """GX results of disjoint windows of one pass, merged: the counts of one validation of every row."""
    from batchgen.gx_results import merge_results

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
    from batchgen import gx_results

    rows = pd.DataFrame({"item_id": [f"i{n}" for n in range(30)], "candidate": 0, "attempt": 1,
                         "text": "short", "finish_reason": "stop"})
    one = validate_rows(rows, ExpectationsSpec(min_chars=20), None, suite_name="unit-outputs").result
    merged = gx_results.merge_results([one] * 50)  # 1,500 failing rows

    [outcome] = [o for o in merged["results"] if o["expectation_config"]["meta"].get("batchgen_id") == "length"]
    assert outcome["result"]["unexpected_count"] == 1500 and outcome["result"]["element_count"] == 1500
    assert len(outcome["result"]["unexpected_list"]) == gx_results.LISTED_ROWS
    assert len(outcome["result"]["partial_unexpected_list"]) == gx_results.PARTIAL_ROWS


def test_windows_folded_as_they_are_staged_give_the_merged_result_and_stay_bounded():
    """RunTotals fold a pass's results a window at a time (the publication sums the windows' totals): the same
    result as merging every window's at the end, and a run of many windows holds one bounded result per pass."""
    from batchgen.records import RunTotals
    from batchgen import gx_results

    windows = []
    for index in range(40):  # 30 rows each, the first 25 too short (two texts): 1,000 failing rows in all
        texts = ["a short one" if n % 3 == index % 3 else "short" for n in range(25)]
        texts += ["long enough to pass the check"] * 5
        rows = pd.DataFrame({"item_id": [f"w{index}-{n}" for n in range(30)], "candidate": 0, "attempt": 1,
                             "text": texts, "finish_reason": "stop"})
        windows.append(validate_rows(rows, ExpectationsSpec(min_chars=20), None, suite_name="unit-outputs").result)
    totals = RunTotals()
    for result in windows:
        totals = totals + RunTotals(validation=[[result]])

    [[folded]] = totals.validation
    assert gx_results.merge_results([folded]) == gx_results.merge_results(windows)
    [outcome] = [o for o in gx_results.merge_results([folded])["results"]
                 if o["expectation_config"]["meta"].get("batchgen_id") == "length"]
    assert outcome["result"]["element_count"] == 1200 and outcome["result"]["unexpected_count"] == 1000
    assert outcome["result"]["unexpected_percent"] == pytest.approx(100 * 1000 / 1200)
    assert {e["value"]: e["count"] for e in outcome["result"]["partial_unexpected_counts"]} == \
        {"short": sum(25 - len(range(i % 3, 25, 3)) for i in range(40)),
         "a short one": sum(len(range(i % 3, 25, 3)) for i in range(40))}
    for result in [r["result"] for r in folded["results"]]:
        for key in ("unexpected_list", "unexpected_index_list"):
            assert len(result.get(key) or []) <= gx_results.LISTED_ROWS
        for key in ("partial_unexpected_list", "partial_unexpected_index_list", "partial_unexpected_counts"):
            assert len(result.get(key) or []) <= gx_results.PARTIAL_ROWS


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


@pytest.mark.parametrize(("constraint", "value", "texts", "passed"), [
    ("regex", "(yes|no)", ["yes", "no!", "maybe"], [True, False, False]),
    ("choice", ["red", "green"], ["red", "Red", "green "], [True, False, False]),
    ("grammar", 'root ::= "(" [0-9]+ ")"', ["(12)", "(12", "12"], [True, False, False]),
])
def test_structured_outputs_are_checked_by_an_expectation_of_their_own(constraint, value, texts, passed):
    from batchgen.job import ExpectationsSpec
    from expectations.validate import validate_rows

    rows = pd.DataFrame({"item_id": list("abc"), "candidate": 0, "attempt": 1, "text": texts,
                         "finish_reason": "stop"})

    verdicts = validate_rows(rows, ExpectationsSpec(require_stop=False), None, "unit-structured",
                             structured=(constraint, value)).verdicts

    assert verdicts["passed"].tolist() == passed
    assert verdicts["failed"].tolist() == [[] if ok else [constraint] for ok in passed]


def test_the_published_result_is_gx_own_json_of_the_validation(monkeypatch):
    """validate_rows converts GX's result without GX's deep copy of it (result_as_json): the JSON must be what GX's
    own to_json_dict gives, for failing rows (lists of them) and passing ones alike."""
    import expectations.validate as validating

    compared, convert = [], validating.result_as_json

    def checked(result):
        ours = convert(result)
        assert ours == result.to_json_dict()
        compared.append(len(ours["results"]))
        return ours

    monkeypatch.setattr(validating, "result_as_json", checked)
    rows = pd.DataFrame({
        "item_id": list(CASES), "candidate": [0] * len(CASES), "attempt": [1] * len(CASES),
        "text": [c[0] for c in CASES.values()], "finish_reason": [c[1] for c in CASES.values()],
    })
    keywords = pd.Series({item: c[2] for item, c in CASES.items()}, dtype="string")
    validate_rows(rows, SPEC, keywords, suite_name="unit-json")
    good = rows[rows["item_id"] == "good"]
    validate_rows(good, SPEC, keywords, suite_name="unit-json")  # the same suite again: the context given back
    assert compared == [6, 6]


def test_validations_on_many_threads_share_contexts_one_at_a_time_with_the_same_verdicts(monkeypatch):
    """A GX context is lent to one validation at a time (GX's contexts are not shared between threads) and given
    back: windows validated on several threads at once get the verdicts one thread gives, and a fresh thread takes
    a context given back rather than making one."""
    from concurrent.futures import ThreadPoolExecutor

    import expectations.validate as validating

    rows = pd.DataFrame({
        "item_id": list(CASES), "candidate": [0] * len(CASES), "attempt": [1] * len(CASES),
        "text": [c[0] for c in CASES.values()], "finish_reason": [c[1] for c in CASES.values()],
    })
    keywords = pd.Series({item: c[2] for item, c in CASES.items()}, dtype="string")
    alone = validate_rows(rows, SPEC, keywords, suite_name="unit-threads").verdicts
    lent, made, lock = set(), [], threading.Lock()
    borrow = validating._suite_of.__wrapped__

    @contextlib.contextmanager
    def watched(*args):
        with contextlib.contextmanager(borrow)(*args) as (built, validator):
            with lock:
                assert id(built) not in lent, "one context lent to two validations at once"
                lent.add(id(built))
                made.append(id(built))
            try:
                yield built, validator
            finally:
                with lock:
                    lent.discard(id(built))

    monkeypatch.setattr(validating, "_suite_of", watched)
    with ThreadPoolExecutor(max_workers=3) as pool:
        together = list(pool.map(lambda _: validate_rows(rows, SPEC, keywords, suite_name="unit-threads").verdicts,
                                 range(6)))
    for verdicts in together:
        assert verdicts["passed"].tolist() == alone["passed"].tolist()
        assert [sorted(f) for f in verdicts["failed"]] == [sorted(f) for f in alone["failed"]]
    assert len(set(made)) <= 3  # at most one context per validation running at once, the others reused
    with ThreadPoolExecutor(max_workers=1) as fresh:  # a thread that never validated before
        fresh.submit(validate_rows, rows, SPEC, keywords, suite_name="unit-threads").result()
    assert made[-1] in made[:-1]  # it took a context given back


def test_an_expectation_gx_cannot_evaluate_stops_the_window_instead_of_passing_every_output(monkeypatch):
    """GX reports an expectation whose metric raised as failed with no unexpected rows; read row by row, every output
    would pass it. A job's own expectation comparing the text with a number, and the grammar check without its
    grammar engine, each stop validation naming the expectation and GX's reason."""
    from expectations import suite
    from expectations.validate import ExpectationError

    rows = pd.DataFrame({"item_id": list("abc"), "candidate": 0, "attempt": 1, "text": ["(12)", "(12", "12"],
                         "finish_reason": "stop"})
    spec = ExpectationsSpec(require_stop=False, gx=[
        {"type": "expect_column_value_lengths_to_be_between", "kwargs": {"column": "text", "min_value": 3}},
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "text", "min_value": 5}, "id": "big"},
    ])
    with pytest.raises(ExpectationError, match=r"^expectations\.gx\.1 \(big\): Great Expectations could not "
                                               r"evaluate expect_column_values_to_be_between on the outputs: \S"):
        validate_rows(rows, spec, None, "unit-unevaluable")

    def no_engine(grammar):
        raise RuntimeError("the grammar engine could not be loaded")

    monkeypatch.setattr(suite, "grammar_matcher", no_engine)
    with pytest.raises(ExpectationError, match="^the expectation grammar: .* the grammar engine could not be loaded$"):
        validate_rows(rows, ExpectationsSpec(require_stop=False), None, "unit-unevaluable-grammar",
                      structured=("grammar", 'root ::= "(" [0-9]+ ")"'))
    monkeypatch.undo()
    # the same suites judge rows again once they can be evaluated
    verdicts = validate_rows(rows, ExpectationsSpec(require_stop=False), None, "unit-unevaluable-grammar",
                             structured=("grammar", 'root ::= "(" [0-9]+ ")"')).verdicts
    assert verdicts["passed"].tolist() == [True, False, False]


def test_the_sample_output_checked_before_the_engine_holds_every_output_column():
    """expectations.check tries a job's own GX expectations on one sample output: an expectation on any output
    column a job may name evaluates there (a column missing from the sample would stop a valid job)."""
    from batchgen.gx_expectations import OUTPUT_COLUMNS
    from batchgen.job import job_from_dict
    from expectations.check import check_expectations
    from tests.jobs import job_with

    gx = [{"type": "expect_column_values_to_not_be_null", "id": f"has_{column}", "kwargs": {"column": column}}
          for column in OUTPUT_COLUMNS]
    check_expectations(job_from_dict(job_with(expectations={"gx": gx})))  # keyword_column is set: keyword_present


def test_a_jobs_own_suite_is_tried_on_the_sample_once_per_process_and_one_that_fails_every_time(monkeypatch):
    """`batchgen run` checks a job's GX expectations on the sample output before its flow starts, and the flow's
    check task does again in the same process: GX validates a suite that evaluated once, not twice; a suite it cannot
    evaluate stops the job every time it is checked."""
    import expectations.check as check
    import expectations.validate as validate
    from batchgen.job import job_from_dict
    from expectations.validate import ExpectationError
    from tests.jobs import job_with

    validated: list[str] = []
    real = validate.validate_rows

    def counted(rows, spec, keywords, name, **kwargs):
        validated.append(name)
        return real(rows, spec, keywords, name, **kwargs)

    monkeypatch.setattr(validate, "validate_rows", counted)
    monkeypatch.setattr(check, "_EVALUATED", set())
    not_null = [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "text"}}]
    job = job_with(expectations={"gx": not_null})
    check.check_expectations(job_from_dict(job))
    check.check_expectations(job_from_dict(job))
    check.check_expectations(job_from_dict({**job, "name": "the-same-suite"}))
    assert len(validated) == 1
    longer = [*not_null, {"type": "expect_column_value_lengths_to_be_between", "kwargs": {"column": "text",
                                                                                       "min_value": 1}}]
    check.check_expectations(job_from_dict(job_with(expectations={"gx": longer})))
    assert len(validated) == 2  # another suite: validated
    bad = [{"type": "expect_column_values_to_be_between", "kwargs": {"column": "text", "min_value": 5}}]
    for _ in range(2):
        with pytest.raises(ExpectationError, match=r"^expectations\.gx\.0: Great Expectations could not evaluate"):
            check.check_expectations(job_from_dict(job_with(expectations={"gx": bad})))
    assert len(validated) == 4
