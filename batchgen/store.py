"""Durable commits of generated rows, keyed by request fingerprint.

Each finished engine chunk is written as its own Parquet file (temporary name, fsync,
rename), so a crash loses at most the chunk in flight. A rerun of the same job reads the
files back and skips every request whose key is already there.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from batchgen.schema import ATTEMPT_SCHEMA

log = logging.getLogger("batchgen.store")


def write_atomic(table: pa.Table, path: Path) -> None:
    """Write a Parquet file so that readers see the old file or the whole new one, never a part."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        pq.write_table(table, tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


class ResultStore:
    """A folder of committed chunks for one output location."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def load(self) -> dict[str, list[dict[str, Any]]]:
        """Every committed row, grouped by request key."""
        done: dict[str, list[dict[str, Any]]] = defaultdict(list)
        if not self.root.is_dir():
            return done
        for path in sorted(self.root.glob("chunk-*.parquet")):
            try:
                table = pq.read_table(path, schema=ATTEMPT_SCHEMA)
            except (pa.ArrowInvalid, OSError) as exc:  # unreadable: regenerate rather than fail the run
                log.warning("ignoring unreadable commit %s: %s", path.name, exc)
                continue
            for row in table.to_pylist():
                done[row["request_key"]].append(row)
        return done

    def commit(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist(rows, schema=ATTEMPT_SCHEMA)
        write_atomic(table, self.root / f"chunk-{uuid.uuid4().hex}.parquet")
