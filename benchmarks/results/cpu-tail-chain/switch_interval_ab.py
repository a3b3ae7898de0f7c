"""The flow on the stand-in engine (as tail_chain.py) with Python's thread switch interval of the run's process as
it is (5 ms) or set (MAIN_SWITCH=SECONDS), one JSON line per run: when the publish step started and when the flow
returned after the engine's last output. Alternated by the shell loop in README.md.

An ad-hoc measurement kept with its figures (README.md), not a benchmark of the suite."""
import functools
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
import batchgen.report.worker  # noqa: E402
import benchmarks.standin as standin  # noqa: E402
import expectations.workers  # noqa: E402

batchgen.engine.on_cpu = lambda: False
expectations.workers.usable_cores = lambda: int(os.environ.get("CORES", "16"))
batchgen.report.worker.worker_count = lambda: int(os.environ.get("CHART_WORKERS", "1"))
llm, job, work, reps = standin.batching_retry_bench(16)
job = job.model_copy(update={"retry": job.retry.model_copy(update={"max_passes": 0})})
import flows.batch_generation as fb  # noqa: E402
import tasks.publish  # noqa: E402

publish_started: list[float] = []
publish = tasks.publish.publish_task.fn


@functools.wraps(publish)
def timed_publish(*args, **kwargs):
    publish_started.append(time.perf_counter())
    return publish(*args, **kwargs)


tasks.publish.publish_task.fn = timed_publish
if os.environ.get("MAIN_SWITCH"):
    sys.setswitchinterval(float(os.environ["MAIN_SWITCH"]))
with prefect_test_harness(server_startup_timeout=120):
    fb.batch_generation(bench.bench_job(bench.write_products(work / "warm.csv", 8), work / "warm", 16))
    for rep in range(reps):
        started = time.perf_counter()
        fb.batch_generation(job.model_copy(update={"output": job.output.model_copy(update={"dir": str(work / "o")})}))
        ended, last = time.perf_counter(), llm.llm_engine.last_output_at
        print(json.dumps({"tree": os.environ.get("MAIN_SWITCH", "default"), "wall": round(ended - started, 3),
                          "after_last_output": round(ended - last, 3),
                          "publish_start": round(publish_started[-1] - last, 3)}), flush=True)
        shutil.rmtree(work / "o", ignore_errors=True)
shutil.rmtree(work, ignore_errors=True)
