"""The run's process: pyarrow on the system allocator once a run starts, unless the user chose otherwise.

Each case runs in a fresh interpreter: the default pool is process-wide and set once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

PROBE = """
import json
import pyarrow as pa
from batchgen.host import arrow_on_system_allocator
before = pa.default_memory_pool().backend_name
first = arrow_on_system_allocator()
again = arrow_on_system_allocator()
table = pa.table({"x": list(range(1000))})  # allocated from the pool now in use
print(json.dumps({"before": before, "first": first, "again": again, "after": pa.default_memory_pool().backend_name,
                  "allocated": pa.system_memory_pool().bytes_allocated(), "rows": table.num_rows}))
"""


def _probe(**env: str) -> dict:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("ARROW_DEFAULT_MEMORY_POOL", "BATCHGEN_ARROW_SYSTEM_POOL")}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT,
                          env={**environ, **env}, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_run_s_arrow_tables_come_from_the_system_allocator():
    got = _probe()
    assert got["first"] == got["again"] == got["after"] == "system"  # once per process
    assert got["rows"] == 1000 and got["allocated"] >= 8000  # the table's 1,000 int64 values are there


def test_a_users_own_pool_is_kept():
    got = _probe(ARROW_DEFAULT_MEMORY_POOL="system")
    assert got["first"] is None and got["after"] == "system"
    got = _probe(ARROW_DEFAULT_MEMORY_POOL="mimalloc")
    if got["before"] == "mimalloc":  # a pyarrow built with mimalloc (its wheels are)
        assert got["first"] is None and got["after"] == "mimalloc"


def test_batchgen_arrow_system_pool_0_leaves_the_pool_alone():
    got = _probe(BATCHGEN_ARROW_SYSTEM_POOL="0")
    assert got["first"] is None and got["after"] == got["before"]
