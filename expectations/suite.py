"""The GX suite a job's outputs are validated against, built from the job's expectations.

Every expectation carries `meta.batchgen_id`: the short name that appears in a rejected
row's reasons (`length`, `keyword`, `must_match`, `must_not_match`, `truncated`).
"""

from __future__ import annotations

import great_expectations as gx
import great_expectations.expectations as gxe

from batchgen.job import ExpectationsSpec


class ExpectOutputToMentionKeyword(gxe.ExpectColumnValuesToBeInSet):
    """Each output mentions its item's keyword (the job's keyword column, case-insensitive)."""

    column: str = "keyword_present"
    value_set: list = [True]
    description: str = "Each output mentions its item's keyword (case-insensitive)"


class ExpectOutputNotTruncated(gxe.ExpectColumnValuesToBeInSet):
    """Each output ended on its own (finish_reason `stop`), not by hitting max_tokens."""

    column: str = "finish_reason"
    value_set: list = ["stop"]
    description: str = "Each output ended on its own (finish_reason stop), not cut off by max_tokens"


def build_suite(spec: ExpectationsSpec, name: str) -> gx.ExpectationSuite:
    """A suite over the columns of a generation table: text, finish_reason and derived checks."""
    suite = gx.ExpectationSuite(name=name)
    if spec.min_chars is not None or spec.max_chars is not None:
        suite.add_expectation(gxe.ExpectColumnValueLengthsToBeBetween(
            column="text", min_value=spec.min_chars, max_value=spec.max_chars,
            meta={"batchgen_id": "length"},
            description=f"Output length between {spec.min_chars or 0} and {spec.max_chars or 'any'} characters",
        ))
    if spec.keyword_column:
        suite.add_expectation(ExpectOutputToMentionKeyword(meta={"batchgen_id": "keyword"}))
    for pattern in spec.must_match:
        suite.add_expectation(gxe.ExpectColumnValuesToMatchRegex(
            column="text", regex=pattern, meta={"batchgen_id": "must_match"},
            description=f"Output matches {pattern}",
        ))
    for pattern in spec.must_not_match:
        suite.add_expectation(gxe.ExpectColumnValuesToNotMatchRegex(
            column="text", regex=pattern, meta={"batchgen_id": "must_not_match"},
            description=f"Output does not match {pattern}",
        ))
    if spec.require_stop:
        suite.add_expectation(ExpectOutputNotTruncated(meta={"batchgen_id": "truncated"}))
    return suite
