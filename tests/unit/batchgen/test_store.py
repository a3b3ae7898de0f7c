"""The result store: durable commits of generated attempts, keyed by request, read back by a rerun."""

from __future__ import annotations

import logging

import pyarrow.parquet as pq

from batchgen.records import ATTEMPT_SCHEMA
from batchgen.store import ResultStore
from tests.publications import generated

def test_store_commit_and_load_round_trip(tmp_path):
    store = ResultStore(tmp_path / "store")
    first = generated("p1", ["a", "b"]) + generated("p2", ["星辰保温杯"])
    second = generated("p3", ["c"], finish=["length"])
    store.commit(first)
    store.commit(second)
    store.commit([])  # nothing to commit writes nothing

    done = store.load()

    assert len(list((tmp_path / "store").glob("chunk-*.parquet"))) == 2
    assert sorted(done) == sorted({r.request_key for r in first + second})
    assert done["key-p1-1-None"] == first[:2]  # both candidates of one request, every field kept
    assert done["key-p2-1-None"] == first[2:]
    assert done["key-p3-1-None"] == second
    for chunk in (tmp_path / "store").glob("chunk-*.parquet"):  # exactly the columns of an attempt
        assert pq.read_schema(chunk).equals(ATTEMPT_SCHEMA)


def test_store_loads_only_the_keys_asked_for(tmp_path):
    store = ResultStore(tmp_path / "store")
    first = generated("p1", ["a", "b"]) + generated("p2", ["c"])
    second = generated("p3", ["d"])
    store.commit(first)
    store.commit(second)

    done = store.load({"key-p1-1-None", "key-p3-1-None", "key-never-committed"})

    assert sorted(done) == ["key-p1-1-None", "key-p3-1-None"]  # p2 is committed but not asked for
    assert done["key-p1-1-None"] == first[:2] and done["key-p3-1-None"] == second
    assert dict(store.load(set())) == {}


def test_forget_keys_lets_go_of_one_stores_cached_keys_and_loads_still_find_them(tmp_path):
    """A run's end drops its store's files from the process's key cache (a deployment's process serves run after
    run); another store's entries stay, and a later load reads the files again."""
    from batchgen import store as store_module

    ours, other = ResultStore(tmp_path / "store"), ResultStore(tmp_path / "store-other")
    ours.commit(generated("p1", ["a"]))
    other.commit(generated("p2", ["b"]))
    assert ours.load({"key-p1-1-None"}) and other.load({"key-p2-1-None"})

    def cached(store):
        return [path for path in store_module._KEYS if path.startswith(f"{store.root}/")]

    assert cached(ours) and cached(other)
    ours.forget_keys()
    assert cached(ours) == [] and cached(other)
    assert sorted(ours.load({"key-p1-1-None"})) == ["key-p1-1-None"]


def test_a_window_passes_by_the_files_its_runs_other_windows_committed_and_any_other_run_finds_them(tmp_path, caplog):
    """A request's key holds its item's id and a run's windows hold different items: a window's load does not open
    what the run's other windows committed (here made unreadable, which would be warned of), and keeps none of
    their keys; its own window's commits (a retried task), another run's and a load without an owner find all."""
    from batchgen import store as store_module

    store = ResultStore(tmp_path / "store")
    first, second = generated("p1", ["a"]), generated("p2", ["b"])
    store.commit(first, ("run-1", "w1"))
    store.commit(second, ("run-1", "w2"))
    inside = f"{store.root}/"
    assert not [path for path in store_module._KEYS if path.startswith(inside)]  # no keys kept for owned files
    [w1_file] = [path for path, owner in store_module._OWNED.items() if owner == ("run-1", "w1")]

    with caplog.at_level(logging.WARNING, logger="batchgen.store"):
        assert dict(store.load({"key-p2-1-None"}, ("run-1", "w2"))) == {"key-p2-1-None": second}
        assert dict(store.load({"key-p1-1-None"}, ("run-1", "w1"))) == {"key-p1-1-None": first}
        assert dict(store.load({"key-p1-1-None"}, ("run-2", "w2"))) == {"key-p1-1-None": first}
        assert dict(store.load({"key-p1-1-None"})) == {"key-p1-1-None": first}
        assert not caplog.records
        (tmp_path / "store" / w1_file.rsplit("/", 1)[1]).write_bytes(b"\x00not parquet")
        store_module._KEYS.clear()  # w1's file is read again from here on
        assert dict(store.load({"key-p1-1-None", "key-p2-1-None"}, ("run-1", "w2"))) == {"key-p2-1-None": second}
        assert not caplog.records  # w2's load never opened w1's file
        store.load({"key-p1-1-None"}, ("run-1", "w1"))
    assert any("unreadable" in r.getMessage() for r in caplog.records)  # w1's own load did

    store.forget_keys()
    assert not [path for path in store_module._OWNED if path.startswith(inside)]


def test_committed_names_the_keys_asked_for_that_a_commit_holds_and_passes_unreadable_files_by(tmp_path, caplog):
    store = ResultStore(tmp_path / "store")
    assert store.committed({"key-p1-1-None"}) == set()  # nothing written yet
    store.commit(generated("p1", ["a", "b"]) + generated("p2", ["c"]))
    store.commit(generated("p3", ["d"]))
    (tmp_path / "store" / "chunk-x.parquet").write_bytes(b"\x00garbage, not a parquet file\xff" * 4)

    with caplog.at_level(logging.WARNING, logger="batchgen.store"):
        found = store.committed({"key-p1-1-None", "key-p3-1-None", "key-never-committed"})

    assert found == {"key-p1-1-None", "key-p3-1-None"}
    assert any("chunk-x.parquet" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert store.committed(set()) == set()


def test_store_of_a_missing_folder_is_empty(tmp_path):
    assert dict(ResultStore(tmp_path / "never-written").load()) == {}


def test_unreadable_chunk_is_skipped_with_a_warning(tmp_path, caplog):
    store = ResultStore(tmp_path / "store")
    store.commit(generated("p1", ["a"]))
    (tmp_path / "store" / "chunk-x.parquet").write_bytes(b"\x00garbage, not a parquet file\xff" * 4)
    (tmp_path / "store" / "chunk-y.parquet").write_bytes(b"")

    with caplog.at_level(logging.WARNING, logger="batchgen.store"):
        done = store.load()

    assert list(done) == ["key-p1-1-None"]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("chunk-x.parquet" in m and "unreadable" in m for m in warned)
    assert any("chunk-y.parquet" in m for m in warned)


def test_store_commit_leaves_no_temporary_files(tmp_path):
    store = ResultStore(tmp_path / "store")
    store.commit(generated("p1", ["a"]))
    assert [p.name for p in (tmp_path / "store").iterdir() if p.name.startswith(".")] == []
