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

`stage` writes a new publication directory that no reader looks at yet; anything else
that belongs to the publication (a report, Data Docs) is added to it next; `commit`
then points `current` at it with one rename of a symlink, which is atomic. A crash
before that rename leaves `current` on the previous complete publication; the stale
directory is removed by the next commit. The last `keep` publications are kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import uuid
from datetime import datetime, timezone
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from batchgen.card import dataset_card
from batchgen.schema import accepted_schema, attempts_schema, input_codec, input_fields, output_names, \
    published_input_names, rejected_schema
from batchgen.store import write_atomic

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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(text: str, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def mirror_name(name: str) -> str:
    """The JSON-lines mirror of a table file: accepted/accepted.parquet -> jsonl/accepted.jsonl."""
    return f"{JSONL_DIR}/{Path(name).stem}.jsonl"


def _jsonl(table: pa.Table) -> str:
    return "".join(json.dumps(row, ensure_ascii=False, default=str) + "\n" for row in table.to_pylist())


def to_table(frame: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    records = frame[schema.names].astype(object).where(frame[schema.names].notna(), None).to_dict(orient="records")
    return pa.Table.from_pylist(records, schema=schema)


def new_publication_id(now: datetime | None = None) -> str:
    """Sortable by time, unique across processes: 20261129T181500123456Z-1a2b3c4d."""
    now = now or datetime.now(timezone.utc)
    return f"{now:%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex[:8]}"


def frame_tables(accepted: pd.DataFrame, rejected: pd.DataFrame, attempts: pd.DataFrame,
                 codec: tuple[pa.DataType, Callable[[Any], Any]], id_column: str | None = None) -> dict[str, pa.Table]:
    """The published tables from assembled frames, the inputs encoded with `codec` (`input_codec`).

    Each input column becomes a column of its own (`published_input_names`: an input column named like one of
    batchgen's gets the prefix `input_`); the id column is not repeated, `item_id` holds its value.
    """
    struct, encode = codec
    names = [f.name for f in struct if f.name != id_column] if pa.types.is_struct(struct) else []
    renamed = published_input_names(names, output_names(c for c in accepted.columns if c != "input"))
    fields = input_fields(struct, renamed)

    def flat(frame: pd.DataFrame) -> pd.DataFrame:
        encoded = [encode(value) for value in frame["input"]]
        columns = {renamed[name]: [row.get(name) if row else None for row in encoded] for name in names}
        return frame.drop(columns="input").assign(**columns) if columns else frame.drop(columns="input")

    accepted, rejected = flat(accepted), flat(rejected)
    return {
        RESULTS: to_table(accepted, accepted_schema(fields, accepted)),
        REJECTED: to_table(rejected, rejected_schema(fields)),
        ATTEMPTS: to_table(attempts, attempts_schema()),
    }


def stage(
    out_dir: Path,
    accepted: pd.DataFrame,
    rejected: pd.DataFrame,
    attempts: pd.DataFrame,
    validation: list[dict[str, Any]],
    manifest: dict[str, Any],
    jsonl: bool,
    id_column: str | None = None,
) -> tuple[dict[str, Any], Path]:
    """Write a new publication directory (manifest last); readers do not see it until `commit`."""
    codec = input_codec(list(accepted["input"]) + list(rejected["input"]))
    tables = frame_tables(accepted, rejected, attempts, codec, id_column)
    return stage_tables(out_dir, tables, validation, manifest, jsonl)


LOCK = ".staging.lock"  # held (flock) by the process writing a staged publication, for as long as it lives
_HELD: dict[str, int] = {}  # staging directory -> its lock's file descriptor, in this process


def open_publication(out_dir: Path) -> Path:
    """A new, empty publication directory that no reader looks at until `commit`.

    Stagings left by runs that were killed are removed first (`clean_stale`), so an output
    folder holds at most one staged copy of the data besides its kept publications.
    """
    clean_stale(out_dir)
    staging = Path(out_dir) / PUBLICATIONS / new_publication_id()
    staging.mkdir(parents=True)
    fd = os.open(staging / LOCK, os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _HELD[str(staging)] = fd
    return staging


def _release(staging: Path) -> None:
    fd = _HELD.pop(str(staging), None)
    if fd is not None:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        (staging / LOCK).unlink()


def discard(staging: Path) -> None:
    """Drop a staged publication that will not be committed (its run failed): the data copy goes at once."""
    _release(staging)
    shutil.rmtree(staging, ignore_errors=True)


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


def stage_part(staging: Path, index: int, tables: dict[str, pa.Table]) -> None:
    """Write one window's piece of each table into the staging directory (`stage_parts` joins them)."""
    parts = Path(staging) / PARTS
    parts.mkdir(exist_ok=True)
    for name, table in tables.items():
        write_atomic(table, parts / f"{Path(name).stem}-{index:06d}.parquet")


def stage_parts(
    out_dir: Path,
    staging: Path,
    names: list[str],
    validation: list[dict[str, Any]],
    manifest: dict[str, Any],
    jsonl: bool,
) -> tuple[dict[str, Any], Path]:
    """`stage` for a publication written window by window: each table's parts become one file, a part at a time."""
    files: dict[str, dict[str, Any]] = {}
    parts_dir = Path(staging) / PARTS
    for name in names:
        parts = sorted(parts_dir.glob(f"{Path(name).stem}-*.parquet"))
        schema = unified_schema([pq.read_schema(path) for path in parts])
        files.update(_write_table((pq.read_table(path) for path in parts), schema, Path(staging), name, jsonl))
    shutil.rmtree(parts_dir, ignore_errors=True)
    return _seal(Path(staging), files, validation, manifest)


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


def _write_table(tables: Iterable[pa.Table], schema: pa.Schema, staging: Path, name: str,
                 jsonl: bool) -> dict[str, Any]:
    """Write tables one after another into one Parquet file `name` (and its JSON-lines mirror), atomically."""
    path, mirror = staging / name, staging / mirror_name(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    if jsonl:
        mirror.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp_mirror = mirror.with_name(f".{mirror.name}.{uuid.uuid4().hex}.tmp")
    rows = 0
    try:
        with pq.ParquetWriter(tmp, schema) as writer, \
                (open(tmp_mirror, "w", encoding="utf-8") if jsonl else contextlib.nullcontext()) as lines:
            for table in tables:
                table = table.select(schema.names).cast(schema) if table.schema != schema else table
                writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
                rows += table.num_rows
                if lines is not None:
                    lines.write(_jsonl(table))
            if lines is not None:
                lines.flush()
                os.fsync(lines.fileno())
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        if jsonl:
            os.replace(tmp_mirror, mirror)
    finally:
        for leftover in (tmp, tmp_mirror):
            if leftover.exists():
                leftover.unlink()
    files = {name: {"rows": rows, "sha256": _sha256(path)}}
    if jsonl:
        files[mirror_name(name)] = {"rows": rows, "sha256": _sha256(mirror)}
    return files


def stage_tables(
    out_dir: Path,
    tables: dict[str, pa.Table],
    validation: list[dict[str, Any]],
    manifest: dict[str, Any],
    jsonl: bool,
    staging: Path | None = None,
) -> tuple[dict[str, Any], Path]:
    """`stage` for tables that are already Arrow."""
    streams = {name: (table.schema, [table]) for name, table in tables.items()}
    return stage_streams(out_dir, streams, validation, manifest, jsonl, staging)


def stage_streams(
    out_dir: Path,
    streams: dict[str, tuple[pa.Schema, Iterable[pa.Table]]],
    validation: list[dict[str, Any]],
    manifest: dict[str, Any],
    jsonl: bool,
    staging: Path | None = None,
) -> tuple[dict[str, Any], Path]:
    """`stage` for tables that arrive in pieces (e.g. the batches of shard publications merged into one):
    {file name: (schema, pieces)}, each file written a piece at a time."""
    opened = staging is None
    staging = staging if staging is not None else open_publication(out_dir)
    try:
        files: dict[str, dict[str, Any]] = {}
        for name, (schema, pieces) in streams.items():
            files.update(_write_table(pieces, schema, staging, name, jsonl))
        return _seal(staging, files, validation, manifest)
    except BaseException:
        if opened:  # this call's own staging: nobody else will finish it
            discard(staging)
        raise


def _seal(staging: Path, files: dict[str, dict[str, Any]], validation: list[dict[str, Any]],
          manifest: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    """Write validation.json and the dataset card, then the manifest with every file's rows and SHA-256: last, so its
    presence means done."""
    write_text_atomic(json.dumps(validation, ensure_ascii=False, indent=1, default=str), staging / VALIDATION)
    files = {**files, VALIDATION: {"sha256": _sha256(staging / VALIDATION)}}
    schemas = {table: pq.read_schema(staging / name) for table, name in TABLE_FILES.items() if name in files}
    card = dataset_card({**manifest, "publication": staging.name, "files": files}, schemas)
    write_text_atomic(card, staging / CARD)
    files[CARD] = {"sha256": _sha256(staging / CARD)}
    manifest = {**manifest, "publication": staging.name, "files": files}
    write_text_atomic(json.dumps(manifest, ensure_ascii=False, indent=2, default=str), staging / MANIFEST)
    return manifest, staging


def _history(out_dir: Path) -> list[str]:
    path = out_dir / HISTORY
    if not path.is_file():
        return []
    try:
        return [name for name in json.loads(path.read_text(encoding="utf-8")) if isinstance(name, str)]
    except (ValueError, TypeError):
        return []


def commit(out_dir: Path, staging_dir: Path, keep: int = 3) -> Path:
    """Point `<out>/current` at the staged publication (one atomic rename), then prune; returns its directory."""
    out_dir, staging_dir = Path(out_dir), Path(staging_dir)
    if staging_dir.parent.resolve() != (out_dir / PUBLICATIONS).resolve() or not (staging_dir / MANIFEST).is_file():
        raise PublishError(f"{staging_dir}: not a staged publication of {out_dir} (no {MANIFEST})")
    _release(staging_dir)
    for path in sorted(staging_dir.rglob("*"), reverse=True):  # files added after stage() are durable too
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(staging_dir)
    _fsync_dir(staging_dir.parent)

    link = out_dir / CURRENT
    tmp = out_dir / f".{CURRENT}.{uuid.uuid4().hex}.tmp"
    os.symlink(Path(PUBLICATIONS) / staging_dir.name, tmp)  # relative: the folder can be moved or mounted
    try:
        os.replace(tmp, link)
    finally:
        if tmp.is_symlink():
            tmp.unlink()
    _fsync_dir(out_dir)

    history = [name for name in _history(out_dir) if name != staging_dir.name] + [staging_dir.name]
    kept = history[-max(keep, 1):]
    (out_dir / HISTORY).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(json.dumps(kept, indent=1), out_dir / HISTORY)
    for path in (out_dir / PUBLICATIONS).iterdir():  # older publications, and stagings a crash left behind
        if path.name not in kept and path.is_dir() and _abandoned(path):  # never another live run's staging
            shutil.rmtree(path, ignore_errors=True)
    return staging_dir


def publish(
    out_dir: Path,
    accepted: pd.DataFrame,
    rejected: pd.DataFrame,
    attempts: pd.DataFrame,
    validation: list[dict[str, Any]],
    manifest: dict[str, Any],
    jsonl: bool,
    keep: int = 3,
    id_column: str | None = None,
) -> dict[str, Any]:
    """Stage and commit in one step; returns the manifest as written (publication id, file rows and hashes)."""
    written, staging = stage(out_dir, accepted, rejected, attempts, validation, manifest, jsonl, id_column)
    commit(out_dir, staging, keep)
    return written


def current_publication(out_dir: Path) -> Path:
    """The directory `<out>/current` points at."""
    link = Path(out_dir) / CURRENT
    if not link.is_symlink() and not link.is_dir():
        raise PublishError(f"{out_dir}: nothing published yet (no {CURRENT})")
    return link.resolve()


def verify_publication(directory: Path) -> dict[str, Any]:
    """Check every file the manifest lists against its SHA-256; returns the manifest or raises PublishError."""
    directory = Path(directory)
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PublishError(f"{directory}: no readable {MANIFEST}: {exc}") from None
    for name, entry in manifest.get("files", {}).items():
        path = directory / name
        if not path.is_file():
            raise PublishError(f"{directory}: {name} is listed in the manifest but missing")
        if _sha256(path) != entry["sha256"]:
            raise PublishError(f"{directory}: {name} does not match its SHA-256 in the manifest")
    return manifest
