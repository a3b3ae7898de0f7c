"""The run's collector view: what the process held at the start of a run is frozen while runs are going on."""

from __future__ import annotations

import gc
import threading

import pytest

from batchgen.gcheap import frozen_heap


# alone: in a pytest-xdist worker, its messaging thread frees objects that were frozen, so the count can drop
# between two reads (seen once: 1,466,337 then 1,466,333); in a plain pytest process it cannot
@pytest.mark.alone
def test_the_heap_is_frozen_while_a_run_goes_on_and_thawed_after_the_last():
    gc.unfreeze()  # whatever an earlier test left frozen
    with frozen_heap():
        frozen = gc.get_freeze_count()
        assert frozen > 1000  # the process's modules, classes, caches
        with frozen_heap():  # a second run beside it (another thread, a nested flow)
            assert gc.get_freeze_count() >= frozen
        assert gc.get_freeze_count() >= frozen  # the first is still going on
    assert gc.get_freeze_count() == 0


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
        before = gc.get_freeze_count()
        kept = [[i] for i in range(10000)]  # e.g. an engine built while the first prompts are made
        freeze_more()
        assert gc.get_freeze_count() >= before + len(kept)
    assert gc.get_freeze_count() == 0
