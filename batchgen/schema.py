"""Explicit Arrow schemas of everything batchgen writes."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

ATTEMPT_SCHEMA = pa.schema([
    ("item_id", pa.string()),
    ("candidate", pa.int32()),
    ("attempt", pa.int32()),
    ("strategy", pa.string()),
    ("request_key", pa.string()),
    ("request_id", pa.string()),
    ("prompt", pa.string()),
    ("prompt_token_ids", pa.list_(pa.int32())),
    ("n_prompt_tokens", pa.int32()),
    ("text", pa.string()),
    ("token_ids", pa.list_(pa.int32())),
    ("n_output_tokens", pa.int32()),
    ("new_output_tokens", pa.int32()),
    ("cumulative_logprob", pa.float64()),
    ("finish_reason", pa.string()),
    ("stop_reason", pa.string()),
    ("max_tokens", pa.int32()),
    ("chunk_seconds", pa.float64()),
])

VERDICT_FIELDS = [("passed", pa.bool_()), ("failed", pa.list_(pa.string()))]


def input_type(inputs: list[dict[str, Any] | None]) -> pa.DataType:
    """The struct type of the input columns, as Arrow infers it from the rows (JSON text if there are none)."""
    present = [row for row in inputs if row]
    if not present:
        return pa.string()
    return pa.struct(list(pa.Table.from_pylist(present).schema))


def accepted_schema(input_struct: pa.DataType) -> pa.Schema:
    return pa.schema([
        ("item_id", pa.string()),
        ("row_number", pa.int64()),
        ("candidate", pa.int32()),
        ("attempt", pa.int32()),
        ("strategy", pa.string()),
        ("text", pa.string()),
        ("finish_reason", pa.string()),
        ("n_prompt_tokens", pa.int32()),
        ("n_output_tokens", pa.int32()),
        ("cumulative_logprob", pa.float64()),
        ("max_tokens", pa.int32()),
        ("request_id", pa.string()),
        ("prompt", pa.string()),
        ("input", input_struct),
    ])


def rejected_schema(input_struct: pa.DataType) -> pa.Schema:
    return pa.schema([
        ("item_id", pa.string()),
        ("row_number", pa.int64()),
        ("stage", pa.string()),
        ("reasons", pa.list_(pa.string())),
        ("detail", pa.string()),
        ("candidate", pa.int32()),
        ("attempt", pa.int32()),
        ("text", pa.string()),
        ("finish_reason", pa.string()),
        ("n_output_tokens", pa.int32()),
        ("input", input_struct),
    ])


def attempts_schema() -> pa.Schema:
    schema = ATTEMPT_SCHEMA
    for name, kind in VERDICT_FIELDS:
        schema = schema.append(pa.field(name, kind))
    return schema
