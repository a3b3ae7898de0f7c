"""A job's `expectations.gx` entries as Great Expectations' own expectations, built by GX's classes.

Below the job config: the job checks each entry with `gx_expectation` when it loads (a bad entry is
a job error), and the suite (`expectations/suite.py`) adds the same expectations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from great_expectations.expectations.expectation import (
    ColumnMapExpectation,
    ColumnPairMapExpectation,
    Expectation,
    MulticolumnMapExpectation,
)

if TYPE_CHECKING:
    from batchgen.job import GxExpectationSpec

# The columns of the table the suite validates, one row per output (expectations.validate.prepare_frame);
# keyword_present only when the job has a keyword column.
OUTPUT_COLUMNS = ("text", "finish_reason", "stop_reason", "n_output_tokens", "n_prompt_tokens",
                  "cumulative_logprob", "candidate", "attempt", "keyword_present")
_COLUMN_KWARGS = ("column", "column_A", "column_B")
PER_ROW = (ColumnMapExpectation, ColumnPairMapExpectation, MulticolumnMapExpectation)


def gx_expectation(entry: GxExpectationSpec) -> Expectation:
    """The GX expectation a job's `expectations.gx` entry names, built by GX's own class (its kwargs checked);
    ValueError naming the type or the kwarg when GX refuses it."""
    from great_expectations.exceptions import ExpectationNotFoundError
    from great_expectations.expectations.registry import get_expectation_impl

    try:
        cls = get_expectation_impl(entry.type)
    except ExpectationNotFoundError:
        raise ValueError(f"{entry.type!r} is not a Great Expectations expectation type (e.g. "
                         f"expect_column_values_to_match_regex)") from None
    if not issubclass(cls, PER_ROW):
        raise ValueError(f"{entry.type} judges the whole table, not each output; only column map expectations "
                         f"(expect_column_values_...) give each output a verdict")
    columns = [entry.kwargs[k] for k in _COLUMN_KWARGS if k in entry.kwargs] + list(entry.kwargs.get("column_list") or [])
    unknown = [c for c in columns if c not in OUTPUT_COLUMNS]
    if unknown:
        raise ValueError(f"{entry.type}: column {unknown[0]!r} is not an output column; the outputs have "
                         f"{', '.join(OUTPUT_COLUMNS)}")
    if "meta" in entry.kwargs:
        raise ValueError(f"{entry.type}: meta is set by batchgen (set id to name the expectation)")
    try:
        return cls(**entry.kwargs, meta={"batchgen_id": entry.name})
    except Exception as exc:  # GX's pydantic (v1) ValidationError, or its own InvalidExpectationConfigurationError
        errors = getattr(exc, "errors", None)
        if callable(errors) and errors():
            first = errors()[0]
            where = ".".join(str(part) for part in first.get("loc", ()))
            message = "not an argument of this expectation" if "extra" in first.get("type", "") else first["msg"]
            raise ValueError(f"{entry.type}: kwargs.{where}: {message}") from None
        raise ValueError(f"{entry.type}: {str(exc).splitlines()[0]}") from None
