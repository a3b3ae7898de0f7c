"""Durable commits of generated rows, keyed by request fingerprint.

Each finished engine chunk is written as its own Parquet file (temporary name, fsync,
rename), so a crash loses at most the chunk in flight. A rerun of the same job reads the
files back and skips every request whose key is already there.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batchgen.files import replaced
from batchgen.records import ATTEMPT_SCHEMA, Attempt, columns_of

log = logging.getLogger("batchgen.store")


def write_atomic(table: pa.Table, path: Path) -> None:
    """Write a Parquet file so that readers see the old file or the whole new one, never a part."""
    with replaced(path) as tmp:
        pq.write_table(table, tmp)


class ResultStore:
    """A folder of committed chunks for one output location."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def load(self, keys: set[str] | None = None) -> dict[str, list[Attempt]]:
        """Committed attempts grouped by request key: all of them, or only those of `keys`.

        With `keys`, each file's key column is read first and only matching rows are
        materialized, so a window of a large run holds its own results, not the run's.
        """
        done: dict[str, list[Attempt]] = defaultdict(list)
        if not self.root.is_dir() or (keys is not None and not keys):
            return done
        wanted = None if keys is None else pa.array(sorted(keys), pa.string())
        for path in sorted(self.root.glob("chunk-*.parquet")):
            try:
                if wanted is None:
                    table = pq.read_table(path, schema=ATTEMPT_SCHEMA)
                else:
                    mask = pc.is_in(pq.read_table(path, columns=["request_key"])["request_key"], value_set=wanted)
                    if not pc.any(mask).as_py():
                        continue
                    table = pq.read_table(path, schema=ATTEMPT_SCHEMA).filter(mask)
            except (pa.ArrowInvalid, OSError) as exc:  # unreadable: regenerate rather than fail the run
                log.warning("ignoring unreadable commit %s: %s", path.name, exc)
                continue
            for row in table.to_pylist():
                done[row["request_key"]].append(Attempt(**row))
        return done

    def has_commits(self) -> bool:
        return self.root.is_dir() and next(self.root.glob("chunk-*.parquet"), None) is not None

    def commit(self, attempts: list[Attempt]) -> None:
        if not attempts:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pydict(columns_of(attempts, Attempt), schema=ATTEMPT_SCHEMA)
        write_atomic(table, self.root / f"chunk-{uuid.uuid4().hex}.parquet")
