"""The flow's fixed part (before the engine's first request, after its last output) on a stand-in engine paced like
an H100 at 16 tokens (FIFO admission, 1,024 running, STEP seconds a step: benchmarks/standin.py), with the flow's
GPU settings (windows in flight 3, validation and charts in worker processes: `batchgen.engine.on_cpu` answered
False), retries off, one JSON line per run.

    STEP=0.03 CUT=100 MAXTOK=16 PREFECT_HOME=$PWD/.prefect BATCHGEN_CACHE=$PWD/.cache \
        .venv/bin/python benchmarks/results/cpu-fixed-part/fixed_ab.py 10000 3

An ad-hoc measurement kept with its figures (README.md), not a benchmark of the suite."""
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import run as bench  # noqa: E402

bench.set_environment()
from prefect.testing.utilities import prefect_test_harness  # noqa: E402

import batchgen.engine  # noqa: E402
import benchmarks.standin as standin  # noqa: E402

batchgen.engine.on_cpu = lambda: False  # the flow's GPU settings
if os.environ.get("CHART_WORKERS"):  # report workers as on a host with 3 cores for each (default: one per 3 cores)
    import batchgen.report.worker

    batchgen.report.worker.worker_count = lambda: int(os.environ["CHART_WORKERS"])
llm, job, work, reps = standin.batching_retry_bench(16)
TREE = os.environ.get("TREE", Path(__file__).resolve().parents[3].name)
job = job.model_copy(update={"retry": job.retry.model_copy(update={"max_passes": 0})})
import flows.batch_generation as fb  # noqa: E402

with prefect_test_harness(server_startup_timeout=120):
    fb.batch_generation(bench.bench_job(bench.write_products(work / "w.csv", 8), work / "ow", 16))
    for rep in range(reps):
        out = work / f"out-{rep}"
        engine = llm.llm_engine
        started = time.perf_counter()
        manifest = fb.batch_generation(job.model_copy(update={"output": job.output.model_copy(
            update={"dir": str(out)})}))
        wall = time.perf_counter() - started
        timings = manifest.timings_seconds
        print(json.dumps({"tree": TREE, "wall": round(wall, 3), "first_request": round(timings["first_request"], 3),
                          "generate": round(timings["generate"], 3),
                          "after_last_output": round(started + wall - engine.last_output_at, 3),
                          "before_publish_after_last_output": round(timings["total_before_publish"]
                                                                    - timings["last_output"], 3),
                          "items": manifest.counts.items, "accepted": manifest.counts.accepted}), flush=True)
shutil.rmtree(work, ignore_errors=True)
