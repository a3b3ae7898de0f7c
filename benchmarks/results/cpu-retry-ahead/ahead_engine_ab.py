"""The job with retries on the real CPU engine (the default model), retry.ahead on against off.

    PREFECT_HOME=$PWD/.prefect BATCHGEN_CACHE=$PWD/.cache \
        .venv/bin/python benchmarks/results/cpu-retry-ahead/ahead_engine_ab.py 128 16 2

The real flow (temporary Prefect server, the real vLLM CPU engine, GX validation, publication) on N items with a
first budget of M tokens and the example job's retries (grow x2, 2 passes, in the stream), retry.ahead off and on in
alternating runs, one engine for all runs (built by a warm-up run). One JSON line per run: the wall time, the
engine's steps and stepping seconds (its stream's feed), tokens generated, the attempts, and whether the published
attempts are the same chains (items, attempt numbers, budgets) as the run before it. On a 2-core CPU a step's time
grows with the batch, so what a dropped spare costs shows here. An ad-hoc measurement kept with its figures
(README.md), not a benchmark of the suite."""
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import run as bench  # noqa: E402

bench.set_environment()
import pandas as pd  # noqa: E402
from prefect.testing.utilities import prefect_test_harness  # noqa: E402

import flows.batch_generation as fb  # noqa: E402
from batchgen.stream import feed_delta  # noqa: E402

n, max_tokens, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
work = Path(tempfile.mkdtemp())
products = bench.write_products(work / "p.csv", n)
with prefect_test_harness(server_startup_timeout=120):
    fb.batch_generation(bench.bench_job(bench.write_products(work / "w.csv", 4), work / "ow", 8))
    for rep in range(reps):
        for ahead in ((False, True) if rep % 2 == 0 else (True, False)):
            job = bench.bench_job(products, work / f"out-{rep}-{ahead}", max_tokens,
                                  retry={"max_passes": 2, "strategy": "grow", "growth_factor": 2,
                                         "max_tokens_cap": 320, "in_stream": True, "ahead": ahead})
            before = bench.engine_feed(job)
            started = time.perf_counter()
            manifest = fb.batch_generation(job)
            wall = time.perf_counter() - started
            feed = feed_delta(before, bench.engine_feed(job))
            attempts = pd.read_parquet(Path(job.output.dir) / "current" / "attempts",
                                       columns=["item_id", "attempt", "max_tokens", "finish_reason"])
            print(json.dumps({
                "ahead": ahead, "wall": round(wall, 2), "engine_steps": feed["steps"],
                "engine_busy_seconds": round(feed["busy_seconds"], 2),
                "tokens": manifest["tokens"]["generated_this_run"], "attempts": len(attempts),
                "by_attempt": {int(k): int(v) for k, v in attempts["attempt"].value_counts().sort_index().items()},
                "cut_off_left": int(((attempts.groupby("item_id")["attempt"].transform("max") == attempts["attempt"])
                                     & (attempts["finish_reason"] == "length")).sum()),
                "generate": round(manifest["timings_seconds"]["generate"], 2)}), flush=True)
shutil.rmtree(work, ignore_errors=True)
