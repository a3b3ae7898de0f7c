"""Python's cyclic garbage collector kept off the heap that lives as long as the process.

A batchgen process holds millions of objects that live as long as it does (vLLM, torch, transformers, GX,
Prefect: their modules, classes and caches). Every full collection of CPython's cyclic garbage collector walks all
of them, and a run makes enough short-lived objects (a window's requests, outputs, rows) to set one off every few
windows: on a 2-core CPU with the engine stood in, 20,000 items paid 13 full collections of ~0.37 s each, a third
of the run's wall time, all of it holding the interpreter while the engine waited for its next requests.

`frozen_heap()` moves what the process holds when a run starts into the collector's permanent generation
(`gc.freeze`, as vLLM does with its own heap once its server is up): collections then walk only what the run itself
made. The objects stay alive as long as they are referenced, as before; the freeze is undone when the run ends, so
that cycles left over from earlier calls in a long-lived process (a worker, a test session) are collected as ever.

`give_back_freed()` hands what the allocators keep after the input's parse back to the system (the load task calls
it): the parse runs in one thread and the windows in others, whose malloc arenas never reuse the loading thread's
free pages.
"""

from __future__ import annotations

import functools
import gc
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_LOCK = threading.Lock()
_DEPTH = 0  # runs inside frozen_heap() in this process (runs may overlap in threads)


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the collector's view of the heap for the block; unfreeze when the last such block ends.
    BATCHGEN_GC_FREEZE=0 turns it off."""
    global _DEPTH
    if os.environ.get("BATCHGEN_GC_FREEZE", "1") == "0":
        yield
        return
    with _LOCK:
        _DEPTH += 1
        gc.freeze()
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                gc.unfreeze()


def freeze_more() -> None:
    """Add what the process holds now to the frozen heap, while a run has it frozen: called once an engine is built
    (during a run, beside its first prompts), whose objects then live as long as the process."""
    with _LOCK:
        if _DEPTH > 0:
            gc.freeze()


def give_back_freed() -> None:
    """Hand the memory the allocators keep after a large parse back to the system: Arrow's pool (what its reader
    freed) and, with glibc, malloc's free pages (`malloc_trim`). After loading 200,000 CSV rows it gave back 31 MB
    in 2.3 ms; a run's peak RSS at 200,000 items fell by 5-34 MB (benchmarks/results/cpu-give-back-freed/)."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS, Windows)."""
    import ctypes
    import ctypes.util

    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "malloc_trim")
    except (OSError, AttributeError):
        return None
