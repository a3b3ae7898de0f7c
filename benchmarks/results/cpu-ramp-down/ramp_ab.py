"""The last windows ramped down (1,024, 512, 256: the flow's windows today) against full windows to the end (only
the first windows ramped up), on a stand-in engine that batches like vLLM (FIFO admission, 1,024 running, STEP
seconds a step: benchmarks/standin.py), alternating, one JSON line per run.

    STEP=0.03 CUT=15 MAXTOK=80 RETRIES=0 PREFECT_HOME=$PWD/.prefect BATCHGEN_CACHE=$PWD/.cache \
        .venv/bin/python benchmarks/results/cpu-ramp-down/ramp_ab.py 10000 3

RETRIES=1 runs the example job's retries (grow x2 up to 320, in the stream). An ad-hoc measurement kept with its
figures (README.md), not a benchmark of the suite."""
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

import benchmarks.standin as standin  # noqa: E402

llm, job, work, reps = standin.batching_retry_bench(80)
if os.environ.get("RETRIES", "0") != "1":
    job = job.model_copy(update={"retry": job.retry.model_copy(update={"max_passes": 0})})
import flows.batch_generation as fb  # noqa: E402

# The runs recorded here were made when this script cut the full_to_end windows itself: for 10,000 items in windows
# of 2,048 the same windows as the flow's RAMP_DOWN off (256, 512, 1,024, 3 x 1,642, 2 x 1,641).
with prefect_test_harness(server_startup_timeout=120):
    fb.batch_generation(bench.bench_job(bench.write_products(work / "w.csv", 8), work / "ow", 16))
    for rep in range(reps):
        for way in (("ramp_down", "full_to_end") if rep % 2 == 0 else ("full_to_end", "ramp_down")):
            fb.RAMP_DOWN = way == "ramp_down"  # full_to_end: the windows after the ramp up full to the end
            out = work / f"out-{rep}-{way}"
            started = time.perf_counter()
            manifest = fb.batch_generation(job.model_copy(update={"output": job.output.model_copy(
                update={"dir": str(out)})}))
            wall = time.perf_counter() - started
            windows = [stop - start for start, stop in fb.item_windows(manifest.counts.items, job.window_size, True,
                                                                       fb.RAMP_DOWN)]
            print(json.dumps({"way": way, "wall": round(wall, 2),
                              "after_last_output": round(started + wall - llm.llm_engine.last_output_at, 3),
                              "windows": windows, "items": manifest.counts.items,
                              "accepted": manifest.counts.accepted,
                              "generate": round(manifest.timings_seconds["generate"], 2)}), flush=True)
shutil.rmtree(work, ignore_errors=True)
