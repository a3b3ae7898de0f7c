"""The one writer of the dataset: explicit schemas, one directory per publication, an atomic switch.

Layout of `output.dir`:

    current -> publications/<id>     the complete publication readers use (a symlink)
    publications/<id>/               one directory per run, a dataset (docs/datasets.md):
        README.md                    the dataset card; its `configs` name each table's folder
        accepted/accepted.parquet    one folder per table, so a glob over a folder reads one table
        rejected/rejected.parquet
        attempts/attempts.parquet
        jsonl/<table>.jsonl          the JSON-lines mirrors (output.jsonl)
        validation.json, manifest.json (written last, with each file's SHA-256), and whatever
                                     else the run adds before commit (report.html, data_docs/)
    .batchgen/                       the durable result store and the publication history

`Publication` is the one writer, for a run and for the shard merge alike: `open` makes a new
publication directory that no reader looks at yet; `add_window` writes a window's rows into it
(and sums the window's totals), and joins them into the tables as the windows come, in order;
`seal` closes the tables (or joins the parts, `_WindowJoin`), then writes validation.json,
the dataset card and the manifest; anything else that belongs to the publication (a report,
Data Docs) is added to it next; `commit` then points `current` at it with one rename of a
symlink, which is atomic. A crash before that rename leaves `current` on the previous complete
publication; the stale directory is removed by the next run. The last `keep` publications are kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from batchgen.card import dataset_card
from batchgen.files import fsync_dir, replaced, sha256_of, write_text
from batchgen.records import ATTEMPTS_SCHEMA, Manifest, RunTotals
from batchgen.schema import (InputCodec, accepted_schema, input_fields, output_names, published_input_names,
                             rejected_schema)
from batchgen.store import write_atomic
from batchgen.table_figures import TableFigures

ACCEPTED_TABLE, REJECTED_TABLE, ATTEMPTS_TABLE = "accepted", "rejected", "attempts"
RESULTS = f"{ACCEPTED_TABLE}/{ACCEPTED_TABLE}.parquet"
REJECTED = f"{REJECTED_TABLE}/{REJECTED_TABLE}.parquet"
ATTEMPTS = f"{ATTEMPTS_TABLE}/{ATTEMPTS_TABLE}.parquet"
TABLE_FILES = {ACCEPTED_TABLE: RESULTS, REJECTED_TABLE: REJECTED, ATTEMPTS_TABLE: ATTEMPTS}
JSONL_DIR = "jsonl"  # the mirrors live apart from the Parquet folders, so a folder holds one table's Parquet only
CARD = "README.md"
VALIDATION = "validation.json"
MANIFEST = "manifest.json"
CURRENT = "current"
PUBLICATIONS = "publications"
HISTORY = Path(".batchgen") / "publications.json"
PARTS = ".parts"  # windows' pieces of the tables while a publication is staged
ROW_GROUP_ROWS = 8192  # readers (the shard merge, the report, a dataset scan) decode a row group at a time


class PublishError(RuntimeError):
    """A publication that cannot be committed or does not verify."""


def mirror_name(name: str) -> str:
    """The JSON-lines mirror of a table file: accepted/accepted.parquet -> jsonl/accepted.jsonl."""
    return f"{JSONL_DIR}/{Path(name).stem}.jsonl"


def _jsonl(table: pa.Table) -> str:
    """The table as JSON lines, a row each: UTF-8 as is, NaN as null, times and what else JSON has no type for as
    their str() (as json's default=str wrote them).

    Written by Polars (`_jsonl_by_polars`) where every column is of a type it writes as orjson does, else by orjson
    (`_jsonl_by_orjson`); the same bytes either way (tests/unit/batchgen/test_publish.py)."""
    lines = _jsonl_by_polars(table)
    return lines if lines is not None else _jsonl_by_orjson(table)


def _polars_writes(kind: pa.DataType, top: bool = True) -> bool:
    """Whether Polars' JSON writer renders a column of this type as `_jsonl_by_orjson` does: text, integers,
    booleans, 64-bit floats (NaN and infinities as null, the shortest repr), nulls, and lists and structs of those;
    a time at the top level, which `_jsonl_by_polars` turns into its str() first. Not 32-bit floats (Python widens
    them: 0.1 is 0.10000000149011612), maps, binary, decimals, dictionaries, nor anything else untried."""
    if pa.types.is_temporal(kind):
        return top
    if (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind)
            or pa.types.is_boolean(kind) or pa.types.is_float64(kind) or pa.types.is_null(kind)):
        return True
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _polars_writes(kind.value_type, top=False)
    if pa.types.is_struct(kind):
        return kind.num_fields > 0 and all(_polars_writes(kind.field(i).type, top=False)
                                           for i in range(kind.num_fields))
    return False


def ready_jsonl_writer() -> None:
    """Import Polars and check its writer (`_polars`) now, at a run's start, rather than in the first window's
    staging while the engine's outputs come in (~0.15 s holding the interpreter)."""
    _polars()


def _polars() -> Any:
    """The polars module, or None where it is not installed or its writer renders a probe of the types it is
    given (`_polars_writes`) otherwise than orjson (another Polars release): the orjson path is used then."""
    global _POLARS
    with _POLARS_LOCK:
        if _POLARS is False:
            try:
                import polars

                probe = _polars_probe()
                if polars.from_arrow(probe).write_ndjson() != _jsonl_by_orjson(probe):
                    polars = None
            except Exception:  # noqa: BLE001  (not installed, or not working here: orjson writes the lines)
                polars = None
            _POLARS = polars
    return _POLARS


_POLARS: Any = False  # not looked up yet
_POLARS_LOCK = threading.Lock()


def _polars_probe() -> pa.Table:
    """Values at the edges of what `_polars_writes` lets Polars write."""
    position = pa.struct([("token_id", pa.int32()), ("token", pa.string()), ("logprob", pa.float64())])
    return pa.table({
        "f": pa.array([0.1, 1e-7, 1e21, -0.0, 1 / 3, 5e-324, float("nan"), float("-inf"), None], pa.float64()),
        "s": pa.array(['"q" \\ /', "ü 中 😀", "\x00\x1f\x7f", "\n\t\u2028", "</s>", "", None, "a", "b"]),
        "i": pa.array([2**63 - 1, -2**63, 0, None, 1, 2, 3, 4, 5], pa.int64()),
        "u": pa.array([2**64 - 1, 0, None, 1, 2, 3, 4, 5, 6], pa.uint64()),
        "b": pa.array([True, False, None] * 3),
        "l": pa.array([[1, None], [], None, [2**31 - 1], [0], [1], [2], [3], [4]], pa.list_(pa.int32())),
        "p": pa.array([[[{"token_id": 1, "token": 'a"', "logprob": -0.5}]], None, [[]], [], None, None, None, None,
                       None], pa.list_(pa.list_(position))),
    })


def _write_jsonl(table: pa.Table, path: Path) -> None:
    """The table's JSON lines (`_jsonl`) into a file, atomically, not synced (a window's part: commit syncs the
    joined tables); Polars writes the file itself where it writes the lines."""
    with replaced(path, sync=False) as tmp:
        if _jsonl_by_polars(table, tmp) is None:
            tmp.write_text(_jsonl_by_orjson(table), encoding="utf-8")


def _jsonl_by_polars(table: pa.Table, path: Path | None = None) -> str | None:
    """The JSON lines as Polars' writer makes them (written into `path` if given: then ""), or None where a column
    is of a type it may write otherwise (`_polars_writes`) or Polars is not installed. Its writer runs in Rust
    threads without the interpreter's lock: a window's attempts table (1,824 rows) took 9.4 us per row of the
    interpreter by orjson, 0.6 by Polars, so the other windows' threads go on meanwhile."""
    if not all(_polars_writes(field.type) for field in table.schema) or \
            len(set(table.column_names)) != table.num_columns:
        return None
    polars = _polars()
    if polars is None:
        return None
    columns = [_times_as_text(column) if pa.types.is_temporal(field.type) else column
               for field, column in zip(table.schema, table.columns)]
    try:
        frame = polars.from_arrow(pa.Table.from_arrays(columns, names=table.column_names))
        if path is None:
            return frame.write_ndjson()
        frame.write_ndjson(path)  # by Rust, into the file: no Python buffer to write into, under the lock
        return ""
    except Exception:  # noqa: BLE001  (a type Polars does not take after all: orjson writes the lines)
        return None


def _jsonl_by_orjson(table: pa.Table) -> str:
    """The JSON lines by orjson (5-10x faster than json here).

    Column by column (`_json_values`) rather than by `Table.to_pylist`: lists of integers (token ids) go to orjson
    as NumPy views of the column's buffer, not as a Python int each, and a time column's str() is made once per
    distinct value; the lines are the same bytes either way (tests/unit/batchgen/test_publish.py)."""
    dumps = orjson.dumps
    if not any(_costly(field.type) for field in table.schema):  # Arrow's own rows are quicker than dict(zip())
        rows = table.to_pylist()
    else:
        names = table.column_names
        rows = (dict(zip(names, row)) for row in zip(*(_json_values(table.column(name)) for name in names)))
    return b"".join(dumps(row, default=str, option=_ORJSON) for row in rows).decode("utf-8")


def _int_lists(kind: pa.DataType) -> bool:
    return (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_integer(kind.value_type)


def _costly(kind: pa.DataType) -> bool:
    """A column type whose Python values cost far more than `_json_values` makes them for."""
    return _int_lists(kind) or pa.types.is_temporal(kind)


def _json_values(column: pa.ChunkedArray) -> list[Any]:
    """A column's values as orjson takes them: a flat list of integers as a NumPy array, a time column as the
    str() of each value, anything else as Python values."""
    kind = column.type
    if _int_lists(kind):
        array = column.combine_chunks()
        if array.values.null_count == 0:
            values = array.values.to_numpy(zero_copy_only=False)
            ends = array.offsets.to_numpy(zero_copy_only=False)  # the slice's own offsets into `values`
            cells = [values[start:stop] for start, stop in zip(ends[:-1].tolist(), ends[1:].tolist())]
            if array.null_count:
                for row in np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False)).tolist():
                    cells[row] = None
            return cells
    elif pa.types.is_temporal(kind):
        return _times_as_text(column).to_pylist()
    return column.to_pylist()


def _times_as_text(column: pa.ChunkedArray) -> pa.Array:
    """A time column as the str() of each value (as json's default=str wrote it), made once per distinct value."""
    coded = column.combine_chunks().dictionary_encode()
    labels = pa.array([None if value is None else str(value) for value in coded.dictionary.to_pylist()], pa.string())
    return labels.take(coded.indices)


# datetimes through default=str ("2026-12-02 20:00:00+00:00"), not orjson's RFC 3339
# (and lists of integers as NumPy arrays, `_json_values`)
_ORJSON = (orjson.OPT_APPEND_NEWLINE | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS
           | orjson.OPT_SERIALIZE_NUMPY)


def to_table(frame: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    """The frame's columns of `schema` as an Arrow table of that schema, converted column by column (missing
    values, NaN included, become nulls); a column pyarrow cannot convert from pandas as it is (an object column
    mixing types the schema allows) is converted from its Python values instead."""
    columns = []
    for field in schema:
        column = frame[field.name]
        try:
            columns.append(pa.array(column, type=field.type, from_pandas=True))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError):
            values = column.astype(object).where(column.notna(), None).tolist()
            columns.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def new_publication_id(now: datetime | None = None) -> str:
    """Sortable by time, unique across processes: 20261129T181500123456Z-1a2b3c4d."""
    now = now or datetime.now(timezone.utc)
    return f"{now:%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex[:8]}"


def frame_tables(accepted: pd.DataFrame, rejected: pd.DataFrame, attempts: pd.DataFrame,
                 codec: tuple[pa.DataType, InputCodec],
                 id_column: str | None = None) -> dict[str, pa.Table]:
    """The published tables from assembled frames, the inputs encoded with `codec` (`frame_input_codec`).

    Each input column becomes a column of its own (`published_input_names`: an input column named like one of
    batchgen's gets the prefix `input_`); the id column is not repeated, `item_id` holds its value.
    """
    struct, encode = codec
    names = [f.name for f in struct if f.name != id_column] if pa.types.is_struct(struct) else []
    renamed = published_input_names(names, output_names(c for c in accepted.columns if c != "input"))
    fields = input_fields(struct, renamed)

    def flat(frame: pd.DataFrame) -> pd.DataFrame:
        if not names:
            return frame.drop(columns="input")
        by_name = encode.columns(frame["input"].tolist(), names)  # a list per column, not a dict per row
        return frame.drop(columns="input").assign(**{renamed[name]: by_name[name] for name in names})

    accepted, rejected = flat(accepted), flat(rejected)
    return {
        RESULTS: to_table(accepted, accepted_schema(fields, accepted)),
        REJECTED: to_table(rejected, rejected_schema(fields)),
        ATTEMPTS: to_table(attempts, ATTEMPTS_SCHEMA),
    }


LOCK = ".staging.lock"  # held (flock) by the process writing a staged publication, for as long as it lives
_HELD: dict[str, int] = {}  # staging directory -> its lock's file descriptor, in this process


def _release(staging: Path) -> None:
    fd = _HELD.pop(str(staging), None)
    if fd is not None:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        (staging / LOCK).unlink()


def _abandoned(staging: Path) -> bool:
    """A staging whose writer is gone: its lock can be taken (a live writer holds it), or it has none."""
    if str(staging) in _HELD:
        return False
    try:
        fd = os.open(staging / LOCK, os.O_RDWR)
    except FileNotFoundError:  # committed (the lock goes at commit), or staged by a batchgen without locks
        return True
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops the probe's lock


def clean_stale(out_dir: Path) -> list[Path]:
    """Remove staged publications that no live process is writing and that were never committed; returns them."""
    folder = Path(out_dir) / PUBLICATIONS
    if not folder.is_dir():
        return []
    keep = set(_history(Path(out_dir)))
    link = Path(out_dir) / CURRENT
    if link.is_symlink():
        keep.add(Path(os.readlink(link)).name)
    removed = []
    for path in sorted(folder.iterdir()):
        if path.is_dir() and path.name not in keep and _abandoned(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def unified_schema(schemas: list[pa.Schema]) -> pa.Schema:
    """One schema for the parts of a table. Windows can infer a column differently (a structured-output field
    that is null in one window, a number in the next): Arrow's permissive promotion first, else text."""
    if not schemas:
        raise PublishError("a table has no staged parts")
    try:
        unified = pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        fields = []
        for name in schemas[0].names:
            kinds = {s.field(name).type for s in schemas if name in s.names} - {pa.null()}
            fields.append(pa.field(name, kinds.pop() if len(kinds) == 1 else pa.string()))
        unified = pa.schema(fields)
    return pa.schema([pa.field(f.name, pa.string()) if pa.types.is_null(f.type) else f for f in unified])


def _part(parts: Path, name: str, index: int) -> Path:
    """Window `index`'s part of table file `name` in the folder `parts`, without its suffix (.parquet, .jsonl)."""
    return parts / f"{Path(name).stem}-{index:06d}"


class _TableWriter:
    """One table's Parquet file and its JSON-lines mirror (`mirror`; None: none), written a piece at a time, each
    piece cast to `schema`. A piece may come with the file of its JSON lines, rendered when its window was staged
    (`add_window`): they are copied as they are when the piece's schema is the table's, else rendered again."""

    def __init__(self, path: Path, mirror: Path | None, schema: pa.Schema):
        self.schema, self.rows = schema, 0
        self._lines = open(mirror, "wb") if mirror is not None else None
        try:
            self._writer = pq.ParquetWriter(path, schema)
        except BaseException:
            if self._lines is not None:
                self._lines.close()
            raise

    def write(self, table: pa.Table, rendered: Path | None = None) -> None:
        same = table.schema == self.schema
        table = table if same else table.select(self.schema.names).cast(self.schema)
        self._writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        self.rows += table.num_rows
        if self._lines is None:
            return
        if same and rendered is not None and rendered.is_file():  # the part's own lines, as written
            with open(rendered, "rb") as part:
                shutil.copyfileobj(part, self._lines, 1 << 20)
        else:  # a part whose columns were unified with other windows' (or a merge's table): as published
            self._lines.write(_jsonl(table).encode("utf-8"))

    def close(self) -> None:
        try:
            self._writer.close()
        finally:
            if self._lines is not None:
                self._lines.close()


def _file_entries(staging: Path, name: str, rows: int, jsonl: bool) -> dict[str, Any]:
    """The manifest's entries for a table's file and its mirror: rows and SHA-256."""
    files = {name: {"rows": rows, "sha256": sha256_of(staging / name)}}
    if jsonl:
        files[mirror_name(name)] = {"rows": rows, "sha256": sha256_of(staging / mirror_name(name))}
    return files


def _write_table(tables: Iterable[pa.Table | tuple[pa.Table, Path]], schema: pa.Schema, staging: Path, name: str,
                 jsonl: bool) -> dict[str, Any]:
    """Write tables one after another into one Parquet file `name` (and its JSON-lines mirror), atomically; a
    piece may come with the file of its JSON lines (`_TableWriter`)."""
    path, mirror = staging / name, staging / mirror_name(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    if jsonl:
        mirror.parent.mkdir(parents=True, exist_ok=True)
    # No fsync here: commit() syncs every file of the publication before the switch.
    with replaced(path, sync=False) as tmp, \
            (replaced(mirror, sync=False) if jsonl else contextlib.nullcontext()) as tmp_mirror:
        writer = _TableWriter(tmp, tmp_mirror, schema)
        try:
            for piece in tables:
                table, rendered = piece if isinstance(piece, tuple) else (piece, None)
                writer.write(table, rendered)
        finally:
            writer.close()
    return _file_entries(staging, name, writer.rows, jsonl)


class _WindowJoin:
    """The windows' parts joined into the publication's tables while the run goes on, in window order (windows
    are numbered from 1 with no gap, as the flow numbers them): a window is joined as soon as the windows before
    it are, by the thread that staged it or the one joining already, so that seal has the last windows left to
    write, not all of them again. Each table is written with its first window's schema; seal uses what was
    joined when that is the schema of all the windows' parts (`unified_schema`) and it holds every window once,
    in order, else it joins the parts (a column Arrow inferred differently in a later window, a window staged
    twice, a failed write): the same bytes either way."""

    def __init__(self, directory: Path, jsonl: bool):
        self.directory, self.jsonl = directory, jsonl
        self.joined: list[int] = []
        self.writers: dict[str, _TableWriter] = {}
        self.broken: str | None = None  # why the parts are joined at seal instead
        self._next = 1
        # staged windows waiting for the ones before them: their tables (None: read back) and their parts' schemas
        self._ready: dict[int, tuple[dict[str, pa.Table] | None, dict[str, pa.Schema]]] = {}
        self._busy = False  # a thread is joining: a window staged meanwhile is left to it
        self._state = threading.Condition()

    def path(self, name: str) -> Path:
        return self.directory / f"{Path(name).stem}.joined.parquet"

    def add(self, index: int, tables: dict[str, pa.Table], schemas: dict[str, pa.Schema]) -> None:
        """Window `index`, just staged as parts (`tables` and their files' `schemas`, by table file): joined now if
        its turn has come (and any staged windows after it), else when the window before it is."""
        with self._state:
            if self.broken is not None:
                return
            if index < self._next or index in self._ready:
                self.broken = f"window {index} staged twice"
                return
            self._ready[index] = (tables if index == self._next else None, schemas)  # a later one: read back
            if self._busy:
                return
            self._busy = True
        while True:
            with self._state:
                if self.broken is not None or self._next not in self._ready:
                    self._busy = False
                    self._state.notify_all()
                    return
                index = self._next
                tables, schemas = self._ready.pop(index)
            try:
                self._write(index, tables, schemas)
            except BaseException as error:  # the parts are all there: seal joins them, and meets the error again
                with self._state:           # if it was more than this join's
                    self.broken = f"window {index}: {type(error).__name__}: {error}"
                    self._busy = False
                    self._state.notify_all()
                if not isinstance(error, Exception):
                    raise
                return
            with self._state:
                self.joined.append(index)
                self._next += 1

    def _write(self, index: int, tables: dict[str, pa.Table] | None, schemas: dict[str, pa.Schema]) -> None:
        for name in TABLE_FILES.values():
            part = _part(self.directory, name, index)
            table = tables[name] if tables is not None else pq.read_table(part.with_suffix(".parquet"))
            writer = self.writers.get(name)
            if writer is None:
                mirror = self.path(name).with_suffix(".jsonl") if self.jsonl else None
                # the schema as seal's join of the parts reads it back (a list's items named `element`, not `item`)
                writer = self.writers[name] = _TableWriter(self.path(name), mirror, unified_schema([schemas[name]]))
            writer.write(table, part.with_suffix(".jsonl") if self.jsonl else None)

    def finish(self, schemas: dict[str, pa.Schema], windows: list[int]) -> str | None:
        """Close the joined files once no window is being joined. None when they are the tables of `windows` (every
        staged window, in order) with `schemas` (the windows' parts' unified schemas, by table file), else why not."""
        with self._state:
            while self._busy:
                self._state.wait()
            broken, self.broken = self.broken, self.broken or "finished"  # nothing joins after this
            joined = list(self.joined)
        for writer in self.writers.values():
            try:
                writer.close()
            except Exception as error:
                broken = broken or f"closing: {type(error).__name__}: {error}"
        if broken is not None:
            return broken
        if not windows or joined != windows:
            return f"windows {joined} joined of {windows}"
        changed = [Path(name).stem for name, schema in schemas.items()
                   if name not in self.writers or self.writers[name].schema != schema]
        return f"a later window changed the columns of {', '.join(changed)}" if changed else None


def _history(out_dir: Path) -> list[str]:
    path = out_dir / HISTORY
    if not path.is_file():
        return []
    try:
        return [name for name in json.loads(path.read_text(encoding="utf-8")) if isinstance(name, str)]
    except (ValueError, TypeError):
        return []


Streams = dict[str, tuple[pa.Schema, Iterable[pa.Table | tuple[pa.Table, Path]]]]  # {table file: (schema, pieces)}


class Publication:
    """One publication being written: open, add windows (or, for a merge, whole tables at seal), seal, commit.

    Use it as a context manager: a publication that was not committed when the block ends (the run failed) is
    discarded at once, so its copy of the data does not wait for a later run's clean-up. Windows may be added
    from several threads; their totals (`RunTotals`) are summed here."""

    def __init__(self, out_dir: Path, staging: Path, jsonl: bool = True, keep: int = 3, id_column: str | None = None):
        self.out_dir, self.staging, self.jsonl, self.keep = Path(out_dir), Path(staging), jsonl, keep
        self.id_column = id_column  # the input's id column: published as item_id, not again
        self.totals = RunTotals()
        self.opened = time.perf_counter()
        self.opened_at = datetime.now(timezone.utc)
        self.windows_done: float | None = None  # when the last window was added, before sealing
        self.manifest: Manifest | None = None
        self.committed = False
        self._lock = threading.Lock()
        self._join = _WindowJoin(self.staging / PARTS, jsonl)
        self.join_fallback: str | None = None  # after seal: why the tables were not the ones joined as staged
        self._schemas: dict[str, dict[int, pa.Schema]] = {name: {} for name in TABLE_FILES.values()}  # by window
        self._rows: dict[str, dict[int, int]] = {name: {} for name in TABLE_FILES.values()}  # by window
        self._figures: dict[int, TableFigures] = {}  # the report's figures of each window's rows (`figures`)

    @classmethod
    def open(cls, out_dir: Path, **options: Any) -> Publication:
        """A new, empty publication directory that no reader looks at until `commit`.

        Stagings left by runs that were killed are removed first (`clean_stale`), so an output folder holds at
        most one staged copy of the data besides its kept publications."""
        clean_stale(out_dir)
        staging = Path(out_dir) / PUBLICATIONS / new_publication_id()
        staging.mkdir(parents=True)
        fd = os.open(staging / LOCK, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _HELD[str(staging)] = fd
        return cls(Path(out_dir), staging, **options)

    def __enter__(self) -> Publication:
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        if not self.committed:
            self.discard()

    def add_window(self, index: int, accepted: pd.DataFrame, rejected: pd.DataFrame, attempts: pd.DataFrame,
                   inputs: tuple[pa.DataType, InputCodec], totals: RunTotals) -> None:
        """Write one window's rows (assembled frames; their inputs encoded with `inputs`, the same for every window:
        schema.frame_input_codec) as its piece of each table, and add its totals to the run's."""
        tables = frame_tables(accepted, rejected, attempts, inputs, self.id_column)
        parts = self.staging / PARTS
        parts.mkdir(exist_ok=True)
        for name, table in tables.items():
            # A part is not kept after a crash: no fsync (commit syncs the joined tables).
            part = _part(parts, name, index)
            if self.jsonl:  # its JSON lines now, while the engine works on later windows, not all at seal
                _write_jsonl(table, part.with_suffix(".jsonl"))
            write_atomic(table, part.with_suffix(".parquet"), sync=False)
        schemas = {name: pq.read_schema(_part(parts, name, index).with_suffix(".parquet")) for name in tables}
        figures = TableFigures()
        figures.add_tables(tables[RESULTS], tables[REJECTED], tables[ATTEMPTS])
        with self._lock:
            for name, schema in schemas.items():
                self._schemas[name][index] = schema
                self._rows[name][index] = tables[name].num_rows
            self._figures[index] = figures
        self._join.add(index, tables, schemas)
        with self._lock:
            self.totals = self.totals + totals
            self.windows_done = time.perf_counter()

    def _staged(self) -> tuple[dict[str, pa.Schema], list[int]]:
        """The staged windows' unified schema of each table file (`unified_schema`, in window order) and their
        numbers. A window without rows in a table says nothing of its columns' types (a structured-output field
        it has no value of is text there): its schema counts only where no window has rows."""
        with self._lock:
            windows = sorted(self._schemas[RESULTS])
            schemas = {}
            for name, by_window in self._schemas.items():
                having = [i for i in windows if self._rows[name][i]] or windows
                schemas[name] = unified_schema([by_window[i] for i in having])
            return schemas, windows

    def figures(self) -> TableFigures | None:
        """The report's figures of the tables (`TableFigures`) as the seal will write them: the staged windows'
        rows, in window order; None for a publication whose tables are not staged as windows (a merge's)."""
        with self._lock:
            if not self._figures:
                return None
            figures = TableFigures()
            for index in sorted(self._figures):
                figures.extend(self._figures[index])
            return figures

    def _parts(self, schemas: dict[str, pa.Schema], windows: list[int]) -> Streams:
        """The windows' parts of each table, read one at a time, with the table's schema."""
        streams = {}
        for name, schema in schemas.items():
            parts = [_part(self.staging / PARTS, name, index) for index in windows]
            streams[name] = (schema, ((pq.read_table(part.with_suffix(".parquet")), part.with_suffix(".jsonl"))
                                      for part in parts))
        return streams

    def _take_joined(self, schemas: dict[str, pa.Schema], windows: list[int]) -> dict[str, Any] | None:
        """The tables joined while the windows were staged (`_WindowJoin`), moved into place, with their manifest
        entries (rows, SHA-256: hashed one table per thread); None when they are not the join of the parts of
        `windows` with `schemas` (`_staged`), which seal then writes."""
        self.join_fallback = self._join.finish(schemas, windows)
        if self.join_fallback is not None:
            return None
        for name in TABLE_FILES.values():
            moves = [(self._join.path(name), self.staging / name)]
            if self.jsonl:
                moves.append((self._join.path(name).with_suffix(".jsonl"), self.staging / mirror_name(name)))
            for source, target in moves:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(source, target)
        files: dict[str, dict[str, Any]] = {}
        with ThreadPoolExecutor(max_workers=len(TABLE_FILES), thread_name_prefix="batchgen-seal") as pool:
            for entries in pool.map(lambda name: _file_entries(self.staging, name, self._join.writers[name].rows,
                                                                self.jsonl), TABLE_FILES.values()):
                files.update(entries)
        return files

    def seal(self, manifest: Manifest, validation: list[dict[str, Any]], tables: Streams | None = None) -> Manifest:
        """Write the tables (the windows' parts, joined as they were staged or now a part at a time, or `tables`),
        validation.json and the dataset card, then the manifest with every file's rows and SHA-256: last, so its
        presence means done. Returns the manifest as written."""
        files: dict[str, dict[str, Any]] = {}
        if tables is not None:
            self.join_fallback, joined, streams = "tables given to seal", None, tables
        else:
            staged = self._staged()
            joined = self._take_joined(*staged)
            streams = self._parts(*staged) if joined is None else {}
        if joined is not None:
            files.update(joined)
        else:
            def write(name: str) -> dict[str, Any]:
                schema, pieces = streams[name]
                return _write_table(pieces, schema, self.staging, name, self.jsonl)

            # The windows' parts are joined one table per thread (Arrow reads, writes and hashes without holding the
            # interpreter); a merge's tables stream a row group at a time, one table after the other, to bound memory.
            with ThreadPoolExecutor(max_workers=len(streams) if tables is None else 1,
                                    thread_name_prefix="batchgen-seal") as pool:
                for written in pool.map(write, list(streams)):
                    files.update(written)
        shutil.rmtree(self.staging / PARTS, ignore_errors=True)
        write_text(json.dumps(validation, ensure_ascii=False, indent=1, default=str), self.staging / VALIDATION,
                   sync=False)  # commit() syncs every file of the publication before the switch
        files[VALIDATION] = {"sha256": sha256_of(self.staging / VALIDATION)}
        manifest = Manifest.model_validate({**manifest.to_json(), "publication": self.staging.name, "files": files})
        schemas = {table: pq.read_schema(self.staging / name) for table, name in TABLE_FILES.items() if name in files}
        write_text(dataset_card(manifest, schemas), self.staging / CARD, sync=False)
        files[CARD] = {"sha256": sha256_of(self.staging / CARD)}
        self.manifest = Manifest.model_validate({**manifest.to_json(), "files": files})
        write_text(json.dumps(self.manifest.to_json(), ensure_ascii=False, indent=2, default=str),
                   self.staging / MANIFEST)
        return self.manifest

    def commit(self) -> Path:
        """Point `<out>/current` at the sealed publication (one atomic rename), then prune; returns its directory."""
        out_dir, staging = self.out_dir, self.staging
        if staging.parent.resolve() != (out_dir / PUBLICATIONS).resolve() or not (staging / MANIFEST).is_file():
            raise PublishError(f"{staging}: not a sealed publication of {out_dir} (no {MANIFEST})")
        _release(staging)
        for path in sorted(staging.rglob("*"), reverse=True):  # files added after seal() are durable too
            if path.is_file():
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
        fsync_dir(staging)
        fsync_dir(staging.parent)
        with replaced(out_dir / CURRENT) as tmp:
            os.symlink(Path(PUBLICATIONS) / staging.name, tmp)  # relative: the folder can be moved or mounted
        self.committed = True  # readers see it now: never discarded from here on
        fsync_dir(out_dir)

        history = [name for name in _history(out_dir) if name != staging.name] + [staging.name]
        kept = history[-max(self.keep, 1):]
        (out_dir / HISTORY).parent.mkdir(parents=True, exist_ok=True)
        write_text(json.dumps(kept, indent=1), out_dir / HISTORY)
        for path in (out_dir / PUBLICATIONS).iterdir():  # older publications, and stagings a crash left behind
            if path.name not in kept and path.is_dir() and _abandoned(path):  # never another live run's staging
                shutil.rmtree(path, ignore_errors=True)
        return staging

    def discard(self) -> None:
        """Drop a publication that will not be committed (its run failed): the data copy goes at once."""
        _release(self.staging)
        shutil.rmtree(self.staging, ignore_errors=True)


def current_publication(out_dir: Path) -> Path:
    """The directory `<out>/current` points at."""
    link = Path(out_dir) / CURRENT
    if not link.is_symlink() and not link.is_dir():
        raise PublishError(f"{out_dir}: nothing published yet (no {CURRENT})")
    return link.resolve()


def read_manifest(directory: Path) -> Manifest:
    """A publication's manifest.json (PublishError if it cannot be read)."""
    try:
        return Manifest.model_validate_json((Path(directory) / MANIFEST).read_bytes())
    except (OSError, ValueError) as exc:
        raise PublishError(f"{directory}: no readable {MANIFEST}: {exc}") from None


def verify_publication(directory: Path) -> Manifest:
    """Check every file the manifest lists against its SHA-256; returns the manifest or raises PublishError."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    for name, entry in manifest.files.items():
        path = directory / name
        if not path.is_file():
            raise PublishError(f"{directory}: {name} is listed in the manifest but missing")
        if sha256_of(path) != entry.sha256:
            raise PublishError(f"{directory}: {name} does not match its SHA-256 in the manifest")
    return manifest
