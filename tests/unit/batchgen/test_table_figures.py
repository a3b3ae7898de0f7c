"""The report's figures of a publication's tables (batchgen.table_figures): the same whether added up from the
sealed tables a batch at a time or from each window's rows as the writer stages them, and the same after the trip
to a chart worker as JSON."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pyarrow as pa

from batchgen.table_figures import TableFigures

STARTED = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)


def attempts_table() -> pa.Table:
    """Attempts of three windows' rows: a commit (chunk) whose outputs span two windows, a reused one from before
    the run, one without a time, a missing finish reason and a chunk without its seconds."""
    at = [STARTED + timedelta(seconds=s) for s in (1, 1, 2, 2, 2, -60, 3, 4)]
    return pa.table({
        "attempt": [1, 1, 1, 1, 2, 1, 1, 2],
        "finish_reason": ["stop", "length", "length", "stop", "stop", "stop", None, "length"],
        "new_output_tokens": [10, 16, 16, 7, 9, 12, 3, 32],
        "chunk_seconds": [0.5, 0.5, 0.75, 0.75, 0.75, 1.0, None, 1.25],
        "chunk_finished_at": pa.array(at[:7] + [None], pa.timestamp("us", tz="UTC")),
    })


def text_table(texts: list[str | None]) -> pa.Table:
    return pa.table({"item_id": [f"i{n}" for n in range(len(texts))], "text": pa.array(texts, pa.string())})


ACCEPTED = ["A mug.", None, "Une lampe éclairée.", "Headphones", "ok"]
REJECTED = [None, "too long " * 5, "<script>", None]


def frames(figures: TableFigures) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    return figures.finish_table(), figures.chunks_frame(STARTED), figures.lengths_frame()


def assert_same(a: TableFigures, b: TableFigures) -> None:
    for mine, theirs in zip(frames(a), frames(b)):
        pd.testing.assert_frame_equal(mine, theirs)


def whole() -> TableFigures:
    figures = TableFigures()
    figures.add_tables(text_table(ACCEPTED), text_table(REJECTED), attempts_table())
    return figures


def test_the_figures_count_outputs_per_attempt_and_reason_tokens_per_commit_of_this_run_and_characters():
    finish, chunks, lengths = frames(whole())
    assert finish.to_dict() == {"length": {1: 2, 2: 1}, "stop": {1: 3, 2: 1}, "unknown": {1: 1, 2: 0}}
    # the commit at +2 s holds three outputs (two windows' in the split below); the reused one (-60 s) is not this
    # run's; the one without a time is not a commit
    assert chunks["tokens"].tolist() == [26, 32, 3]
    assert chunks["chunk_seconds"].iloc[:2].tolist() == [0.5, 0.75] and np.isnan(chunks["chunk_seconds"].iloc[2])
    assert lengths["status"].tolist() == ["accepted"] * 5 + ["rejected"] * 2
    assert lengths["chars"].tolist() == [6, 0, 19, 10, 2, 45, 8]


def test_windows_added_one_after_another_give_the_figures_of_their_joined_tables():
    accepted, rejected, attempts = text_table(ACCEPTED), text_table(REJECTED), attempts_table()
    joined = TableFigures()
    for start, stop in ((0, 3), (3, 5), (5, 8)):  # the +2 s commit spans the first two windows
        window = TableFigures()
        window.add_tables(*(table.slice(start, stop - start) for table in (accepted, rejected, attempts)))
        joined.extend(window)
    assert_same(joined, whole())


def test_the_figures_come_back_the_same_from_their_json_and_without_lengths_when_not_asked():
    figures = whole()
    assert_same(TableFigures.from_json(figures.to_json()), figures)
    bare = TableFigures.from_json(figures.to_json(lengths=False))
    assert bare.lengths_frame().empty
    pd.testing.assert_frame_equal(bare.finish_table(), figures.finish_table())
    pd.testing.assert_frame_equal(bare.chunks_frame(STARTED), figures.chunks_frame(STARTED))
    empty = TableFigures()
    assert all(frame.empty for frame in frames(TableFigures.from_json(empty.to_json())))
