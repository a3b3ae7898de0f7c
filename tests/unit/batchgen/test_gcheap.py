"""The run's collector view: what the process held at the start of a run is frozen while runs are going on."""

from __future__ import annotations

import gc
import threading

from batchgen.gcheap import frozen_heap


def _walked_by_the_collector(*objs) -> list[bool]:
    """Whether each object sits in one of the collector's generations (what a collection walks), not frozen.
    By identity rather than by gc.get_freeze_count(): other threads of a test session (Prefect's, pytest-xdist's)
    free frozen objects at any time, so the count can drop between two reads."""
    walked = {id(o) for o in gc.get_objects()}
    return [id(o) in walked for o in objs]


def test_the_heap_is_frozen_while_a_run_goes_on_and_thawed_after_the_last():
    gc.unfreeze()  # whatever an earlier test left frozen
    held = [["made before the run"]]  # like the process's modules, classes, caches (a list: always tracked)
    assert _walked_by_the_collector(held) == [True]
    with frozen_heap():
        assert gc.get_freeze_count() > 1000
        assert _walked_by_the_collector(held) == [False]
        with frozen_heap():  # a second run beside it (another thread, a nested flow)
            assert _walked_by_the_collector(held) == [False]
        assert _walked_by_the_collector(held) == [False]  # the first is still going on
    assert gc.get_freeze_count() == 0
    assert _walked_by_the_collector(held) == [True]


def test_cycles_made_during_a_run_are_still_collected():
    class Node:
        pass

    collected = threading.Event()
    with frozen_heap():
        node = Node()
        node.me = node  # a cycle, made after the freeze
        import weakref

        weakref.finalize(node, collected.set)
        del node
        gc.collect()
        assert collected.is_set()


def test_batchgen_gc_freeze_0_leaves_the_collector_alone(monkeypatch):
    monkeypatch.setenv("BATCHGEN_GC_FREEZE", "0")
    gc.unfreeze()
    with frozen_heap():
        assert gc.get_freeze_count() == 0


def test_what_is_made_during_a_run_can_join_the_frozen_heap():
    from batchgen.gcheap import freeze_more

    gc.unfreeze()
    freeze_more()  # no run going on: nothing frozen
    assert gc.get_freeze_count() == 0
    with frozen_heap():
        kept = [[i] for i in range(10000)]  # e.g. an engine built while the first prompts are made
        assert _walked_by_the_collector(kept, kept[0], kept[-1]) == [True, True, True]
        freeze_more()
        assert _walked_by_the_collector(kept, kept[0], kept[-1]) == [False, False, False]
        assert all(gc.is_tracked(o) for o in (kept, kept[0], kept[-1]))  # frozen, not dropped from the collector
    assert gc.get_freeze_count() == 0
    assert _walked_by_the_collector(kept, kept[0]) == [True, True]  # the run over: walked again


GIVE_BACK = r"""
import csv, gc, json, sys
import psutil
from batchgen.gcheap import _malloc_trim, give_back_freed
from batchgen.items import load_items
from batchgen.job import InputSpec

path = sys.argv[1]
with open(path, "w", newline="", encoding="utf-8") as f:
    out = csv.writer(f)
    out.writerow(["sku", "name", "features", "price"])
    for i in range(100_000):
        out.writerow([f"SKU-{i:06d}", f"Product number {i}", f"steel, {i % 97} cm, {i % 13} colours, warranty",
                      f"{i % 500}.99"])
rss = psutil.Process().memory_info
gc.collect()
loaded = load_items(InputSpec(path=path, id_column="sku"))
gc.collect()
loaded_rss = rss().rss
give_back_freed()
print(json.dumps({"freed_mb": (loaded_rss - rss().rss) / 2**20, "items": len(loaded.items),
                  "last": loaded.items.iloc[-1].to_dict(), "trim": _malloc_trim() is not None}))
"""


def test_after_a_large_load_the_memory_its_parse_freed_goes_back_to_the_system(tmp_path):
    """100,000 CSV rows: what the parse freed (Arrow's reader, the Python lists) is handed back, and the loaded
    items are whole. A fresh process, so that the heap holds this load only."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", GIVE_BACK, str(tmp_path / "items.csv")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["items"] == 100_000
    assert got["last"] == {"item_id": "SKU-099999", "row_number": 100_000, "sku": "SKU-099999",
                           "name": "Product number 99999", "features": "steel, 89 cm, 3 colours, warranty",
                           "price": "499.99"}  # CSV cells stay text
    assert got["trim"]  # glibc, as on every machine batchgen is tested on
    assert got["freed_mb"] >= 5, got
