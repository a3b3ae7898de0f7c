"""The GX suite built from the job: one expectation per configured check with the job's values, and the
custom checks' own rules."""

from __future__ import annotations

import pytest

from batchgen.job import ExpectationsSpec
from expectations.suite import build_suite, matches_json_schema
from tests.jobs import SPEC
from tests.sampling import SCHEMA


@pytest.fixture(autouse=True, scope="module")
def gx_context():
    """GX suites need an active context (validate_rows makes one; these tests build suites on their own)."""
    import great_expectations as gx

    return gx.get_context(mode="ephemeral")


@pytest.mark.parametrize(("text", "ok"), [
    ('{"name": "Mug", "price": 12}', True),
    ('{"name": "Mug", "price": 12, "tags": ["a"]}', True),
    ('{"name": "Mug", "price": "12"}', False),  # wrong type
    ('{"name": "Mug"}', False),  # required field missing
    ('{"name": "Mug", "pri', False),  # cut off: not JSON, fails rather than errors
    (None, False),
])
def test_json_schema_check(text, ok):
    assert matches_json_schema(text, SCHEMA) is ok


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
