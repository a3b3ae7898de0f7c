"""Capture one window's staging arguments from a run of the flow on the stand-in engine (benchmarks/standin.py), for
columnar_ab.py: the fifth window (1,824 items) of 20,000, the flow's GPU settings (3 windows in flight), retries
off. CUT=90: 90% of the outputs cut off, all rejected (the example job's keyword check); NOKW=1 CUT=10: 10% cut off,
the keyword check dropped, 90% accepted.

    STEP=0.001 CUT=90 MAXTOK=16 OUTFILE=/tmp/window-rejected.pkl PREFECT_HOME=$PWD/.prefect \\
        BATCHGEN_CACHE=$PWD/.cache .venv/bin/python benchmarks/results/cpu-columnar-assemble/capture_window.py 20000 1

An ad-hoc measurement kept with its figures (README.md), not a benchmark of the suite."""
import functools
import os
import pickle
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import run as bench  # noqa: E402

bench.set_environment()
from prefect.testing.utilities import prefect_test_harness  # noqa: E402

import batchgen.engine  # noqa: E402
import benchmarks.standin as standin  # noqa: E402

batchgen.engine.on_cpu = lambda: False  # the flow's GPU settings
llm, job, work, reps = standin.batching_retry_bench(16)
job = job.model_copy(update={"retry": job.retry.model_copy(update={"max_passes": 0})})
if os.environ.get("NOKW"):
    job = job.model_copy(update={"expectations": job.expectations.model_copy(update={"keyword_column": None})})
import flows.batch_generation as fb  # noqa: E402
import tasks.publish  # noqa: E402

stage = tasks.publish.stage_window_task.fn
got = {}


@functools.wraps(stage)
def capture(job, publication, window, prompts, engine, validated):
    if window.index == 5:
        got["args"] = (job, window, prompts, engine, validated)
    return stage(job, publication, window, prompts, engine, validated)


tasks.publish.stage_window_task.fn = capture
with prefect_test_harness(server_startup_timeout=120):
    fb.batch_generation(job.model_copy(update={"output": job.output.model_copy(update={"dir": str(work / "o")})}))
with open(os.environ["OUTFILE"], "wb") as out:
    pickle.dump(got["args"], out)
print("window of", len(got["args"][1].items), "items ->", os.environ["OUTFILE"])
shutil.rmtree(work, ignore_errors=True)
