"""The job with retries in the stream on a stand-in engine that batches like vLLM: each window's first pass
validated once its first outputs are all there (beside its retries), against validated after its retries (the
tree before, TREE=/path), in alternating fresh processes.

    STEP=0.03 CUT=15 MAXTOK=80 PREFECT_HOME=$PWD/.prefect BATCHGEN_CACHE=$PWD/.cache \
        .venv/bin/python benchmarks/results/cpu-first-pass-early/early_validation_ab.py 2000 1

Set-up: benchmarks/standin.py batching_retry_bench (its docstring: 1,024 requests at once, one token per step of
STEP s, CUT% cut off, retries grow x2 up to 320 tokens in 2 passes, windows in flight 3). One JSON line per run:
the flow's wall time and what came after the engine's last output. An ad-hoc measurement kept with its figures
(README.md), not a benchmark of the suite."""
import json
import os
import shutil
import sys
import time
from pathlib import Path

TREE = Path(os.environ.get("TREE") or Path(__file__).resolve().parents[3])
sys.path.insert(0, str(TREE))
from benchmarks import run as bench  # noqa: E402

bench.set_environment()
import benchmarks.standin as standin  # noqa: E402
from prefect.testing.utilities import prefect_test_harness  # noqa: E402

llm, job, work, reps = standin.batching_retry_bench(80)
import flows.batch_generation as fb  # noqa: E402

with prefect_test_harness(server_startup_timeout=120):
    fb.batch_generation(bench.bench_job(bench.write_products(work / "w.csv", 8), work / "ow", 16))
    for rep in range(reps):
        run_job = job.model_copy(update={"output": job.output.model_copy(update={"dir": str(work / f"out-{rep}")})})
        t = time.perf_counter()
        m = fb.batch_generation(run_job)
        wall = time.perf_counter() - t
        print(json.dumps({"tree": TREE.name, "wall": round(wall, 2),
                          "after_last_output": round(t + wall - llm.llm_engine.last_output_at, 2),
                          "engine_steps": llm.llm_engine.steps, "items": m.counts.items,
                          "accepted": m.counts.accepted, "generate": round(m.timings_seconds["generate"], 2)}),
              flush=True)
shutil.rmtree(work, ignore_errors=True)
