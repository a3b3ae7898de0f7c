"""The run's process on its host: the cores it may use, and memory allocators that reuse finished windows' memory.

A run frees almost everything it allocates: a window's prompts, requests, outputs and tables are gone once it is
staged (what Python still held when the publish step began, at 20,000 items with the engine stood in, was ~10 MB
more than before the run). Its resident size grew with the run's length anyway, because of two allocators:

- glibc's malloc gives a thread that allocates while another holds an arena an arena of its own, up to eight per
  core, and keeps what is freed there for that arena's later use. A run has many threads (the windows', the
  tokenizer's, the validation's, Prefect's), so freed memory piles up across arenas that are each seldom reused.
- pyarrow's default pool (mimalloc or jemalloc) holds on to freed pages for later Arrow allocations.

`cap_arenas()`, called by `import batchgen` (arenas made before it stay: it must come before the threads make
theirs), caps glibc's arenas at one per core the process may use, at least two (mallopt M_ARENA_MAX, as the
MALLOC_ARENA_MAX environment variable would, without passing it on to other programs); `arrow_on_system_allocator()`,
called when a run starts, makes pyarrow allocate from the system allocator (`pyarrow.system_memory_pool`), whose
freed memory goes back to malloc's arenas. On CPU builds vLLM's engine works in the run's process and its threads
allocate beside the run's: with the cap, raw vLLM there kept its pace within the machine's noise (2 cores, five runs
each way). Figures: benchmarks/results/cpu-allocators/. What still grows with a run is mostly its input table, which
a run holds whole.

What the user chose wins: a MALLOC_ARENA_MAX or ARROW_DEFAULT_MEMORY_POOL in the environment leaves that allocator
as it is, and BATCHGEN_BOUND_ALLOCATORS=0 leaves both.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

M_ARENA_MAX = -8  # glibc's malloc.h
SWITCH = "BATCHGEN_BOUND_ALLOCATORS"  # 0: leave both allocators as they are
_LOCK = threading.Lock()
_DONE: dict[str, Any] = {}


def allocators() -> dict[str, Any]:
    """What this process's allocators were set to by batchgen: malloc_arena_max (None: left as it was) and
    arrow_pool (None: left as it was, or not set yet)."""
    with _LOCK:
        return {"malloc_arena_max": _DONE.get("malloc_arena_max"), "arrow_pool": _DONE.get("arrow_pool")}


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system says it), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def arenas() -> int:
    """The cap on glibc's arenas: one per core the process may use, at least 2 (glibc's own: 8 per core)."""
    return max(2, usable_cores())


def _wanted(variable: str) -> bool:
    return os.environ.get(SWITCH, "") != "0" and variable not in os.environ


def cap_arenas() -> int | None:
    """Cap glibc's malloc arenas at `arenas()`, once per process (`import batchgen` calls it): the cap, or None where
    the user set MALLOC_ARENA_MAX or BATCHGEN_BOUND_ALLOCATORS=0, or the C library is not glibc (musl, macOS)."""
    with _LOCK:
        if "malloc_arena_max" not in _DONE:
            _DONE["malloc_arena_max"] = _mallopt_arena_max(arenas()) if _wanted("MALLOC_ARENA_MAX") else None
        return _DONE["malloc_arena_max"]


def arrow_on_system_allocator() -> str | None:
    """Make the system allocator pyarrow's default memory pool, once per process (a run calls it as it starts):
    the pool's name, or None where the user set ARROW_DEFAULT_MEMORY_POOL or BATCHGEN_BOUND_ALLOCATORS=0."""
    with _LOCK:
        if "arrow_pool" not in _DONE:
            _DONE["arrow_pool"] = None
            if _wanted("ARROW_DEFAULT_MEMORY_POOL"):
                import pyarrow as pa

                pa.set_memory_pool(pa.system_memory_pool())
                _DONE["arrow_pool"] = pa.default_memory_pool().backend_name
        return _DONE["arrow_pool"]


def _mallopt_arena_max(count: int) -> int | None:
    try:
        libc = ctypes.CDLL(None)  # the process's own C library (no ldconfig lookup at import)
        if not hasattr(libc, "gnu_get_libc_version"):
            return None
        return count if libc.mallopt(M_ARENA_MAX, count) == 1 else None
    except (OSError, AttributeError, TypeError):
        return None
