"""Reading a publication for the report: its manifest, its GX results, and aggregates of its Parquet tables.

The tables are scanned once, a batch of rows at a time, so the report's memory does not grow with the run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pydantic import ValidationError

from batchgen.publish import ATTEMPTS, MANIFEST, REJECTED, RESULTS, VALIDATION
from batchgen.records import Manifest
from batchgen.schema import INPUT_COLUMN_KEY
from batchgen.table_figures import ATTEMPT_COLUMNS, TableFigures

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


def table_figures(root: Path) -> TableFigures:
    """The charts' figures of a publication's tables (`TableFigures`), read a batch of rows at a time."""
    figures = TableFigures()
    for batch in _batches(root / ATTEMPTS, ATTEMPT_COLUMNS):
        figures.add_attempts(batch)
    for name, status in ((RESULTS, "accepted"), (REJECTED, "rejected")):
        for batch in _batches(root / name, ["text"]):
            figures.add_lengths(batch.column(0), status)
    return figures


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


def load_publication(run_dir: Path, figures: TableFigures | None = None) -> Publication:
    """Read what the report needs; a missing or unreadable file is a NotAPublicationError naming it. `figures`: the
    tables' figures when known already (the publication's writer adds them up as it stages the windows), else read
    here from the tables."""
    root = Path(run_dir)
    if not root.is_dir():
        raise NotAPublicationError(f"{root} is not a directory")
    missing = [name for name in (MANIFEST, RESULTS, REJECTED, ATTEMPTS, VALIDATION) if not (root / name).is_file()]
    if missing:
        raise NotAPublicationError(f"{root} is not a batchgen publication: missing {', '.join(missing)}")
    try:
        manifest = read_manifest(root)
        validation = json.loads((root / VALIDATION).read_text(encoding="utf-8"))
        expectations = manifest.expectations
        figures = table_figures(root) if figures is None else figures
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
    return replace(unsealed_publication(root, manifest, validation, figures), accepted_sample=accepted,
                   rejected_sample=rejected)


def unsealed_publication(root: Path, manifest: Manifest, validation: list[dict[str, Any]],
                         figures: TableFigures) -> Publication:
    """What the charts need of a publication, its tables sealed or not yet: its manifest (as the seal writes it:
    the counts, tokens, start and expectations are there before), its GX results and its tables' `figures`; no
    samples (`load_publication` adds them from the sealed tables)."""
    started = datetime.fromisoformat(manifest.started_at) if manifest.started_at else None
    return Publication(Path(root), manifest, validation, figures.finish_table(), figures.lengths_frame(),
                       figures.chunks_frame(started), [], [], started, manifest.expectations)
