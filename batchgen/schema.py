"""The published tables' Arrow schemas: the records' columns (batchgen.records) with the input's own columns
flat, and how an input row is encoded for them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from batchgen.records import ACCEPTED_BASE_SCHEMA, OPTIONAL_RESULT_SCHEMA, REJECTED_SCHEMA


def frame_input_codec(items: Any, columns: list[str], more: list[dict[str, Any] | None]) -> tuple[
        pa.DataType, InputCodec]:
    """The struct type of the input columns of an items table (`columns` of every row) and of a few more rows
    (rejections: dicts), read column by column, and how to encode one row's input for it.

    A column whose values Arrow cannot give one type (JSONL rows holding a number in one row and text in the
    next, say) is kept as JSON text, so publishing never fails on a column the prompt may not even use."""
    present = [row for row in more if row]
    names: list[str] = list(columns) if len(items) else []
    for row in present:
        names.extend(name for name in row if name not in names)

    def values(name: str) -> list[Any]:
        own = items[name].tolist() if len(items) and name in items.columns else [None] * len(items)
        return own + [row.get(name) for row in present]

    return _codec(names, values)


def _codec(names: list[str], values: Callable[[str], list[Any]]) -> tuple[pa.DataType, InputCodec]:
    if not names:  # no input columns: nothing is encoded (frame_tables adds none)
        return pa.string(), InputCodec([], frozenset())
    fields, as_json = [], set()
    for name in names:
        try:
            kind = pa.array(values(name)).type
            if _has_empty_struct(kind):  # Parquet cannot store a struct without fields
                raise pa.ArrowInvalid("empty struct")
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
            kind = pa.string()
            as_json.add(name)
        fields.append(pa.field(name, kind))
    return pa.struct(fields), InputCodec(names, frozenset(as_json))


class InputCodec:
    """One row's input (a dict of the input's columns, or None) as the input struct holds it: each of `names`, the
    columns in `as_json` as JSON text. `columns` does the same for many rows at once, a list per column."""

    def __init__(self, names: list[str], as_json: frozenset[str]):
        self.names, self.as_json = list(names), as_json

    def __call__(self, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if not value:
            return None
        return {name: self._json(value.get(name)) if name in self.as_json else value.get(name) for name in self.names}

    def columns(self, values: list[dict[str, Any] | None], names: list[str]) -> dict[str, list[Any]]:
        """{name: that column's value in each row} for `names` (of `self.names`): what __call__ gives row by row,
        without a dict per row (a window's 2,000 rows: the published tables are built from these lists)."""
        out = {}
        for name in names:
            column = [row.get(name) if row else None for row in values]
            out[name] = [self._json(value) for value in column] if name in self.as_json else column
        return out

    @staticmethod
    def _json(value: Any) -> Any:
        return None if value is None else json.dumps(value, ensure_ascii=False, default=str)


def _has_empty_struct(kind: pa.DataType) -> bool:
    if pa.types.is_struct(kind):
        return kind.num_fields == 0 or any(_has_empty_struct(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _has_empty_struct(kind.value_type)
    return False


# Result columns a job may add: candidates and selection with n > 1, logprobs when asked.
OPTIONAL_RESULT_FIELDS = {f.name: f.type for f in OPTIONAL_RESULT_SCHEMA}


INPUT_PREFIX = "input_"  # an input column named like an output column is published as input_<name>
INPUT_COLUMN_KEY = b"batchgen.input_column"  # field metadata of a published input column: its name in the input


def output_names(extra: Any = ()) -> set[str]:
    """Every column name batchgen itself publishes in the accepted and rejected tables (plus `extra`, e.g. the
    structured-output fields of a job): the names an input column may not keep."""
    base = set(ACCEPTED_BASE_SCHEMA.names) | set(REJECTED_SCHEMA.names)
    return base | set(OPTIONAL_RESULT_FIELDS) | set(extra)


def published_input_names(names: list[str], taken: set[str]) -> dict[str, str]:
    """{input column: its published name}: its own name, or, where that is one of `taken` (batchgen's columns),
    `input_<name>` (prefixed again until no other column has it). An input's own `input_text` keeps its name."""
    used = set(taken) | {name for name in names if name not in taken}
    out = {}
    for name in names:
        if name not in taken:
            out[name] = name
            continue
        published = INPUT_PREFIX + name
        while published in used:
            published = INPUT_PREFIX + published
        used.add(published)
        out[name] = published
    return out


def input_fields(input_struct: Any, renamed: dict[str, str] | None = None) -> list[pa.Field]:
    """The flat columns of the input struct: those in `renamed`, under their published names (all, under their
    own, without it), each with its input name in its metadata (INPUT_COLUMN_KEY); none if it is not a struct
    (a run whose rows were all unreadable). A list of fields is taken as it is."""
    if isinstance(input_struct, list):
        return input_struct
    if not pa.types.is_struct(input_struct):
        return []
    renamed = renamed if renamed is not None else {f.name: f.name for f in input_struct}
    return [pa.field(renamed[f.name], f.type, metadata={INPUT_COLUMN_KEY: f.name})
            for f in input_struct if f.name in renamed]


def accepted_schema(inputs: Any, frame: Any = None) -> pa.Schema:
    """The accepted table: batchgen's columns, the input's own columns flat (`inputs`: their fields, or the input
    struct), then columns of `frame` beyond the fixed ones (candidates, logprobs, structured-output fields).

    Structured-output fields hold scalars (objects and arrays as JSON text), so Arrow's type of their values is
    the column type.
    """
    schema = pa.schema([*ACCEPTED_BASE_SCHEMA, *input_fields(inputs)])
    if frame is not None:
        for name in frame.columns:
            if name in schema.names or name == "input":
                continue
            if name in OPTIONAL_RESULT_FIELDS:
                schema = schema.append(pa.field(name, OPTIONAL_RESULT_FIELDS[name]))
            else:
                values = [None if _missing(v) else v for v in frame[name]]
                kind = pa.array(values).type
                schema = schema.append(pa.field(name, pa.string() if pa.types.is_null(kind) else kind))
    return schema


def _missing(value: Any) -> bool:
    try:
        return value is None or bool(value != value)  # None or NaN
    except (TypeError, ValueError):
        return False


def rejected_schema(inputs: Any) -> pa.Schema:
    """The rejected table: batchgen's columns, then the input's own columns flat (as in `accepted_schema`)."""
    return pa.schema([*REJECTED_SCHEMA, *input_fields(inputs)])
