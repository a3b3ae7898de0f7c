"""The run's process: glibc's arenas capped when batchgen is imported, pyarrow on the system allocator once a run
starts, unless the user chose otherwise.

Each case runs in a fresh interpreter: both settings are process-wide and made once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
GLIBC = "CS_GNU_LIBC_VERSION" in getattr(os, "confstr_names", {})

PROBE = """
import json
import pyarrow as pa
before = pa.default_memory_pool().backend_name
import batchgen  # caps the arenas
from batchgen.host import allocators, arenas, arrow_on_system_allocator
imported = allocators()
first = arrow_on_system_allocator()
again = arrow_on_system_allocator()
table = pa.table({"x": list(range(1000))})  # allocated from the pool now in use
print(json.dumps({"before": before, "imported": imported, "first": first, "again": again, "done": allocators(),
                  "after": pa.default_memory_pool().backend_name, "arenas": arenas(), "rows": table.num_rows}))
"""


def _probe(**env: str) -> dict:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("MALLOC_ARENA_MAX", "ARROW_DEFAULT_MEMORY_POOL", "BATCHGEN_BOUND_ALLOCATORS")}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT,
                          env={**environ, **env}, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_arenas_are_capped_on_import_and_arrow_moves_to_the_system_allocator_when_a_run_starts():
    got = _probe()
    assert got["arenas"] >= 2
    # glibc: one arena per usable core; musl, macOS: nothing to cap, and nothing failed
    assert got["imported"] == {"malloc_arena_max": got["arenas"] if GLIBC else None, "arrow_pool": None}
    assert got["first"] == got["again"] == got["after"] == "system"  # once per process
    assert got["done"] == {**got["imported"], "arrow_pool": "system"}
    assert got["rows"] == 1000


def test_a_users_own_allocator_settings_are_kept():
    got = _probe(MALLOC_ARENA_MAX="4", ARROW_DEFAULT_MEMORY_POOL="system")
    assert got["done"] == {"malloc_arena_max": None, "arrow_pool": None}
    got = _probe(ARROW_DEFAULT_MEMORY_POOL="mimalloc")
    if got["before"] == "mimalloc":  # a pyarrow built with mimalloc (its wheels are)
        assert got["after"] == "mimalloc" and got["done"]["arrow_pool"] is None


def test_batchgen_bound_allocators_0_leaves_both_alone():
    got = _probe(BATCHGEN_BOUND_ALLOCATORS="0")
    assert got["done"] == {"malloc_arena_max": None, "arrow_pool": None}
    assert got["after"] == got["before"]


@pytest.mark.parametrize("cores, expected", [(1, 2), (2, 2), (16, 16)])
def test_one_arena_per_usable_core_at_least_two(monkeypatch, cores, expected):
    import batchgen.host

    monkeypatch.setattr(batchgen.host, "usable_cores", lambda: cores)
    assert batchgen.host.arenas() == expected
