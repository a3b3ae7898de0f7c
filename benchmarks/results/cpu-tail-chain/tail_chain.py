"""What the run's process does after the engine's last output: each step of the last windows (their last commit,
its progress, the validation asked of a GX worker and its answer, the table of expectations posted to Prefect, the
staging and its parts) and the publish step, timed from the engine's last output, on a stand-in engine paced like
an H100 at 16 tokens (FIFO, 1,024 running, STEP seconds a step: benchmarks/standin.py), with the flow's GPU
settings (3 windows in flight; GX validation in worker processes as on a 16-core host: CORES=16), retries off.

    STEP=0.03 CUT=100 MAXTOK=16 CORES=16 CHART_WORKERS=1 PREFECT_HOME=$PWD/.prefect BATCHGEN_CACHE=$PWD/.cache \\
        .venv/bin/python benchmarks/results/cpu-tail-chain/tail_chain.py 10000 3

An ad-hoc measurement kept with its figures (README.md), not a benchmark of the suite."""
import functools
import os
import shutil
import sys
import threading
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

batchgen.engine.on_cpu = lambda: False  # the flow's GPU settings
expectations.workers.usable_cores = lambda: int(os.environ.get("CORES", "16"))  # GX workers as on such a host
batchgen.report.worker.worker_count = lambda: int(os.environ.get("CHART_WORKERS", "1"))
llm, job, work, reps = standin.batching_retry_bench(16)
job = job.model_copy(update={"retry": job.retry.model_copy(update={"max_passes": 0})})
import batchgen.publish  # noqa: E402
import batchgen.store  # noqa: E402
import flows.batch_generation as fb  # noqa: E402
import tasks.generate  # noqa: E402
import tasks.publish  # noqa: E402
import tasks.validate  # noqa: E402

EVENTS: list[tuple[float, float, str, str]] = []  # (start, seconds, step, window or size)


def timed(owner, name, step, key=lambda *a, **k: ""):
    """Record each call of owner.name (its start and seconds) as `step`."""
    call = getattr(owner, name)

    @functools.wraps(call)
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            EVENTS.append((started, time.perf_counter() - started, step, str(key(*args, **kwargs))))
    setattr(owner, name, wrapper)


timed(batchgen.store.ResultStore, "commit", "commit (result store)", lambda self, rows, owner=None: owner[1])
timed(tasks.generate.Progress, "update", "progress (Prefect artifact when due)", lambda self, *a, **k: self.window)
timed(fb.AttemptValidations, "attempt_done", "attempt done: validation thread started",
      lambda self, attempt, rows: self.window.label)
timed(tasks.validate.validate_task, "fn", "validate task body", lambda job, rows, keywords, label: label)
timed(expectations.workers, "validate_in_worker", "  GX in a worker, round trip",
      lambda frame, *a: f"{len(frame)} rows")
timed(tasks.validate, "create_table_artifact", "  table of expectations posted")
timed(tasks.publish.stage_window_task, "fn", "stage task body", lambda job, pub, window, *a: window.label)
timed(tasks.publish, "assemble", "  assemble", lambda items, *a: f"{len(items)} rows")
timed(batchgen.publish.Publication, "add_window", "  the window's parts written", lambda self, index, *a: f"w{index}")
timed(tasks.publish.publish_task, "fn", "publish task body")

with prefect_test_harness(server_startup_timeout=120):
    fb.batch_generation(bench.bench_job(bench.write_products(work / "warm.csv", 8), work / "warm", 16))
    for rep in range(reps):
        EVENTS.clear()
        started = time.perf_counter()
        output = job.output.model_copy(update={"dir": str(work / f"o{rep}")})
        fb.batch_generation(job.model_copy(update={"output": output}))
        ended, last = time.perf_counter(), llm.llm_engine.last_output_at
        print(f"run {rep + 1}: {ended - started:.2f} s, the flow returned {ended - last:.3f} s after the engine's "
              "last output; from it, in seconds (start, duration):")
        for at, seconds, step, key in sorted(EVENTS):
            if at + seconds >= last - 0.05:
                print(f"  {at - last:+.3f} {seconds:.3f}  {step} {key}")
shutil.rmtree(work, ignore_errors=True)
