"""Memory of the flow's own process against the item count, with the engine stood in for.

    python -m benchmarks.memory_parts 2000 20000                          # one process per size
    python -m benchmarks.memory_parts 2000 20000 --add-to benchmarks/results   # into latest.json/md

`--memory` in benchmarks.run measures the whole flow with the engine, which at 20,000 items
takes hours of prefill on a 2-core CPU. The engine's own processes reserve their KV cache
when they start (kv_cache_memory_bytes), whatever the item count. What can grow with the
items is batchgen's process, and that is what this measures: the real flow
(`batch_generation`, under a temporary Prefect server) with the real load, prompt building
(real tokenizer), GX validation, window staging, publishing and report, with every engine
request answered at once in place of vLLM (benchmarks/standin.py: 4 tokens, cut off, as with
max_tokens 4). Prints, as one JSON line per size: the process's RSS after a warm-up run of 8
items, its peak RSS (ru_maxrss) after the measured run, and the run's counts and windows.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

MAX_TOKENS = 4


def measure(n: int) -> dict:
    from benchmarks import run as bench

    bench.set_environment()
    import psutil
    from prefect.testing.utilities import prefect_test_harness

    from benchmarks.standin import StandInLLM, install

    llm = StandInLLM()
    install(llm)  # before the flow is imported
    from flows.batch_generation import batch_generation

    work = Path(tempfile.mkdtemp(prefix="batchgen-memory-parts-"))
    proc = psutil.Process()
    with prefect_test_harness(server_startup_timeout=120):
        warm = bench.bench_job(bench.write_products(work / "warm.csv", 8), work / "out-warm", MAX_TOKENS)
        batch_generation(warm)  # one-time costs (imports, GX, Prefect, the tokenizer) before the baseline
        baseline = proc.memory_info().rss
        llm.reset_counts()
        job = bench.bench_job(bench.write_products(work / "products.csv", n), work / "out", MAX_TOKENS)
        started = time.perf_counter()
        manifest = batch_generation(job)
        wall = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    return {"items": n, "window_size": job.window_size, "windows": -(-n // job.window_size),
            "engine_calls": llm.calls, "accepted": manifest["counts"]["accepted"],
            "rejected": manifest["counts"]["rejected"], "wall_seconds": round(wall, 2),
            "rss_after_warm_up_mb": round(baseline / 2**20, 1), "peak_rss_mb": round(peak / 2**20, 1),
            "peak_above_warm_up_mb": round((peak - baseline) / 2**20, 1)}


def main(argv: list[str]) -> int:
    add_to = None
    if "--add-to" in argv:  # --add-to DIR: also add the figures to DIR/latest.json and latest.md
        at = argv.index("--add-to")
        add_to, argv = Path(argv[at + 1]), argv[:at] + argv[at + 2:]
    sizes = [int(a) for a in argv] or [2000, 20000]
    if len(sizes) == 1 and add_to is None:
        print(json.dumps(measure(sizes[0])), flush=True)
        return 0
    result: dict = {"command": "python -m benchmarks.memory_parts " + " ".join(map(str, sizes)), "sizes": {},
                    "max_tokens": MAX_TOKENS, "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}
    for n in sizes:  # a fresh process per size: RSS peaks are per process
        out = subprocess.run([sys.executable, "-m", "benchmarks.memory_parts", str(n)], capture_output=True,
                             text=True, cwd=Path(__file__).resolve().parents[1])
        if out.returncode:
            sys.stderr.write(out.stderr[-4000:])
            raise SystemExit(f"the {n}-item run failed (exit {out.returncode})")
        line = out.stdout.strip().splitlines()[-1]
        print(line, flush=True)
        result["sizes"][str(n)] = json.loads(line)
    low, high = min(sizes), max(sizes)
    if high > low:
        rise = result["sizes"][str(high)]["peak_rss_mb"] - result["sizes"][str(low)]["peak_rss_mb"]
        result["slope_kb_per_item"] = round(1024 * rise / (high - low), 2)
    result["finished_at"] = datetime.now(timezone.utc).isoformat()
    if add_to is not None:
        from benchmarks.report import add_section

        add_section(add_to, "memory_parts", result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
