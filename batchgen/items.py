"""Loading the input table into items with stable ids.

The input is one file or several (a folder or glob of Parquet files, a datasets save_to_disk folder, a
URL: batchgen.sources), read as it is parsed, so `input.limit` stops reading early. Rows are numbered
across the files in order, from 1.

Rules, per case (errors are data, see docs/nothing-lost.md):
- a file that cannot be read as a table at all (missing, a directory, empty, not UTF-8,
  a CSV whose rows do not line up) raises DataError naming the file and the line;
- a JSONL line that is not a JSON object becomes a rejected item (`invalid_json`), the
  rest of the file is used;
- a row with no id, or an id (or, without an id column, a content) seen on an earlier
  row, becomes a rejected item (`missing_id`, `duplicate_id`, `duplicate_item`);
- an id that is not text or a whole number (a list, an object, bytes, true/false, 2.5)
  becomes a rejected item (`bad_id`); a Parquet id column whose type can hold no valid id
  (list, struct, map, binary, boolean) raises DataError before any row is read.
"""

from __future__ import annotations

import csv
import errno
import hashlib
import json
import math
import os
import re
from array import array
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from batchgen.job import InputSpec
from batchgen.records import Rejection
from batchgen.sources import FORMATS, SAVED, InputFile, SourceError, resolve

RESERVED_COLUMNS = ("item_id", "row_number")


class DataError(ValueError):
    """Input data that cannot be read. The message names the file and, where known, the row and field."""


@dataclass
class LoadedItems:
    items: pd.DataFrame  # item_id, row_number, then the input columns
    rejected: list[Rejection] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)


def input_files(spec: InputSpec) -> tuple[list[InputFile], str]:
    """The files of the input, in reading order, and their format; DataError naming the path if there are none."""
    path = Path(spec.path)
    if "://" not in spec.path and not (set("*?[") & set(spec.path)) and not path.is_dir():
        _check_file(path)
    try:
        files, fmt = resolve(spec.path, spec.format)
    except SourceError as exc:
        raise DataError(str(exc)) from None
    if fmt is None:
        suffix = Path(str(files[0])).suffix.lower()
        raise DataError(
            f"{spec.path}: cannot tell the format from the suffix {suffix or '(none)'!r}; "
            f"set input.format to one of {', '.join(FORMATS)}"
        )
    if len(files) > 1 or "://" in spec.path:
        for file in files:
            if file.local:
                _check_file(Path(file.path))
    return files, fmt


def content_id(row: dict[str, Any]) -> str:
    """A stable id from the row's values: same content, same id, on every machine."""
    canonical = json.dumps(row, sort_keys=True, ensure_ascii=False, default=str)
    return "h" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:15]


def _check_file(path: Path) -> None:
    if not path.exists():
        if path.is_symlink():
            try:
                path.stat()
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise DataError(f"{path}: the input is a symbolic link that loops back on itself") from None
            raise DataError(f"{path}: the input is a symbolic link to {os.readlink(path)}, which does not exist")
        raise DataError(f"{path}: input file not found")
    if path.stat().st_size == 0:
        raise DataError(f"{path}: input file is empty")


def _read_text(path: InputFile) -> str:
    try:
        with path.open_binary() as handle:
            raw = handle.read()
    except OSError as exc:  # unreadable for this user, a folder in the way, a device error
        raise DataError(f"{path}: the input cannot be read: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8-sig")  # a byte-order mark is accepted and dropped
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(f"{path}: line {line}: not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None


class _Columns:
    """Rows read so far, a list per column (a dict per row cost 5x the memory), and each row's number: its place
    among the input's data rows, from 1 (a CSV header, blank lines and, for JSONL, nothing else is skipped)."""

    SHARED_UP_TO = 65536  # distinct values per column kept once; a column with more is mostly unique

    def __init__(self, names: list[str] | None = None):
        self.names: list[str] = list(names or [])
        self.data: dict[str, list[Any]] = {name: [] for name in self.names}
        self.numbers = array("q")  # 8 bytes a row, not a Python int
        # A CSV cell is a new str even when its text repeats (a category, a feature): one object per distinct
        # text instead (1M example rows: 625 -> 490 MB peak RSS).
        self._shared: list[dict[str, str] | None] = [{} for _ in self.names]
        self.seen = 0  # data rows read, those rejected as unreadable included

    def extend(self, more: _Columns, offset: int) -> None:
        """Append the rows of another file, numbered after this one's `offset` rows."""
        count = len(self)
        for name in more.names:
            if name not in self.data:  # a column only later files have: empty on the rows before
                self.names.append(name)
                self.data[name] = [None] * count
        for name, column in self.data.items():
            column.extend(more.data[name] if name in more.data else [None] * len(more))
        self.numbers.extend(array("q", (number + offset for number in more.numbers)))

    def add_values(self, values: list[str | None], number: int) -> None:
        for k, (column, value, shared) in enumerate(zip(self.data.values(), values, self._shared)):
            if shared is not None and value is not None:
                value = shared.setdefault(value, value)
                if len(shared) > self.SHARED_UP_TO:
                    self._shared[k] = None
            column.append(value)
        self.numbers.append(number)

    def add_row(self, row: dict[str, Any], number: int) -> None:
        count = len(self.numbers)
        for name in row:
            if name not in self.data:  # a column first seen on this row: empty on the rows before it
                self.names.append(name)
                self.data[name] = [None] * count
        for name, column in self.data.items():
            column.append(row.get(name))
        self.numbers.append(number)

    def __len__(self) -> int:
        return len(self.numbers)


def _open_text(path: InputFile, newline: str):
    """The file as UTF-8 text read as it is parsed (a byte-order mark is accepted and dropped)."""
    try:
        return path.open_text(newline)
    except OSError as exc:  # unreadable for this user, a folder in the way, a device error
        raise DataError(f"{path}: the input cannot be read: {exc.strerror or exc}") from None


def _not_utf8(path: InputFile) -> DataError:
    """The precise error (line, byte, offset) for a file that failed to decode while streaming."""
    try:
        _read_text(path)
    except DataError as exc:
        return exc
    return DataError(f"{path}: not UTF-8")


def _read_csv(path: InputFile, limit: int | None = None) -> tuple[_Columns, list[Rejection]]:
    # Python's csv refuses a field over 131,072 characters, and with it the whole file; a long cell is the
    # row's problem (prompt_too_long), as it is in JSONL.
    csv.field_size_limit(max(csv.field_size_limit(), path.size() + 1))
    try:
        # newline="": rows end only at \n, \r\n or \r (outside quotes), never at U+2028 and kin.
        with _open_text(path, newline="") as handle:
            return _parse_csv(path, csv.reader(handle, strict=True), limit)
    except UnicodeDecodeError:
        raise _not_utf8(path) from None


def _parse_csv(path: InputFile, reader: Any, limit: int | None) -> tuple[_Columns, list[Rejection]]:
    try:
        header = next(reader)
    except StopIteration:
        raise DataError(f"{path}: input file is empty") from None
    except csv.Error as exc:
        raise DataError(f"{path}: line 1: {exc}") from None
    header = [name.strip() for name in header]
    if len(set(header)) != len(header) or any(not name for name in header):
        raise DataError(f"{path}: line 1: column names must be unique and non-empty, got {header}")
    table = _Columns(header)
    started = reader.line_num + 1  # the line the record being read starts on
    try:
        for values in reader:
            started = reader.line_num + 1
            if not values or (len(values) == 1 and not values[0].strip()):
                continue
            if len(values) != len(header):
                raise DataError(
                    f"{path}: line {reader.line_num}: expected {len(header)} fields ({', '.join(header)}), "
                    f"found {len(values)}"
                )
            table.add_values([value if value != "" else None for value in values], len(table) + 1)
            if limit is not None and len(table) >= limit:
                break  # input.limit: the rest of the file is not read
    except csv.Error as exc:
        if "unexpected end of data" in str(exc):
            raise DataError(f"{path}: line {started}: a quoted field opened on this line is never closed "
                            f"(the file ends at line {reader.line_num})") from None
        raise DataError(f"{path}: line {reader.line_num}: {exc}") from None
    if not header:
        raise DataError(f"{path}: no columns")
    if not len(table):
        raise DataError(f"{path}: input file has no rows, only a header ({', '.join(header)})")
    table.seen = len(table)
    return table, []


def _json_objects(entries: Iterator[tuple[str, str, Any]], limit: int | None) -> tuple[_Columns, list[Rejection]]:
    """The rows of a JSON-lines or JSON-array file from its (row label, where, value) entries, one per data row:
    an object is a row; anything else (or a line that is not JSON: a JSONDecodeError value) is a rejected row
    (invalid_json). Stops at `limit` rows (input.limit: the rest of the file is not read)."""
    table, rejected, row = _Columns(), [], 0
    for label, where, value in entries:
        row += 1
        if isinstance(value, dict):
            table.add_row(value, row)
            if limit is not None and len(table) >= limit:
                break
            continue
        detail = value.msg if isinstance(value, json.JSONDecodeError) else \
            f"expected a JSON object, got {type(value).__name__}"
        rejected.append(Rejection(label, row, "load", ["invalid_json"], f"{where}: {detail}"))
    table.seen = row
    return table, rejected


def _jsonl_entries(handle: Any) -> Iterator[tuple[str, str, Any]]:
    for number, line in enumerate(handle, start=1):
        if not line.strip():
            continue  # a blank line is no data row
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            value = exc
        yield f"line-{number}", f"line {number}", value


def _read_jsonl(path: InputFile, limit: int | None = None) -> tuple[_Columns, list[Rejection]]:
    try:
        # newline="\n": lines end at \n only; JSON strings may hold U+2028 and other characters
        # splitlines() breaks on
        with _open_text(path, newline="\n") as handle:
            table, rejected = _json_objects(_jsonl_entries(handle), limit)
    except UnicodeDecodeError:
        raise _not_utf8(path) from None
    if not table.seen:
        raise DataError(f"{path}: input file has no rows")
    return table, rejected


def _read_json(path: InputFile, limit: int | None = None) -> tuple[_Columns, list[Rejection]]:
    """A JSON array of objects, decoded one element at a time (`json_elements`); an element that is not an
    object is a rejected row (invalid_json), as a JSONL line is."""
    try:
        with _open_text(path, newline="") as handle:
            entries = ((f"element-{row}", f"element {row} (line {line})", value)
                       for row, (line, value) in enumerate(json_elements(handle), start=1))
            table, rejected = _json_objects(entries, limit)
    except UnicodeDecodeError:
        raise _not_utf8(path) from None
    except ValueError as exc:
        raise DataError(f"{path}: {exc}") from None
    if not table.seen:
        raise DataError(f"{path}: input file has no rows (an empty JSON array)")
    return table, rejected


def json_elements(handle: Any, block: int = 1 << 16) -> Iterator[tuple[int, Any]]:
    """(line, element) of a JSON array read from a text stream a block at a time; ValueError naming the line
    where the text stops being a JSON array."""
    decoder = json.JSONDecoder()
    buffer, position, line, eof, state = "", 0, 1, False, "start"  # state: start, first, value, comma

    def fill() -> None:
        nonlocal buffer, position, eof
        more = handle.read(block)
        eof = not more
        buffer, position = buffer[position:] + more, 0

    while True:
        blank = _JSON_SPACE.match(buffer, position).end()
        line += buffer.count("\n", position, blank)
        position = blank
        if position == len(buffer):
            if eof:
                raise ValueError("input file is empty" if state == "start" else
                                 f"line {line}: the JSON array is never closed")
            fill()
            continue
        char = buffer[position]
        if state == "start":
            if char != "[":
                raise ValueError(f"line {line}: expected a JSON array of objects, found {char!r}")
            position, state = position + 1, "first"
            continue
        if char == "]" and state in ("first", "comma"):
            return
        if state == "comma":
            if char != ",":
                raise ValueError(f"line {line}: not a JSON array: expected ',' or ']', found {char!r}")
            position, state = position + 1, "value"
            continue
        try:
            value, end = decoder.raw_decode(buffer, position)
        except json.JSONDecodeError as exc:
            if not eof:
                fill()  # the element may go on in the next block
                continue
            raise ValueError(f"line {line + buffer.count(chr(10), position, exc.pos)}: not a JSON array: "
                             f"{exc.msg}") from None
        if end == len(buffer) and not eof:
            fill()  # a number or literal may go on in the next block: decode it again with more
            continue
        yield line, value
        line += buffer.count("\n", position, end)
        position, state = end, "comma"


_JSON_SPACE = re.compile(r"[ \t\n\r]*")


def _check_id_type(path: InputFile, schema: pa.Schema, id_column: str | None, what: str) -> None:
    if id_column in schema.names:
        kind = schema.field(id_column).type
        if (pa.types.is_nested(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
                or pa.types.is_fixed_size_binary(kind) or pa.types.is_boolean(kind)):
            raise DataError(f"{path}: field {id_column} (input.id_column) has {what} type {kind}; "
                            f"ids must be text or integers")


def _columns_of(table: pa.Table, limit: int | None) -> _Columns:
    if limit is not None:
        table = table.slice(0, limit)
    columns = _Columns(table.column_names)
    columns.data = {name: table.column(name).to_pylist() for name in table.column_names}
    columns.numbers = array("q", range(1, table.num_rows + 1))
    columns.seen = table.num_rows
    return columns


def _first_batches(batches: Any, schema: pa.Schema, limit: int | None) -> pa.Table:
    """All batches, or (input.limit) only those the first `limit` rows are in: the rest is not read."""
    kept, count = [], 0
    for batch in batches:
        kept.append(batch)
        count += batch.num_rows
        if limit is not None and count >= limit:
            break
    return pa.Table.from_batches(kept, schema=schema)


def _read_parquet(path: InputFile, id_column: str | None = None, limit: int | None = None,
                  single: bool = True) -> tuple[_Columns, list[Rejection]]:
    try:
        parquet = pq.ParquetFile(path.open_random())
        schema = parquet.schema_arrow
        _check_id_type(path, schema, id_column, "Parquet")
        table = parquet.read() if limit is None else _first_batches(parquet.iter_batches(), schema, limit)
        columns = _columns_of(table, limit)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a readable Parquet file: {exc}") from None
    if not len(columns) and single:
        raise DataError(f"{path}: input file has no rows (Parquet schema: {', '.join(schema.names) or 'none'})")
    return columns, []


def _read_saved(path: InputFile, id_column: str | None = None, limit: int | None = None,
                single: bool = True) -> tuple[_Columns, list[Rejection]]:
    """One Arrow file of a datasets save_to_disk folder (an Arrow IPC stream), a record batch at a time."""
    try:
        source = pa.memory_map(path.path) if path.local else path.open_random()
        reader = pa.ipc.open_stream(source)
        _check_id_type(path, reader.schema, id_column, "Arrow")
        columns = _columns_of(_first_batches(reader, reader.schema, limit), limit)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a readable Arrow file of a datasets save_to_disk folder: {exc}") from None
    return columns, []


def item_id_of(value: Any) -> tuple[str | None, str]:
    """An item id from an id cell: (id, "") or (None, the reason: missing_id or bad_id)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None, "missing_id"
    if isinstance(value, str):
        return (value.strip(), "") if value.strip() else (None, "missing_id")
    if isinstance(value, bool):  # before int: True is an int
        return None, "bad_id"
    if isinstance(value, int):
        return str(value), ""
    if isinstance(value, float) and value.is_integer():  # an integer column with nulls, as pandas writes it
        return str(int(value)), ""
    return None, "bad_id"


READERS = {"csv": _read_csv, "jsonl": _read_jsonl, "json": _read_json}
TABLE_READERS = {"parquet": _read_parquet, SAVED: _read_saved}


def read_rows(spec: InputSpec) -> tuple[_Columns, list[Rejection]]:
    """The rows of every input file in order, numbered across the files, up to `input.limit` rows."""
    files, fmt = input_files(spec)
    table: _Columns | None = None
    rejected: list[Rejection] = []
    for file in files:
        left = None if spec.limit is None else spec.limit - (len(table) if table is not None else 0)
        if left is not None and left <= 0:
            break
        if fmt in TABLE_READERS:
            part, more = TABLE_READERS[fmt](file, spec.id_column, left, single=len(files) == 1)
        else:
            part, more = READERS[fmt](file, left)
        offset = table.seen if table is not None else 0
        for rejection in more:
            rejection.row_number += offset
            if len(files) > 1:
                rejection.detail = f"{file}: {rejection.detail}"
        rejected += more
        if table is None:
            table = part
        else:
            table.extend(part, offset)
            table.seen = offset + part.seen
    if not len(table) and not rejected:
        raise DataError(f"{spec.path}: the input has no rows ({len(files)} files)")
    return table, rejected


def _describe(value: Any) -> str:
    """A value's kind in a user's words: a list, an object, bytes, true, 2.5."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (bytes, bytearray)):
        return "bytes"
    if isinstance(value, float):
        return f"{value!r}"
    return f"a {type(value).__name__}"


def _unique_labels(rejected: list[Rejection], ids: Collection[str]) -> None:
    """A rejected row without a usable id is labelled by batchgen (line-2, row-3, p1@row-4); where an input's
    own id is the same text, the label gets a ~2 (~3, ...) suffix, so every item is counted exactly once."""
    taken = set()
    for rejection in rejected:
        label, n = rejection.item_id, 1
        while label in taken or label in ids:
            n += 1
            label = f"{rejection.item_id}~{n}"
        rejection.item_id = label
        taken.add(label)


# The last load of this process, kept for the next load of the same unchanged file: `batchgen run` checks every
# row before the flow starts, and the flow's load-items task then takes that load instead of parsing again.
_LAST: tuple[tuple, LoadedItems] | None = None


def _load_key(spec: InputSpec) -> tuple | None:
    if "://" in spec.path or set("*?[") & set(spec.path) or Path(spec.path).is_dir():
        return None  # one local file only: many files, or a URL, are loaded again
    try:
        stat = Path(spec.path).stat()
    except OSError:
        return None
    return (str(Path(spec.path).resolve()), stat.st_size, stat.st_mtime_ns, spec.format, spec.id_column, spec.limit)


def keep_for_next_load(spec: InputSpec, loaded: LoadedItems) -> None:
    """Keep a load for the next `take_kept_load` of the same unchanged file (one, held until then)."""
    global _LAST
    key = _load_key(spec)
    _LAST = (key, loaded) if key is not None else None


def take_kept_load(spec: InputSpec) -> LoadedItems | None:
    """The kept load of this file, if it has not changed since (given once), else None."""
    global _LAST
    if _LAST is None or _LAST[0] != _load_key(spec):
        return None
    loaded, _LAST = _LAST[1], None
    return loaded


def load_items(spec: InputSpec) -> LoadedItems:
    """Read the input and give every row a stable item id; unusable rows become rejections."""
    path = spec.path
    table, rejected = read_rows(spec)
    columns, data, numbers = table.names, table.data, table.numbers

    clash = [name for name in RESERVED_COLUMNS if name in columns and name != spec.id_column]
    if clash:
        raise DataError(f"{path}: column name {clash[0]!r} is reserved by batchgen; rename it or set input.id_column")
    if spec.id_column and len(table) and spec.id_column not in columns:
        raise DataError(f"{path}: input.id_column {spec.id_column!r} is not a column (columns: {', '.join(columns)})")

    def full(i: int) -> dict[str, Any]:
        return {name: data[name][i] for name in columns}

    seen: dict[str, int] = {}
    kept_ids, kept_numbers, kept = [], array("q"), array("q")
    id_cells = data.get(spec.id_column, []) if spec.id_column else None  # no columns: no row was read
    for i, number in enumerate(numbers):
        if id_cells is not None:
            raw_id = id_cells[i]
            item_id, problem = item_id_of(raw_id)
            if problem == "missing_id":
                rejected.append(Rejection(f"row-{number}", number, "load", ["missing_id"],
                                          f"row {number}: {spec.id_column} is empty", full(i)))
                continue
            if problem:
                rejected.append(Rejection(f"row-{number}", number, "load", ["bad_id"],
                                          f"row {number}: {spec.id_column} is {_describe(raw_id)}; "
                                          f"ids must be text or whole numbers", full(i)))
                continue
            duplicate_reason = "duplicate_id"
        else:
            item_id, duplicate_reason = content_id(full(i)), "duplicate_item"
        if item_id in seen:
            rejected.append(Rejection(
                f"{item_id}@row-{number}", number, "load", [duplicate_reason],
                f"row {number}: same {'id' if spec.id_column else 'content'} as row {seen[item_id]}", full(i),
            ))
            continue
        seen[item_id] = number
        kept_ids.append(item_id)
        kept_numbers.append(number)
        kept.append(i)
    if rejected:
        _unique_labels(rejected, seen)
    del seen
    if len(kept) < len(numbers):
        data = {name: [data[name][i] for i in kept] for name in columns}

    # object dtype: an empty cell stays None (pandas would make text columns NaN-filled strings)
    items = pd.DataFrame({name: data[name] for name in columns}, columns=columns, index=pd.RangeIndex(len(kept)),
                         dtype=object)
    items.insert(0, "row_number", pd.Series(np.frombuffer(kept_numbers, dtype=np.int64) if len(kept_numbers) else [],
                                            dtype="int64"))
    items.insert(0, "item_id", pd.Series(kept_ids, dtype="string"))
    return LoadedItems(items=items, rejected=rejected, columns=columns)
