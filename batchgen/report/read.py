"""Reading a publication for the report: its manifest, its GX results, and aggregates of its Parquet tables.

The tables are scanned once, a batch of rows at a time, so the report's memory does not grow with the run.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pydantic import ValidationError

from batchgen.publish import ATTEMPTS, MANIFEST, REJECTED, RESULTS, VALIDATION
from batchgen.records import Manifest
from batchgen.schema import INPUT_COLUMN_KEY

SAMPLE_SIZE = 10
BATCH_ROWS = 8192


class NotAPublicationError(ValueError):
    """The directory does not hold a complete batchgen publication."""


@dataclass
class Publication:
    """What the report shows of a publication: its manifest and GX results, and aggregates of its tables."""

    root: Path
    manifest: Manifest
    validation: list[dict[str, Any]]
    finish: pd.DataFrame  # outputs per (attempt, finish reason)
    lengths: pd.DataFrame  # chars, status: one row per published output with a text
    chunks: pd.DataFrame  # per engine chunk of this run: chunk_finished_at, tokens, chunk_seconds
    accepted_sample: list[dict[str, Any]]
    rejected_sample: list[dict[str, Any]]
    started_at: datetime | None  # the run's start: what finished before it was reused, not this run's work
    expectations: dict[str, Any]  # the job's expectation settings (bounds, keyword column); {} when not recorded


def read_manifest(root: Path) -> Manifest:
    """The publication's manifest.json: the one place the report opens it."""
    manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    if not isinstance(manifest, dict) or "counts" not in manifest:
        raise NotAPublicationError(f"{root / MANIFEST} has no counts: not a batchgen manifest")
    try:
        return Manifest.model_validate(manifest)
    except ValidationError as exc:
        raise NotAPublicationError(f"{root / MANIFEST} is not a batchgen manifest: {exc}") from None


def _batches(path: Path, columns: list[str]) -> Iterator[pa.RecordBatch]:
    reader = pq.ParquetFile(path)
    present = [c for c in columns if c in reader.schema_arrow.names]
    yield from reader.iter_batches(batch_size=BATCH_ROWS, columns=present)


def _lengths(path: Path, status: str) -> np.ndarray:
    """Characters of every output with a text (accepted: a missing text counts as 0)."""
    parts = []
    for batch in _batches(path, ["text"]):
        text = batch.column(0)
        if status == "rejected":
            text = pc.drop_null(text)
        parts.append(pc.fill_null(pc.utf8_length(text), 0).to_numpy(zero_copy_only=False).astype(np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def _sample(path: Path, columns: list[str], size: int) -> list[dict[str, Any]]:
    """A fixed-seed sample of `size` rows (pandas' `sample(random_state=0)` draw), in input order."""
    rows = pq.ParquetFile(path).metadata.num_rows
    wanted = (np.sort(np.random.RandomState(0).choice(rows, size=size, replace=False)) if rows > size
              else np.arange(rows))
    picked, offset = [], 0
    for batch in _batches(path, columns):
        inside = wanted[(wanted >= offset) & (wanted < offset + batch.num_rows)] - offset
        if len(inside):
            picked.extend(batch.take(pa.array(inside)).to_pylist())
        offset += batch.num_rows
    return sorted(picked, key=lambda row: (row.get("row_number") is None, row.get("row_number") or 0))


def _input_field(path: Path, column: str | None) -> str | None:
    """The published name of the input's `column` in a table (its own, or `input_<name>` where it clashed with one of
    batchgen's columns: the field's metadata keeps the input's name), or None."""
    if not column:
        return None
    for field in pq.read_schema(path):
        if (field.metadata or {}).get(INPUT_COLUMN_KEY) == column.encode():
            return field.name
    return None


def _attempt_aggregates(path: Path, started: datetime | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Outputs per (attempt, finish reason), and tokens per engine chunk finished after `started`."""
    finish: Counter = Counter()
    chunks: dict[Any, list[Any]] = {}
    for batch in _batches(path, ["attempt", "finish_reason", "new_output_tokens", "chunk_seconds",
                                 "chunk_finished_at"]):
        frame = batch.to_pandas()
        if frame.empty:
            continue
        counted = pd.DataFrame({"attempt": frame["attempt"].astype(int).to_numpy(),
                                "finish_reason": frame["finish_reason"].astype(object).fillna("unknown").to_numpy()})
        finish.update({key: int(count) for key, count in counted.groupby(["attempt", "finish_reason"]).size().items()})
        if "chunk_finished_at" not in frame:
            continue
        timed = frame.dropna(subset=["chunk_finished_at"])
        if started is not None:
            timed = timed[timed["chunk_finished_at"] >= started]  # reused results are not this run's work
        for at, group in timed.groupby("chunk_finished_at"):
            entry = chunks.setdefault(at, [0, group["chunk_seconds"].iloc[0]])
            entry[0] += int(group["new_output_tokens"].sum())
    table = pd.Series(finish, dtype="int64").unstack(fill_value=0) if finish else pd.DataFrame()
    if not table.empty:
        table.index.name, table.columns.name = None, None
        table = table.sort_index()
    frame = pd.DataFrame([{"chunk_finished_at": at, "tokens": tokens, "chunk_seconds": seconds}
                          for at, (tokens, seconds) in sorted(chunks.items())],
                         columns=["chunk_finished_at", "tokens", "chunk_seconds"])
    return table, frame


def expected_keyword(row_input: Any, column: str | None) -> str | None:
    """The value the keyword expectation looked for in this row's output (its input's keyword column)."""
    if not column or row_input is None:
        return None
    if isinstance(row_input, str):  # inputs whose columns change type are published as JSON text
        try:
            row_input = json.loads(row_input)
        except ValueError:
            return None
    value = row_input.get(column) if isinstance(row_input, dict) else None
    return None if value is None else str(value)


def load_publication(run_dir: Path) -> Publication:
    """Read what the report needs; a missing or unreadable file is a NotAPublicationError naming it."""
    root = Path(run_dir)
    if not root.is_dir():
        raise NotAPublicationError(f"{root} is not a directory")
    missing = [name for name in (MANIFEST, RESULTS, REJECTED, ATTEMPTS, VALIDATION) if not (root / name).is_file()]
    if missing:
        raise NotAPublicationError(f"{root} is not a batchgen publication: missing {', '.join(missing)}")
    try:
        manifest = read_manifest(root)
        validation = json.loads((root / VALIDATION).read_text(encoding="utf-8"))
        started = datetime.fromisoformat(manifest.started_at) if manifest.started_at else None
        expectations = manifest.expectations
        finish, chunks = _attempt_aggregates(root / ATTEMPTS, started)
        lengths = pd.concat([pd.DataFrame({"chars": _lengths(root / RESULTS, "accepted"), "status": "accepted"}),
                             pd.DataFrame({"chars": _lengths(root / REJECTED, "rejected"), "status": "rejected"})],
                            ignore_index=True)
        accepted = _sample(root / RESULTS, ["item_id", "row_number", "attempt", "text", "finish_reason",
                                            "n_output_tokens"], SAMPLE_SIZE)
        keyword = expectations.get("keyword_column")
        keyword_field = _input_field(root / REJECTED, keyword)
        rejected = _sample(root / REJECTED, ["item_id", "row_number", "stage", "reasons", "detail", "attempt", "text",
                                             "finish_reason", "n_output_tokens"]
                           + ([keyword_field] if keyword_field else []), SAMPLE_SIZE)
    except NotAPublicationError:
        raise
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise NotAPublicationError(f"{root}: cannot read the publication: {exc}") from exc
    for row in rejected:
        row["reasons"] = list(row.get("reasons") or [])
        row["expected"] = expected_keyword({keyword: row.pop(keyword_field)} if keyword_field else None, keyword)
    if isinstance(validation, dict):
        validation = [validation]
    return Publication(root, manifest, validation, finish, lengths, chunks, accepted, rejected, started, expectations)
