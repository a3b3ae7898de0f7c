"""Durable commits of generated rows, keyed by request fingerprint.

Each finished engine chunk is written as its own Parquet file (temporary name, fsync,
rename), so a crash loses at most the chunk in flight. A rerun of the same job reads the
files back and skips every request whose key is already there.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batchgen.files import replaced
from batchgen.records import ATTEMPT_SCHEMA, Attempt, columns_of

log = logging.getLogger("batchgen.store")


def write_atomic(table: pa.Table, path: Path, sync: bool = True) -> None:
    """Write a Parquet file so that readers see the old file or the whole new one, never a part (`sync=False`
    leaves the fsync to the caller)."""
    with replaced(path, sync=sync) as tmp:
        pq.write_table(table, tmp)


# Each commit file's request keys, by path, size and mtime: a run's windows each ask the store for their own keys,
# and without this every window would read every earlier window's files again (quadratic in the run's length).
# Commit files are never changed once written (a new commit is a new file), so an entry stays right. A run lets go
# of its store's entries when it ends (`ResultStore.forget_keys`): a process that serves run after run (a
# deployment) would otherwise hold every key it ever committed or read (0.14 KB per item: a run's keys were most of
# what Python itself held more at its publish step, benchmarks/results/cpu-memory-python-held/).
_KEYS: dict[str, tuple[int, int, frozenset[str]]] = {}
_KEYS_LOCK = threading.Lock()

# The commit files this process wrote for a window of a run, by path: (run, window). A request's key holds its
# item's id, and a run's windows hold different items, so a window never finds its requests in the files another
# window of the same run committed: its loads skip them unread (`ResultStore.load(owner=...)`), and their keys are
# not kept at all (they were most of `_KEYS` in a long run, and every window's load went through every earlier
# window's keys: quadratic in the run's length). Let go with `_KEYS` when the run ends.
_OWNED: dict[str, tuple[str, str]] = {}


def _file_keys(path: Path) -> frozenset[str]:
    stat = path.stat()
    with _KEYS_LOCK:
        known = _KEYS.get(str(path))
    if known is not None and known[:2] == (stat.st_size, stat.st_mtime_ns):
        return known[2]
    keys = frozenset(pq.read_table(path, columns=["request_key"])["request_key"].to_pylist())
    with _KEYS_LOCK:
        _KEYS[str(path)] = (stat.st_size, stat.st_mtime_ns, keys)
    return keys


class ResultStore:
    """A folder of committed chunks for one output location."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def load(self, keys: set[str] | None = None, owner: tuple[str, str] | None = None) -> dict[str, list[Attempt]]:
        """Committed attempts grouped by request key: all of them, or only those of `keys`.

        With `keys`, only files holding one of them are read (each file's keys are read once per process and
        remembered, `_file_keys`), and only matching rows are materialized, so a window of a large run holds its
        own results, not the run's. `owner`: the (run, window) asking, whose keys are its own items' (see
        `commit`): the files this process committed for the run's other windows are not looked at.
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
                    committed_by = _OWNED.get(str(path)) if owner is not None else None
                    if committed_by is not None and committed_by[0] == owner[0] and committed_by[1] != owner[1]:
                        continue  # another window's items: none of these keys
                    if _file_keys(path).isdisjoint(keys):
                        continue
                    table = pq.read_table(path, schema=ATTEMPT_SCHEMA)
                    table = table.filter(pc.is_in(table["request_key"], value_set=wanted))
            except (pa.ArrowInvalid, OSError) as exc:  # unreadable: regenerate rather than fail the run
                log.warning("ignoring unreadable commit %s: %s", path.name, exc)
                continue
            for row in table.to_pylist():
                done[row["request_key"]].append(Attempt(**row))
        return done

    def forget_keys(self) -> None:
        """Drop this store's files from the process's cache of their keys (`_file_keys`); a later load reads them
        again."""
        inside = f"{self.root}{os.sep}"
        with _KEYS_LOCK:
            for path in [path for path in _KEYS if path.startswith(inside)]:
                del _KEYS[path]
            for path in [path for path in _OWNED if path.startswith(inside)]:
                del _OWNED[path]

    def committed(self, keys: set[str]) -> set[str]:
        """Which of `keys` have committed attempts, reading only the files' key columns (`batchgen check`: how much
        of a job a run would reuse). An unreadable file counts as nothing committed, as `load` ignores it."""
        found: set[str] = set()
        if not self.root.is_dir() or not keys:
            return found
        for path in sorted(self.root.glob("chunk-*.parquet")):
            try:
                found |= keys & _file_keys(path)
            except (pa.ArrowInvalid, OSError) as exc:
                log.warning("ignoring unreadable commit %s: %s", path.name, exc)
        return found

    def has_commits(self) -> bool:
        return self.root.is_dir() and next(self.root.glob("chunk-*.parquet"), None) is not None

    def commit(self, attempts: list[Attempt], owner: tuple[str, str] | None = None) -> None:
        """Write the attempts as a new commit file. `owner`: the (run, window) whose requests they all are: the
        run's other windows' loads pass the file by, and its keys are read back only if its own window asks
        (a retried task); without it the file's keys are remembered for every load (`_file_keys`)."""
        if not attempts:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pydict(columns_of(attempts, Attempt), schema=ATTEMPT_SCHEMA)
        path = self.root / f"chunk-{uuid.uuid4().hex}.parquet"
        write_atomic(table, path)
        if owner is not None:
            with _KEYS_LOCK:
                _OWNED[str(path)] = owner
            return
        stat = path.stat()
        with _KEYS_LOCK:
            _KEYS[str(path)] = (stat.st_size, stat.st_mtime_ns, frozenset(a.request_key for a in attempts))
