"""The run's process on its host: the cores it may use, and the allocator its Arrow tables come from.

A run frees almost everything it allocates: a window's prompts, requests, outputs and tables are gone once it is
staged (what Python still held when the publish step began, at 20,000 items with the engine stood in, was ~10 MB
more than before the run). Its resident size grew with the run's length anyway, because allocators keep what is
freed for their own later use: pyarrow's default pool (mimalloc or jemalloc) its pages, glibc's malloc its arenas
(one per thread that allocated while another held an arena, up to eight per core).

`arrow_on_system_allocator()`, called when a run starts, makes pyarrow allocate from the system allocator
(`pyarrow.system_memory_pool`), so that the tables of finished windows go back to malloc, where the run's Python
objects are reused too. Capping glibc's arenas (M_ARENA_MAX at one per core) halved the peak RSS's growth with the
run's length, but was not kept: the tokenizer's threads (Rust, allocating without the interpreter lock) then share
arenas, and two threads on one arena tokenized 5.5x slower (benchmarks/results/cpu-allocators/).

An ARROW_DEFAULT_MEMORY_POOL in the environment wins, and BATCHGEN_ARROW_SYSTEM_POOL=0 leaves pyarrow's pool as it is.
"""

from __future__ import annotations

import os
import threading

SWITCH = "BATCHGEN_ARROW_SYSTEM_POOL"  # 0: leave pyarrow's default pool as it is
_LOCK = threading.Lock()
_DONE: dict[str, str | None] = {}


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system says it), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def arrow_on_system_allocator() -> str | None:
    """Make the system allocator pyarrow's default memory pool, once per process (a run calls it as it starts):
    the pool's name, or None where the user set ARROW_DEFAULT_MEMORY_POOL or BATCHGEN_ARROW_SYSTEM_POOL=0."""
    with _LOCK:
        if "arrow_pool" not in _DONE:
            _DONE["arrow_pool"] = None
            if os.environ.get(SWITCH, "") != "0" and "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
                import pyarrow as pa

                pa.set_memory_pool(pa.system_memory_pool())
                _DONE["arrow_pool"] = pa.default_memory_pool().backend_name
        return _DONE["arrow_pool"]
