"""The publication: every file and its manifest, Parquet and JSONL agreeing, a layout that datasets, duckdb,
polars and pandas open as it is, and atomic as a set: readers of <out>/current see one whole publication,
never a mix.

Crashes are real: an exception injected at each step of a publication, and a publishing
process killed with SIGKILL at arbitrary moments.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen import files
from batchgen import publish as publishing
from batchgen.assemble import assemble
from batchgen.items import load_items
from batchgen.job import InputSpec, PromptSpec
from batchgen.prompts import build_prompts
from batchgen.publish import REJECTED, RESULTS, Publication, PublishError, current_publication, verify_publication
from batchgen.records import (
    ACCEPTED_FIELDS,
    ATTEMPTS_SCHEMA,
    REJECTED_FIELDS,
    Manifest,
    RunTotals,
)
from batchgen.retry import latest_attempts
from batchgen.schema import INPUT_COLUMN_KEY
from tests.dataset_checks import check_readers
from tests.frames import COLUMNS, with_verdicts
from tests.publications import generated, publish_frames, stage_frames

ROOT = Path(__file__).resolve().parents[3]


def dataset(version: int, n: int) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """n accepted items whose every text says which version wrote it."""
    accepted = pd.DataFrame({
        "item_id": [f"i{k}" for k in range(n)], "row_number": range(2, n + 2), "candidate": 0, "attempt": 1,
        "strategy": "first", "text": [f"v{version} text of item {k} " + "x" * 40 for k in range(n)],
        "finish_reason": "stop", "n_prompt_tokens": 3, "n_output_tokens": 5, "cumulative_logprob": -1.0,
        "max_tokens": 16, "request_id": [str(k) for k in range(n)], "prompt": "p",
        "input": [{"name": f"n{k}", "price": k} for k in range(n)],
    })[ACCEPTED_FIELDS]
    rejected = pd.DataFrame({name: [] for name in REJECTED_FIELDS})
    attempts = pd.DataFrame({name: [] for name in ATTEMPTS_SCHEMA.names})
    return accepted, rejected, attempts


def publish_version(out: Path, version: int, n: int, keep: int = 3) -> dict:
    accepted, rejected, attempts = dataset(version, n)
    return publish_frames(out, accepted, rejected, attempts, [], {"job": "atomic", "version": version,
                                                                  "counts": {"accepted": n}}, True, keep=keep)


def read_current(out: Path) -> tuple[int, int]:
    """What a careful reader does: resolve `current` once, verify the manifest, read from there."""
    directory = current_publication(out)
    manifest = verify_publication(directory)
    texts = pq.read_table(directory / RESULTS, columns=["text"]).column("text").to_pylist()
    version = manifest["version"]
    assert len(texts) == manifest["counts"]["accepted"] == manifest["files"][RESULTS]["rows"]
    assert all(t.startswith(f"v{version} ") for t in texts), "a publication mixes two runs' rows"
    return version, len(texts)


def test_commit_switches_current_and_keeps_the_last_k(tmp_path):
    out = tmp_path / "out"
    names = []
    for version in range(5):
        names.append(publish_version(out, version, 10 + version, keep=2)["publication"])
        assert read_current(out) == (version, 10 + version)
    assert os.readlink(out / "current") == f"publications/{names[-1]}"  # relative: the folder can move
    assert sorted(p.name for p in (out / "publications").iterdir()) == names[-2:]
    assert json.loads((out / ".batchgen" / "publications.json").read_text()) == names[-2:]


def test_staged_publication_is_invisible_until_commit(tmp_path):
    out = tmp_path / "out"
    publish_version(out, 1, 5)
    accepted, rejected, attempts = dataset(2, 7)
    publication = stage_frames(out, accepted, rejected, attempts, [], {"version": 2, "counts": {"accepted": 7}},
                               False)
    (publication.staging / "report.html").write_text("<html>run 2</html>")  # what a report step adds before commit
    assert read_current(out) == (1, 5)
    publication.commit()
    assert read_current(out) == (2, 7)
    assert (out / "current" / "report.html").read_text() == "<html>run 2</html>"


def test_commit_refuses_a_directory_that_is_not_a_staged_publication(tmp_path):
    out = tmp_path / "out"
    publish_version(out, 1, 3)
    stray = tmp_path / "elsewhere"
    stray.mkdir()
    with pytest.raises(PublishError, match="not a sealed publication"):
        Publication(out, stray).commit()
    assert read_current(out) == (1, 3)


def test_a_failure_after_the_switch_never_discards_what_current_points_at(tmp_path, monkeypatch):
    """Once `current` names the new publication, a later failure of the commit (syncing the folder, writing the
    history) leaves it in place: readers already see it, and the run's clean-up must not remove it."""
    out = tmp_path / "out"
    publish_version(out, 1, 5)
    accepted, rejected, attempts = dataset(2, 7)
    real_fsync_dir = publishing.fsync_dir

    def fail_after_switch(path):
        if os.readlink(out / "current") == f"publications/{staged.staging.name}":
            raise OSError("injected failure after the switch")
        return real_fsync_dir(path)

    staged = stage_frames(out, accepted, rejected, attempts, [], {"version": 2, "counts": {"accepted": 7}})
    monkeypatch.setattr(publishing, "fsync_dir", fail_after_switch)
    with pytest.raises(OSError, match="after the switch"), staged:
        staged.commit()
    monkeypatch.undo()
    assert staged.committed and staged.staging.is_dir()
    assert read_current(out) == (2, 7)


@pytest.mark.parametrize("step", ["results", "jsonl mirror", "manifest", "symlink", "switch"])
def test_crash_at_any_step_leaves_the_previous_publication(tmp_path, monkeypatch, step):
    out = tmp_path / "out"
    publish_version(out, 1, 50)

    def boom(*args, **kwargs):
        raise OSError(f"injected crash at {step}")

    if step == "results":  # in the middle of writing the accepted table
        monkeypatch.setattr(publishing.pq.ParquetWriter, "write_table", boom)
    elif step == "jsonl mirror":
        monkeypatch.setattr(publishing, "_write_jsonl", boom)  # a window's part of the mirror
    elif step == "manifest":
        real = files.write_text
        monkeypatch.setattr(publishing, "write_text",
                            lambda text, path, **kw: boom() if path.name == "manifest.json" else real(text, path, **kw))
    elif step == "symlink":
        monkeypatch.setattr(publishing.os, "symlink", boom)
    else:  # the rename of the temporary link onto `current`
        real_replace = os.replace
        monkeypatch.setattr(files.os, "replace",
                            lambda src, dst: boom() if Path(dst).name == "current" else real_replace(src, dst))
    with pytest.raises(OSError, match="injected crash"):
        publish_version(out, 2, 80)
    monkeypatch.undo()

    assert read_current(out) == (1, 50)
    assert [p.name for p in out.iterdir() if p.name.startswith(".current")] == []  # no temporary link left
    publish_version(out, 3, 60)  # the next run publishes normally and clears the crashed staging
    assert read_current(out) == (3, 60)
    assert len(list((out / "publications").iterdir())) == 2


PUBLISHER = """
import sys
from pathlib import Path
from tests.unit.batchgen.test_publish import publish_version
out = Path(sys.argv[1])
version = int(sys.argv[2])
while True:
    version += 1
    publish_version(out, version, 8000 + 500 * (version % 7), keep=2)
    print(version, flush=True)
"""


def _staging_in_progress(out: Path) -> bool:
    """A publication folder exists that the history does not list yet: one is being written."""
    committed = json.loads((out / ".batchgen" / "publications.json").read_text())
    return any(p.name not in committed for p in (out / "publications").iterdir())


def test_sigkill_while_publishing_never_leaves_a_mixed_or_partial_set(tmp_path):
    out = tmp_path / "out"
    publish_version(out, 0, 100)
    version, mid_publication = 0, 0
    # Each kill lands at a different point: as soon as a staging folder appears, or a little after.
    for delay in (0.0, 0.02, 0.1, 0.3):
        process = subprocess.Popen([sys.executable, "-c", PUBLISHER, str(out), str(version)], cwd=ROOT,
                                   stdout=subprocess.PIPE, text=True)
        assert process.stdout.readline().strip()  # one publication committed; now kill it while it writes another
        deadline = time.monotonic() + 30
        while not _staging_in_progress(out) and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        mid_publication += _staging_in_progress(out)
        version, rows = read_current(out)  # verifies every hash: complete, and from one run only
        assert rows == 8000 + 500 * (version % 7)
    assert mid_publication >= 1  # at least one kill landed while a publication was being written


def test_input_columns_whose_types_vary_by_row_publish_as_json_text(tmp_path):
    # JSONL rows may hold a number in one row and text or a list in the next; an unused column must not
    # fail the publication after hours of generation.
    accepted, rejected, attempts = dataset(1, 3)
    accepted["input"] = [{"name": "Mug", "size": 350, "tags": ["a"]},
                         {"name": "Boots", "size": "large", "tags": {}},
                         {"name": "Lamp", "size": None, "tags": "c"}]
    out = tmp_path / "out"
    publish_frames(out, accepted, rejected, attempts, [], {"version": 1, "counts": {"accepted": 3}}, True)
    inputs = [{k: row[k] for k in ("name", "size", "tags")} for row in pq.read_table(out / "current" / RESULTS).to_pylist()]
    assert inputs == [{"name": "Mug", "size": "350", "tags": '["a"]'},
                      {"name": "Boots", "size": '"large"', "tags": "{}"},
                      {"name": "Lamp", "size": None, "tags": '"c"'}]


def _jsonl_row_by_row(table: pa.Table) -> str:
    """What the JSON lines mean: each row of Table.to_pylist() by orjson, times and the like as their str()."""
    import orjson

    option = orjson.OPT_APPEND_NEWLINE | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS
    return b"".join(orjson.dumps(row, default=str, option=option) for row in table.to_pylist()).decode("utf-8")


def test_json_lines_rendered_by_column_are_the_rows_as_they_are():
    """Token ids as NumPy views and each distinct time's str() once give the bytes of the plain row-by-row render:
    null lists, empty lists, a null inside a list, 64-bit and unsigned ids, times with and without a zone, dates,
    durations, intervals, decimals, nested lists, several chunks and a table sliced out of a bigger one."""
    import datetime as dt
    from decimal import Decimal

    utc = dt.timezone.utc
    when = [dt.datetime(2026, 12, 4, 2, 52, 28, 689749, tzinfo=utc), None, dt.datetime(2026, 12, 4, tzinfo=utc),
            dt.datetime(2026, 12, 4, 2, 52, 28, 689749, tzinfo=utc), dt.datetime(1999, 1, 1, tzinfo=utc)]
    table = pa.table({
        "item_id": ["a", "b", "c", "d", "e"],
        "token_ids": pa.array([[1, 2, 3], None, [], [2**31 - 1, -5], [0]], pa.list_(pa.int32())),
        "wide_ids": pa.array([[2**40], [1], None, [], [7, 8]], pa.large_list(pa.int64())),
        "unsigned": pa.array([[255], [0], [1, 2], None, []], pa.list_(pa.uint8())),
        "gappy": pa.array([[1, None], [2], None, [], [3]], pa.list_(pa.int32())),  # a null inside: Python values
        "nested": pa.array([[[1], [2, 3]], None, [[]], [[4]], [None]], pa.list_(pa.list_(pa.int32()))),
        "finished_at": pa.array(when, pa.timestamp("us", tz="UTC")),
        "local": pa.array([w.replace(tzinfo=None) if w else None for w in when], pa.timestamp("ms")),
        "day": pa.array([dt.date(2026, 12, 4), None, dt.date(2026, 1, 1), dt.date(2026, 12, 4), None]),
        "took": pa.array([dt.timedelta(seconds=1.5), None, dt.timedelta(0), dt.timedelta(days=2), None]),
        "price": pa.array([Decimal("1.10"), None, Decimal("0"), Decimal("-3.5"), Decimal("2")]),
        "every": pa.array([pa.MonthDayNano([1, 2, 3]), None, pa.MonthDayNano([0, 0, 0]), None,
                           pa.MonthDayNano([1, 2, 3])], pa.month_day_nano_interval()),
        "score": [0.1, float("nan"), None, 1e300, -0.0],
        "text": ["Mug", "a \u2028 line", "引号\"", None, ""],
    })
    chunked = pa.concat_tables([table.slice(0, 2), table.slice(2)])
    for case in (table, chunked, table.slice(1, 3), chunked.slice(2, 2), table.slice(0, 0)):
        assert publishing._jsonl(case) == _jsonl_row_by_row(case)
    assert publishing._jsonl(table).splitlines()[0].startswith(
        '{"item_id":"a","token_ids":[1,2,3],"wide_ids":[1099511627776]')


def test_json_lines_written_by_polars_are_the_rows_as_they_are(tmp_path):
    """Where every column is of a type Polars writes as orjson does, Polars writes the lines (without the
    interpreter's lock), and they are the bytes of the plain row-by-row render: floats at their edges (NaN and
    infinities as null, exponents, -0.0), text needing escapes, every integer width, nulls, lists, lists of
    structs as logprobs are, times, odd column names, several chunks and slices."""
    import datetime as dt

    utc = dt.timezone.utc
    floats = [0.1, 1e-7, 1e21, 1.5e300, -0.0, 1 / 3, 5e-324, float("nan"), float("inf"), float("-inf"), None, 1e16]
    text = ["plain", "ünïcödé", "中文 描述", "emoji 😀", 'quote " and \\ backslash', "ctl \x00\x01\x1f\x7f",
            "line\nbreak\ttab\r", "\u2028\u2029", "</script>", "", None, "/slash"]
    n = len(floats)
    position = pa.struct([("token_id", pa.int32()), ("token", pa.string()), ("logprob", pa.float64()),
                          ("rank", pa.int32())])
    table = pa.table({
        "score": pa.array(floats, pa.float64()),
        "text": pa.array(text, pa.string()),
        "wide text": pa.array(text, pa.large_string()),
        "ünï \"key\"": pa.array(range(n), pa.int8()),
        "int64": pa.array([2**63 - 1, -2**63, None] + list(range(n - 3)), pa.int64()),
        "uint64": pa.array([2**64 - 1, 0, None] + list(range(n - 3)), pa.uint64()),
        "flag": pa.array([True, False, None] * (n // 3), pa.bool_()),
        "nothing": pa.nulls(n),
        "token_ids": pa.array([[1, 2, 3], None, [], [2**31 - 1, -5], [None, 4]] + [[7]] * (n - 5),
                              pa.list_(pa.int32())),
        "nested": pa.array([[[1], [2, 3]], None, [[]], [[4]], [None]] + [[]] * (n - 5),
                           pa.large_list(pa.list_(pa.int64()))),
        "failed": pa.array([["truncated", "keyword"], [], None, ["ü"]] + [[]] * (n - 4), pa.list_(pa.string())),
        "logprobs": pa.array([[[{"token_id": 1, "token": 'a"\n', "logprob": -0.123, "rank": 1},
                                {"token_id": 2, "token": None, "logprob": float("-inf"), "rank": None}]], None, [],
                              [[]]] + [None] * (n - 4), pa.list_(pa.list_(position))),
        "input": pa.array([{"a": 1, "b": "x"}, None, {"a": None, "b": None}] * (n // 3),
                          pa.struct([("a", pa.int64()), ("b", pa.string())])),
        "finished_at": pa.array([dt.datetime(2026, 12, 4, 2, 52, 28, 689749, tzinfo=utc), None] * (n // 2),
                                pa.timestamp("us", tz="UTC")),
        "local": pa.array([dt.datetime(2026, 12, 4, 2, 52, 28), None] * (n // 2), pa.timestamp("ms")),
        "day": pa.array([dt.date(2026, 12, 4), None] * (n // 2)),
        "took": pa.array([dt.timedelta(seconds=1.5), None] * (n // 2)),
    })
    chunked = pa.concat_tables([table.slice(0, 5), table.slice(5)])
    for number, case in enumerate((table, chunked, table.slice(1, 3), chunked.slice(3, 5), table.slice(0, 0))):
        assert publishing._jsonl_by_polars(case) is not None
        assert publishing._jsonl(case) == _jsonl_row_by_row(case)
        part = tmp_path / f"part-{number}.jsonl"  # a window's part: Polars writes the file itself
        assert publishing._jsonl_by_polars(case, tmp_path / f".part-{number}.tmp") == ""
        publishing._write_jsonl(case, part)
        assert part.read_text(encoding="utf-8") == _jsonl_row_by_row(case)


@pytest.mark.parametrize("column", [pa.array([0.1, None], pa.float32()), pa.array([[("k", 1)], None],
                                                                                  pa.map_(pa.string(), pa.int64())),
                                    pa.array([b"ab", None], pa.binary()), pa.array(["a", None]).dictionary_encode()])
def test_json_lines_of_columns_polars_may_write_otherwise_are_written_by_orjson(column, tmp_path):
    """32-bit floats (Polars writes 0.1, Python's float 0.10000000149011612), maps, binary and dictionaries: the
    table's lines come from orjson, as they are."""
    table = pa.table({"item_id": ["a", "b"], "value": column})
    assert publishing._jsonl_by_polars(table) is None
    assert publishing._jsonl(table) == _jsonl_row_by_row(table)
    publishing._write_jsonl(table, tmp_path / "part.jsonl")
    assert (tmp_path / "part.jsonl").read_text(encoding="utf-8") == _jsonl_row_by_row(table)


def test_json_lines_are_written_by_orjson_where_polars_is_missing_or_writes_its_probe_otherwise(monkeypatch):
    """Without Polars, or with a Polars whose writer renders the probe differently (another release, say), every
    table's lines come from orjson, the same bytes."""
    import sys
    import types

    table = pa.table({"item_id": ["a", "b"], "score": [0.5, None],
                      "token_ids": pa.array([[1], []], pa.list_(pa.int32()))})
    other = types.SimpleNamespace(from_arrow=lambda t: types.SimpleNamespace(write_ndjson=lambda: "{}\n"))
    for stand_in in (None, other):  # None in sys.modules: `import polars` raises ImportError
        monkeypatch.setitem(sys.modules, "polars", stand_in)
        monkeypatch.setattr(publishing, "_POLARS", False)
        assert publishing._polars() is None
        assert publishing._jsonl_by_polars(table) is None
        assert publishing._jsonl(table) == _jsonl_row_by_row(table)


def test_windows_staged_as_parts_join_into_one_file_per_table(tmp_path):
    """Parts whose columns Arrow inferred differently (null in one window, numbers or text in others) join."""
    from batchgen.publish import PARTS

    out = tmp_path / "out"
    publication = Publication.open(out, jsonl=True)
    rejected, attempts = dataset(0, 0)[1:]
    windows = [(["a", "b"], [None, None]), (["c"], [0.5]), (["d"], ["high"])]
    for index, (ids, scores) in enumerate(windows, start=1):
        accepted = dataset(index, len(ids))[0].assign(item_id=ids, score=scores)
        inputs = (pa.string(), lambda value: None)  # no input columns
        publication.add_window(index, accepted, rejected, attempts, inputs, RunTotals())

    manifest = publication.seal(Manifest(job="parts"), [])
    staged = publication.staging

    joined = pq.read_table(staged / RESULTS)
    assert joined.column("item_id").to_pylist() == ["a", "b", "c", "d"]
    assert joined.schema.field("score").type == pa.string()  # a number in one window, text in another
    assert joined.column("score").to_pylist() == [None, None, "0.5", "high"]
    assert joined.column("row_number").to_pylist() == [2, 3, 2, 2]
    assert manifest["files"][RESULTS]["rows"] == 4
    lines = (staged / "jsonl" / "accepted.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["item_id"] for line in lines] == ["a", "b", "c", "d"]
    # each window's lines were rendered when it was staged; a window whose column the join made text is re-rendered
    assert [json.loads(line)["score"] for line in lines] == [None, None, "0.5", "high"]
    assert not (staged / PARTS).exists()
    verify_publication(staged)


def _windows(spec: list[tuple[int, list[str], list[Any]]]) -> list[tuple[int, pd.DataFrame, pd.DataFrame]]:
    """Windows' frames (index, accepted, attempts) from (index, item ids, scores): rows in some windows' attempts."""
    windows = []
    for index, ids, scores in spec:
        accepted = dataset(index, len(ids))[0].assign(item_id=ids, score=scores)
        attempts = dataset(0, 0)[2] if index % 2 else with_verdicts(
            [row for i in ids for row in generated(i, [f"text {i}"])], [[] for _ in ids])
        windows.append((index, accepted, attempts))
    return windows


def _staged(out: Path, windows: list[tuple[int, pd.DataFrame, pd.DataFrame]], threads: bool = False,
            join: bool = True) -> tuple[Publication, dict[str, Any]]:
    """A publication of `windows` (`_windows`), added in the order given (or each from a thread of its own, all at
    once), sealed; with join=False the join during staging is turned off (seal joins the parts). Returns it and
    its tables' manifest entries."""
    import threading

    publication = Publication.open(out, jsonl=True)
    if not join:
        publication._join.broken = "turned off by the test"
    rejected = dataset(0, 0)[1]

    def add(index: int, accepted: pd.DataFrame, attempts: pd.DataFrame) -> None:
        publication.add_window(index, accepted, rejected, attempts, (pa.string(), lambda value: None), RunTotals())

    if threads:
        started = [threading.Thread(target=add, args=window) for window in windows]
        for thread in started:
            thread.start()
        for thread in started:
            thread.join()
    else:
        for window in windows:
            add(*window)
    files = publication.seal(Manifest(job="join"), [])["files"]
    return publication, {name: entry for name, entry in files.items() if name.endswith((".parquet", ".jsonl"))}


def test_windows_are_joined_as_they_are_staged_into_the_same_files_seal_would_write(tmp_path):
    """Seal has only the last windows left to write: the tables are joined, in window order, as windows are
    staged, whatever order they come in; the files are byte for byte the ones a join of the parts at seal writes."""
    windows = _windows([(k, [f"w{k}-{j}" for j in range(k + 1)], [0.5 * k] * (k + 1)) for k in range(1, 9)])
    at_seal, expected = _staged(tmp_path / "at-seal", windows, join=False)
    assert at_seal.join_fallback == "turned off by the test"
    for name, order, threads in (("in-order", windows, False), ("shuffled", windows[::-1][:4] + windows[:4], False),
                                 ("threads", windows, True)):
        publication, files = _staged(tmp_path / name, order, threads=threads)
        assert publication.join_fallback is None, name
        assert len(files) == 6 and files == expected, name  # every table and mirror: the same rows and SHA-256
        ids = pq.read_table(publication.staging / RESULTS, columns=["item_id"])["item_id"].to_pylist()
        assert ids == [f"w{k}-{j}" for k in range(1, 9) for j in range(k + 1)], name
        verify_publication(publication.staging)


def test_a_window_without_accepted_rows_does_not_change_a_column_s_type(tmp_path):
    """A window can accept nothing (every item rejected): its structured-output column, of which it has no value,
    is text there and says nothing of the column's type; the published column keeps the type of the windows that
    have values (it was text for the whole table), and the windows are joined as staged."""
    publication = Publication.open(tmp_path / "out", jsonl=True)
    rejected = dataset(0, 0)[1]
    for index, ids, scores in ((1, ["a", "b"], [1, 2]), (2, [], []), (3, ["c"], [3])):
        accepted = dataset(index, len(ids))[0].assign(item_id=ids, score=pd.Series(scores, dtype=object))
        publication.add_window(index, accepted, rejected, dataset(0, 0)[2], (pa.string(), lambda value: None),
                               RunTotals())
    publication.seal(Manifest(job="empty window"), [])
    joined = pq.read_table(publication.staging / RESULTS)
    assert publication.join_fallback is None
    assert joined.schema.field("score").type == pa.int64() and joined["score"].to_pylist() == [1, 2, 3]
    lines = (publication.staging / "jsonl" / "accepted.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["score"] for line in lines] == [1, 2, 3]
    verify_publication(publication.staging)


@pytest.mark.parametrize("later, reason", [([3.0], "a later window changed the columns of accepted"),
                                           ([0.5], "window 2: ArrowInvalid")])
def test_a_later_window_that_changes_a_column_s_type_is_joined_at_seal(tmp_path, later, reason):
    """The join writes each table with its first window's columns: integers there, floats later (which the
    integer column may or may not hold), the parts are joined again at seal as floats (what a join of all the
    parts gives)."""
    publication, files = _staged(tmp_path / "out", _windows([(1, ["a", "b"], [1, 2]), (2, ["c"], later)]))
    assert publication.join_fallback.startswith(reason)
    joined = pq.read_table(publication.staging / RESULTS)
    assert joined.schema.field("score").type == pa.float64()
    assert joined.column("score").to_pylist() == [1.0, 2.0, *later] and files[RESULTS]["rows"] == 3
    verify_publication(publication.staging)


def test_a_window_staged_twice_is_published_once_as_last_staged(tmp_path):
    """A window's stage task run again (a Prefect retry) writes its parts again: the join stops, seal joins the
    parts, and the window's rows are its last staging's, once."""
    publication, _ = _staged(tmp_path / "out", _windows([(1, ["a"], [1.0]), (2, ["b"], [2.0]),
                                                             (1, ["a2", "a3"], [1.0, 1.0])]))
    assert publication.join_fallback == "window 1 staged twice"
    assert pq.read_table(publication.staging / RESULTS)["item_id"].to_pylist() == ["a2", "a3", "b"]


def test_a_join_that_fails_leaves_the_parts_to_seal(tmp_path, monkeypatch):
    """A write of the join that fails (a full disk, say) does not fail the window nor hold up seal: the parts
    are joined at seal, where a lasting error would show."""
    def failing(self, index, tables, schemas):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(publishing._WindowJoin, "_write", failing)
    publication, files = _staged(tmp_path / "out", _windows([(1, ["a"], [1.0]), (2, ["b"], [2.0])]))
    assert publication.join_fallback == "window 1: OSError: [Errno 28] No space left on device"
    assert pq.read_table(publication.staging / RESULTS)["item_id"].to_pylist() == ["a", "b"]
    assert files[RESULTS]["rows"] == 2


def test_a_gap_in_the_windows_is_joined_at_seal(tmp_path):
    """Windows are numbered from 1 with no gap; a publication whose windows are not still publishes them all."""
    publication, _ = _staged(tmp_path / "out", _windows([(2, ["b"], [2.0]), (5, ["e"], [5.0])]))
    assert publication.join_fallback == "windows [] joined of [2, 5]"
    assert pq.read_table(publication.staging / RESULTS)["item_id"].to_pylist() == ["b", "e"]


def test_published_tables_are_written_in_bounded_row_groups(tmp_path):
    """Readers (the shard merge, the report, a dataset scan) decode one row group at a time: keep them bounded."""
    from batchgen.publish import ROW_GROUP_ROWS

    rows = 2 * ROW_GROUP_ROWS + 5
    table = pa.table({"item_id": [f"i{j}" for j in range(rows)], "text": ["x" * 40] * rows})
    out = tmp_path / "out"
    publication = Publication.open(out, jsonl=False)
    publication.seal(Manifest(job="rows"), [], tables={RESULTS: (table.schema, [table])})  # the shard merge's way
    published = pq.ParquetFile(publication.commit() / RESULTS)
    sizes = [published.metadata.row_group(i).num_rows for i in range(published.metadata.num_row_groups)]
    assert sizes == [ROW_GROUP_ROWS, ROW_GROUP_ROWS, 5]
    assert published.read().equals(table)


KILLED_STAGER = """
import sys
from pathlib import Path
from batchgen.publish import Publication
staging = Publication.open(Path(sys.argv[1])).staging
(staging / "results.parquet").write_bytes(b"x" * 1000)  # a full copy of the data, in the real case
print(staging, flush=True)
sys.stdin.readline()  # alive (its staging locked) until told to go
"""


def stager(out: Path) -> tuple[subprocess.Popen, Path]:
    process = subprocess.Popen([sys.executable, "-c", KILLED_STAGER, str(out)], cwd=ROOT, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    return process, Path(process.stdout.readline().strip())


def test_stagings_of_killed_runs_are_removed_by_the_next_run_but_a_live_ones_is_not(tmp_path):
    out = tmp_path / "out"
    publish_version(out, 1, 10)
    live, live_staging = stager(out)  # another run, still writing its staging
    try:
        killed = []
        for _ in range(2):  # two runs killed while staging, one after the other
            process, staging = stager(out)
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
            killed.append(staging)
        # the second run's start removed the first one's staging: never more than one left behind
        assert [path.is_dir() for path in killed] == [False, True]

        staging = Publication.open(out).staging  # the next run
        assert not killed[1].exists()
        assert live_staging.is_dir()  # another run is writing it: left alone
        assert publishing.clean_stale(out) == []  # nothing else is stale, this run's own staging included
        assert staging.is_dir()
    finally:
        live.stdin.close()
        live.wait(timeout=30)
    assert publishing.clean_stale(out) == [live_staging]  # its writer is gone now
    assert read_current(out) == (1, 10)  # the committed publication was never touched


def test_commit_prunes_old_publications_but_not_a_staging_being_written(tmp_path):
    out = tmp_path / "out"
    for version in range(1, 4):
        publish_version(out, version, 5, keep=1)
    other = Publication.open(out).staging  # a run that is staging while this one commits
    publish_version(out, 4, 5, keep=1)
    assert sorted(p.name for p in (out / "publications").iterdir()) == sorted(
        [current_publication(out).name, other.name])
    assert read_current(out) == (4, 5)


def test_every_reader_opens_each_table(publication, tmp_path):
    out, manifest, _ = publication
    tables = check_readers(out, manifest, tmp_path / "hf-cache")
    assert sorted(tables["accepted"]["item_id"]) == ["s1", "s3"]
    assert sorted(tables["rejected"]["item_id"]) == ["s1@row-4", "s2"]


def test_input_columns_are_flat_under_their_own_names_or_prefixed(publication):
    out, _, _ = publication
    accepted = pd.read_parquet(out / "current" / "accepted").set_index("item_id")
    # text and stage are batchgen's columns: the input's are input_text (taken by the input itself, so
    # input_input_text) and input_stage; the id column is item_id, not repeated
    assert list(accepted.columns[accepted.columns.get_loc("prompt") + 1:][:4]) == [
        "name", "input_input_text", "input_stage", "input_text"]
    assert "sku" not in accepted.columns
    assert accepted.loc["s1", "text"] == "The Mug keeps coffee hot."  # the output
    assert accepted.loc["s1", "input_input_text"] == "keeps coffee hot"  # the input's text
    assert (accepted.loc["s1", "input_stage"], accepted.loc["s1", "input_text"]) == ("draft", "a")
    rejected = pd.read_parquet(out / "current" / "rejected").set_index("item_id")
    assert rejected.loc["s2", "stage"] == "validate" and rejected.loc["s2", "input_stage"] == "final"
    assert rejected.loc["s1@row-4", "name"] == "Mug again"
    # each published input column says which input column it is
    field = pq.read_schema(out / "current" / RESULTS).field("input_input_text")
    assert field.metadata[INPUT_COLUMN_KEY] == b"text"


def test_row_number_finds_the_row_in_the_input(publication):
    out, _, path = publication
    frame = pd.read_csv(path, dtype=str)  # what a user reads the input with
    for table in ("accepted", "rejected"):
        for row in pd.read_parquet(out / "current" / table).itertuples():
            assert frame.iloc[row.row_number - 1]["name"] == row.name, (table, row.item_id)
    rejected = pd.read_parquet(out / "current" / REJECTED.split("/")[0]).set_index("item_id")
    assert rejected.loc["s1@row-4", "row_number"] == 4  # the blank line is not counted


def publish_scenario(scenario, out_dir: Path, jsonl: bool = True) -> dict[str, Any]:
    result = assemble(scenario.items, COLUMNS, scenario.early, latest_attempts(scenario.attempts))
    validation = [{"success": False, "results": [], "statistics": {"evaluated_expectations": 1}}]
    return publish_frames(out_dir, result.accepted, result.rejected, scenario.attempts, validation,
                          {"job": "unit", "counts": {"items": 6}}, jsonl)


def test_publish_writes_every_file(scenario, tmp_path):
    out = tmp_path / "out"
    manifest = publish_scenario(scenario, out)

    assert sorted(p.name for p in out.iterdir()) == [".batchgen", "current", "publications"]
    names = sorted(str(p.relative_to(out / "current")) for p in (out / "current").rglob("*") if p.is_file())
    assert names == sorted(["accepted/accepted.parquet", "rejected/rejected.parquet", "attempts/attempts.parquet",
                            "validation.json", "manifest.json", "README.md", "jsonl/accepted.jsonl",
                            "jsonl/rejected.jsonl", "jsonl/attempts.jsonl"])
    assert json.loads((out / "current" / "manifest.json").read_text(encoding="utf-8")) == manifest
    assert manifest["job"] == "unit" and manifest["counts"]["items"] == 6
    assert json.loads((out / "current" / "validation.json").read_text(encoding="utf-8"))[0]["success"] is False
    assert pq.read_table(out / "current" / "accepted").num_rows == 2  # a table is its folder
    assert pq.read_table(out / "current" / "rejected").num_rows == 4
    assert pq.read_table(out / "current" / "attempts").num_rows == len(scenario.attempts)
    assert pq.read_table(out / "current" / "attempts" / "attempts.parquet").schema.equals(ATTEMPTS_SCHEMA)


def test_publish_without_jsonl_writes_no_mirrors(scenario, tmp_path):
    out = tmp_path / "out"
    manifest = publish_scenario(scenario, out, jsonl=False)
    assert not list((out / "current").rglob("*.jsonl"))
    assert sorted(manifest["files"]) == ["README.md", "accepted/accepted.parquet", "attempts/attempts.parquet",
                                         "rejected/rejected.parquet", "validation.json"]


@pytest.mark.parametrize("stem", ["accepted", "rejected", "attempts"])
def test_parquet_and_jsonl_rows_agree(scenario, tmp_path, stem):
    out = tmp_path / "out"
    publish_scenario(scenario, out)

    from_parquet = pq.read_table(out / "current" / stem / f"{stem}.parquet").to_pylist()
    lines = (out / "current" / "jsonl" / f"{stem}.jsonl").read_text(encoding="utf-8").splitlines()
    from_jsonl = [json.loads(line) for line in lines]

    assert len(from_parquet) == len(from_jsonl) > 0
    assert from_jsonl == from_parquet


def test_published_rows_hold_the_values(scenario, tmp_path):
    out = tmp_path / "out"
    publish_scenario(scenario, out)
    results = {r["item_id"]: r for r in pq.read_table(out / "current" / "accepted").to_pylist()}
    rejected = {r["item_id"]: r for r in pq.read_table(out / "current" / "rejected").to_pylist()}

    assert results["p1"]["candidate"] == 1
    assert (results["p1"]["name"], results["p1"]["feature"]) == ("耳机", "降噪")  # the input's columns, flat
    assert "input" not in results["p1"]
    assert results["p2"]["attempt"] == 2
    assert rejected["line-9"]["candidate"] is None
    assert (rejected["line-9"]["name"], rejected["line-9"]["feature"]) == (None, None)
    assert (rejected["p4"]["name"], rejected["p4"]["feature"]) == ("Blank", "")
    assert rejected["p3"]["reasons"] == ["keyword", "length"]
    assert rejected["p5"]["reasons"] == ["not_generated"]


def test_jsonl_keeps_non_ascii_characters(scenario, tmp_path):
    out = tmp_path / "out"
    publish_scenario(scenario, out)
    raw = (out / "current" / "jsonl" / "accepted.jsonl").read_bytes()
    assert "耳机".encode("utf-8") in raw
    assert "这款耳机降噪出色".encode("utf-8") in raw
    assert b"\\u" not in raw
    assert "耳机".encode("utf-8") in (out / "current" / "jsonl" / "attempts.jsonl").read_bytes()


def test_manifest_records_the_sha256_and_rows_of_each_file(scenario, tmp_path):
    out = tmp_path / "out"
    manifest = publish_scenario(scenario, out)

    files = manifest["files"]
    assert sorted(files) == sorted(["accepted/accepted.parquet", "jsonl/accepted.jsonl", "rejected/rejected.parquet",
                                    "jsonl/rejected.jsonl", "attempts/attempts.parquet", "jsonl/attempts.jsonl",
                                    "validation.json", "README.md"])
    for name, entry in files.items():
        assert entry["sha256"] == hashlib.sha256((out / "current" / name).read_bytes()).hexdigest(), name
    assert files["accepted/accepted.parquet"]["rows"] == files["jsonl/accepted.jsonl"]["rows"] == 2
    assert files["rejected/rejected.parquet"]["rows"] == 4
    assert files["attempts/attempts.parquet"]["rows"] == len(scenario.attempts)


def test_publish_leaves_no_temporary_files(scenario, tmp_path):
    out = tmp_path / "out"
    publish_scenario(scenario, out)
    publish_scenario(scenario, out)  # publishing again adds a publication and switches to it
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == [".batchgen"]
    for publication in (out / "publications").iterdir():
        assert [p.name for p in publication.rglob("*") if p.name.startswith(".")] == []


def test_republish_replaces_the_previous_publication(scenario, tmp_path):
    out = tmp_path / "out"
    publish_scenario(scenario, out)
    scenario.attempts = scenario.attempts[scenario.attempts["item_id"] != "p3"]
    manifest = publish_scenario(scenario, out)
    rejected = {r["item_id"]: r for r in pq.read_table(out / "current" / "rejected").to_pylist()}
    assert rejected["p3"]["reasons"] == ["not_generated"]
    assert manifest["files"]["rejected/rejected.parquet"]["sha256"] == hashlib.sha256(
        (out / "current" / "rejected" / "rejected.parquet").read_bytes()).hexdigest()


def test_input_with_an_empty_csv_cell_publishes(tmp_path):
    # load -> assemble -> publish, with one empty cell in a column the prompt does not use
    path = tmp_path / "items.csv"
    path.write_text("product_id,name,note\np1,Mug,\np2,Boots,waterproof\n", encoding="utf-8")
    loaded = load_items(InputSpec(path=str(path), id_column="product_id"))
    attempts = pd.concat([with_verdicts(generated("p1", ["A sturdy mug."]), [[]]),
                          with_verdicts(generated("p2", ["Dry feet."]), [[]])], ignore_index=True)
    result = assemble(loaded.items, loaded.columns, loaded.rejected, latest_attempts(attempts))

    publish_frames(tmp_path / "out", result.accepted, result.rejected, attempts, [], {}, True, id_column="product_id")

    rows = {r["item_id"]: r for r in pq.read_table(tmp_path / "out" / "current" / "accepted").to_pylist()}
    assert {k: rows["p1"][k] for k in ("name", "note")} == {"name": "Mug", "note": None}
    assert "product_id" not in rows["p1"]  # one id column: item_id holds it
    assert rows["p2"]["note"] == "waterproof"


def test_row_rejected_for_an_empty_field_publishes(tmp_path, tokenizer):
    # the documented path for an empty template field: missing_field rejection, published with its input
    path = tmp_path / "items.csv"
    path.write_text("product_id,name,feature\np1,Mug,hot\np2,Boots,\n", encoding="utf-8")
    loaded = load_items(InputSpec(path=str(path), id_column="product_id"))
    built = build_prompts(loaded.items, PromptSpec(template="{{ name }}: {{ feature }}"), tokenizer, 2048,
                          loaded.columns)
    attempts = with_verdicts(generated("p1", ["A sturdy mug."]), [[]])
    result = assemble(loaded.items, loaded.columns, loaded.rejected + built.rejected, latest_attempts(attempts))

    publish_frames(tmp_path / "out", result.accepted, result.rejected, attempts, [], {}, True, id_column="product_id")

    [rejected] = pq.read_table(tmp_path / "out" / "current" / "rejected").to_pylist()
    assert (rejected["item_id"], rejected["reasons"]) == ("p2", ["missing_field"])
    assert {k: rejected[k] for k in ("name", "feature")} == {"name": "Boots", "feature": None}


def test_json_lines_hold_each_rows_values_as_json_reads_them():
    """The JSON-lines mirror (orjson): one line per row, text as UTF-8, lists and structs as JSON, times as text,
    NaN as null (JSON has no NaN)."""
    from datetime import datetime, timezone

    from batchgen.publish import _jsonl

    at = datetime(2026, 12, 2, 20, 0, 0, 123456, tzinfo=timezone.utc)
    table = pa.table({
        "item_id": ["a", "b"],
        "text": ["星辰保温杯 \"quoted\"\nnext line", None],
        "score": [1e-05, float("nan")],
        "token_ids": [[1, 2, 3], []],
        "input": [{"name": "Mug", "price": 12}, None],
        "finished_at": pa.array([at, None], pa.timestamp("us", tz="UTC")),
    })
    lines = _jsonl(table).splitlines()
    assert [json.loads(line) for line in lines] == [
        {"item_id": "a", "text": "星辰保温杯 \"quoted\"\nnext line", "score": 1e-05, "token_ids": [1, 2, 3],
         "input": {"name": "Mug", "price": 12}, "finished_at": "2026-12-02 20:00:00.123456+00:00"},
        {"item_id": "b", "text": None, "score": None, "token_ids": [], "input": None, "finished_at": None},
    ]
    assert "星辰保温杯" in lines[0]  # not \u-escaped
