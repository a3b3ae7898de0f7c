"""The GX suite a job's outputs are validated against, built from the job's expectations.

Every expectation carries `meta.batchgen_id`: the short name that appears in a rejected
row's reasons (`length`, `keyword`, `must_match`, `must_not_match`, `truncated`, and the structured
output constraint's: `json_schema`, `regex`, `choice`, `grammar`).
"""

from __future__ import annotations

import json
from typing import Any

import great_expectations as gx
import great_expectations.expectations as gxe
import jsonschema
from great_expectations.execution_engine import PandasExecutionEngine
from great_expectations.expectations.expectation import ColumnMapExpectation
from great_expectations.expectations.metrics import ColumnMapMetricProvider, column_condition_partial

from batchgen.gx_expectations import gx_expectation
from batchgen.job import ExpectationsSpec


def matches_json_schema(text: Any, schema: dict[str, Any]) -> bool:
    """The text parses as JSON and the value is valid under the schema (text that is not JSON fails, not errors)."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return False
    return jsonschema.Draft202012Validator(schema).is_valid(value)


class ColumnValuesParseAsJsonMatchingSchema(ColumnMapMetricProvider):
    """GX's own match_json_schema metric raises on text that is not JSON; a cut-off output must just fail."""

    condition_metric_name = "column_values.batchgen_parse_as_json_matching_schema"
    condition_value_keys = ("json_schema",)

    @column_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column, json_schema, **kwargs):
        return column.map(lambda text: matches_json_schema(text, json_schema))


class ExpectOutputToMatchJsonSchema(gxe.ExpectColumnValuesToMatchJsonSchema):
    """Each output is JSON that is valid under the job's schema (sampling.json_schema)."""

    column: str = "text"
    map_metric = "column_values.batchgen_parse_as_json_matching_schema"
    description: str = "Each output is JSON valid under the job's JSON schema"


def grammar_matcher(grammar: str) -> Any:
    """An xgrammar matcher of strings (the grammar engine vLLM's structured outputs use); no tokenizer needed."""
    import xgrammar

    compiled = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo([]), cache_enabled=False).compile_grammar(grammar)
    return compiled


def matches_grammar(text: Any, compiled: Any) -> bool:
    """The whole text is a sentence of the grammar."""
    import xgrammar

    if not isinstance(text, str):
        return False
    matcher = xgrammar.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return bool(matcher.accept_string(text)) and matcher.is_terminated()


class ColumnValuesMatchGrammar(ColumnMapMetricProvider):
    condition_metric_name = "column_values.batchgen_match_grammar"
    condition_value_keys = ("grammar",)

    @column_condition_partial(engine=PandasExecutionEngine)
    def _pandas(cls, column, grammar, **kwargs):
        compiled = grammar_matcher(grammar)
        return column.map(lambda text: matches_grammar(text, compiled))


class ExpectOutputToMatchGrammar(ColumnMapExpectation):
    """Each output is a sentence of the job's grammar (sampling.grammar, EBNF as xgrammar reads it)."""

    grammar: str
    column: str = "text"
    map_metric = "column_values.batchgen_match_grammar"
    success_keys = ("grammar", "mostly")
    description: str = "Each output follows the job's grammar"


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


def structured_expectation(constraint: str, value: Any) -> gxe.Expectation:
    """The expectation that checks a structured output constraint (sampling.json_schema, regex, choice, grammar)."""
    meta = {"batchgen_id": constraint}
    if constraint == "json_schema":
        return ExpectOutputToMatchJsonSchema(json_schema=value, meta=meta)
    if constraint == "regex":  # vLLM constrains the whole output to the regex
        return gxe.ExpectColumnValuesToMatchRegex(column="text", regex=f"^(?:{value})$", meta=meta,
                                                  description=f"Each output matches {value} as a whole")
    if constraint == "choice":
        return gxe.ExpectColumnValuesToBeInSet(column="text", value_set=list(value), meta=meta,
                                               description=f"Each output is one of {', '.join(map(repr, value))}")
    if constraint == "grammar":
        return ExpectOutputToMatchGrammar(grammar=value, meta=meta)
    raise ValueError(f"unknown structured output constraint {constraint!r}")


def build_suite(spec: ExpectationsSpec, name: str, json_schema: dict[str, Any] | None = None,
                structured: tuple[str, Any] | None = None) -> gx.ExpectationSuite:
    """A suite over the columns of a generation table: text, finish_reason and derived checks; `structured` is
    the job's structured output constraint (`json_schema` is the same as ("json_schema", schema))."""
    suite = gx.ExpectationSuite(name=name)
    if structured is None and json_schema is not None:
        structured = ("json_schema", json_schema)
    if structured is not None:
        suite.add_expectation(structured_expectation(*structured))
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
    for entry in spec.gx:
        suite.add_expectation(gx_expectation(entry))
    return suite
