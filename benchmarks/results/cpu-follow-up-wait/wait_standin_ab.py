"""The job with retries on a stand-in engine that batches like vLLM: how long a cut-off output waits for its
commit (and its retry to be sent), batchgen.generation.FOLLOW_UP_COMMIT_SECONDS, 0.25 s against 0.02 s.

    STEP=0.03 CUT=15 MAXTOK=80 PREFECT_HOME=$PWD/.prefect BATCHGEN_CACHE=$PWD/.cache \
        .venv/bin/python benchmarks/results/cpu-follow-up-wait/wait_standin_ab.py 10000 2

As ../cpu-retry-ahead/ahead_standin_ab.py (benchmarks/standin.py: BatchingStandInEngine, one token a step of STEP
seconds, CUT% cut off, grow x2 up to 320, 2 passes, in the stream); WAITS=0.25,0.02 (the default) the waits,
alternating; STRATEGY=grow (the default) the retry strategy. One JSON line per run. An ad-hoc measurement kept
with its figures (README.md), not a benchmark of the suite."""
import sys, shutil, json, os
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
from benchmarks import run as bench
bench.set_environment()
from prefect.testing.utilities import prefect_test_harness
import benchmarks.standin as standin
llm, job, work, reps = standin.batching_retry_bench(80)
import flows.batch_generation as fb
import batchgen.generation as gen
waits = [float(x) for x in os.environ.get("WAITS", "0.25,0.02").split(",")]
job = job.model_copy(update={"retry": job.retry.model_copy(update={"strategy": os.environ.get("STRATEGY", "grow")})})
with prefect_test_harness(server_startup_timeout=120):
    fb.batch_generation(bench.bench_job(bench.write_products(work / "w.csv", 8), work / "ow", 16))
    for rep in range(reps):
        for wait in (waits if rep % 2 == 0 else waits[::-1]):
            gen.FOLLOW_UP_COMMIT_SECONDS = wait
            run_job = job.model_copy(update={"output": job.output.model_copy(
                update={"dir": str(work / f"out-{rep}-{wait}")})})
            print(json.dumps({"wait": wait, **standin.measured_run(llm, fb.batch_generation, run_job)}), flush=True)
shutil.rmtree(work, ignore_errors=True)
