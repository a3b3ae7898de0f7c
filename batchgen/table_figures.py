"""What the report's charts show of a publication's tables, added up a piece of a table at a time.

The report (batchgen.report.read) adds up the sealed tables a batch of rows at a time; the publication's writer
(batchgen.publish.Publication) adds up each window's rows as it stages them, so that the publish step can have the
charts drawn from these figures while it seals the tables, rather than after. Both go through `TableFigures`, so
they are the same figures: outputs per (attempt, finish reason), the engine's tokens per commit of this run, and
the characters of every published output.
"""

from __future__ import annotations

import base64
from collections import Counter
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

ATTEMPT_COLUMNS = ["attempt", "finish_reason", "new_output_tokens", "chunk_seconds", "chunk_finished_at"]
STATUSES = ("accepted", "rejected")


class TableFigures:
    """Outputs per (attempt, finish reason) and tokens per engine commit (from the attempts table), characters of
    every published output (from the accepted and rejected tables), added up in the tables' row order."""

    def __init__(self) -> None:
        self.finish: Counter = Counter()  # (attempt, finish reason) -> outputs
        self.chunks: dict[Any, list[Any]] = {}  # commit time -> [tokens, seconds the commit's chunk took]
        self.lengths: dict[str, list[np.ndarray]] = {status: [] for status in STATUSES}

    def add_attempts(self, rows: pa.RecordBatch | pa.Table) -> None:
        """A piece of the attempts table (any of ATTEMPT_COLUMNS it has). Counted by Arrow's group_by (a fifth of
        what pandas took for a window of 1,024 rows: this runs in every window's staging)."""
        table = pa.Table.from_batches([rows]) if isinstance(rows, pa.RecordBatch) else rows
        if table.num_rows == 0:
            return
        reasons = pc.fill_null(table["finish_reason"].cast(pa.string()), "unknown")
        counted = pa.table({"attempt": table["attempt"].cast(pa.int64()), "finish_reason": reasons}).group_by(
            ["attempt", "finish_reason"], use_threads=False).aggregate([([], "count_all")])
        for attempt, reason, count in zip(*(counted[name].to_pylist()
                                            for name in ("attempt", "finish_reason", "count_all"))):
            self.finish[(attempt, reason)] += count
        if "chunk_finished_at" not in table.column_names:
            return
        timed = table.filter(pc.is_valid(table["chunk_finished_at"]))
        # per commit: its tokens, and the seconds its chunk took as its first row says (the same on every row)
        chunks = timed.group_by("chunk_finished_at", use_threads=False).aggregate([
            ("new_output_tokens", "sum", pc.ScalarAggregateOptions(min_count=0)),
            ("chunk_seconds", "first", pc.ScalarAggregateOptions(skip_nulls=False))])
        for at, tokens, seconds in zip(chunks["chunk_finished_at"].to_pandas(),
                                       chunks["new_output_tokens_sum"].to_pylist(),
                                       chunks["chunk_seconds_first"].to_pylist()):
            self.chunks.setdefault(at, [0, np.nan if seconds is None else seconds])[0] += int(tokens)

    def add_lengths(self, text: pa.Array | pa.ChunkedArray, status: str) -> None:
        """The `text` column of a piece of the accepted table (a missing text counts as 0 characters) or of the
        rejected one (only rows with a text)."""
        if status == "rejected":
            text = pc.drop_null(text)
        self.lengths[status].append(pc.fill_null(pc.utf8_length(text), 0).to_numpy(zero_copy_only=False)
                                    .astype(np.int32))

    def add_tables(self, accepted: pa.Table, rejected: pa.Table, attempts: pa.Table) -> None:
        """A window's pieces of the three tables."""
        self.add_attempts(attempts.select([c for c in ATTEMPT_COLUMNS if c in attempts.column_names]))
        for table, status in ((accepted, "accepted"), (rejected, "rejected")):
            if "text" in table.column_names:
                self.add_lengths(table.column("text"), status)

    def extend(self, other: TableFigures) -> None:
        """Add `other`'s figures after these (its rows come after these rows in the tables)."""
        self.finish.update(other.finish)
        for at, (tokens, seconds) in other.chunks.items():
            self.chunks.setdefault(at, [0, seconds])[0] += tokens
        for status in STATUSES:
            self.lengths[status].extend(other.lengths[status])

    def finish_table(self) -> pd.DataFrame:
        """Rows: attempt number; columns: finish reason; values: outputs."""
        table = pd.Series(self.finish, dtype="int64").unstack(fill_value=0) if self.finish else pd.DataFrame()
        if not table.empty:
            table.index.name, table.columns.name = None, None
            table = table.sort_index()
        return table

    def chunks_frame(self, started: datetime | None) -> pd.DataFrame:
        """Tokens per engine commit finished at or after `started` (a reused result is not this run's work)."""
        rows = [{"chunk_finished_at": at, "tokens": tokens, "chunk_seconds": seconds}
                for at, (tokens, seconds) in sorted(self.chunks.items()) if started is None or at >= started]
        return pd.DataFrame(rows, columns=["chunk_finished_at", "tokens", "chunk_seconds"])

    def lengths_of(self, status: str) -> np.ndarray:
        parts = self.lengths[status]
        return np.concatenate(parts) if parts else np.zeros(0, np.int32)

    def lengths_frame(self) -> pd.DataFrame:
        """chars, status: one row per published output with a text, the accepted ones first."""
        return pd.concat([pd.DataFrame({"chars": self.lengths_of(status), "status": status}) for status in STATUSES],
                         ignore_index=True)

    def to_json(self, lengths: bool = True) -> dict[str, Any]:
        """The figures as JSON values (for a chart worker): the lengths as base64 of their int32 bytes (without
        `lengths`, none: no lengths at all)."""
        return {"finish": [[attempt, reason, count] for (attempt, reason), count in self.finish.items()],
                "chunks": [[pd.Timestamp(at).isoformat(), tokens, None if pd.isna(seconds) else float(seconds)]
                           for at, (tokens, seconds) in self.chunks.items()],
                "lengths": {status: base64.b64encode(self.lengths_of(status).tobytes()).decode("ascii")
                            for status in STATUSES} if lengths else {}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TableFigures:
        figures = cls()
        figures.finish.update({(int(attempt), reason): int(count) for attempt, reason, count in data["finish"]})
        figures.chunks = {pd.Timestamp(at): [int(tokens), np.nan if seconds is None else seconds]
                          for at, tokens, seconds in data["chunks"]}
        figures.lengths = {status: [np.frombuffer(base64.b64decode(data["lengths"][status]), dtype=np.int32)]
                           if status in data["lengths"] else [] for status in STATUSES}
        return figures
