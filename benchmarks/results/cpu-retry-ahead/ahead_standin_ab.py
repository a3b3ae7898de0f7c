"""The job with retries on a stand-in engine that batches like vLLM, retry.ahead on against off.

    STEP=0.01 CUT=15 MAXTOK=80 PREFECT_HOME=$PWD/.prefect BATCHGEN_CACHE=$PWD/.cache \
        .venv/bin/python benchmarks/results/cpu-retry-ahead/ahead_standin_ab.py 10000 2

The stand-in (benchmarks/standin.py: BatchingStandInEngine) holds at most 1,024 requests running, gives each one
token per step of STEP seconds, so a request of max_tokens takes max_tokens steps, and cuts off CUT% of them (the
others stop at 60% of their budget): a cut-off output's retries (grow x2 up to 320 tokens, 2 passes) are a chain
of steps, as on a GPU. It says its max_num_seqs as vLLM's engine does, so spare requests (retry.ahead) enter while
it holds fewer than 256. The flow runs with windows_in_flight 3, retry.ahead off and on, alternating; one JSON line
per run: the wall time, the engine's steps, the tokens its steps made (dropped spares' included). An ad-hoc
measurement kept with its figures (README.md), not a benchmark of the suite."""
import sys, shutil, json
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
from benchmarks import run as bench
bench.set_environment()
from prefect.testing.utilities import prefect_test_harness
import benchmarks.standin as standin
llm, job, work, reps = standin.batching_retry_bench(80)
import flows.batch_generation as fb
with prefect_test_harness(server_startup_timeout=120):
    fb.batch_generation(bench.bench_job(bench.write_products(work / "w.csv", 8), work / "ow", 16))
    for ahead, run_job in standin.ahead_runs(job, work, reps):
        print(json.dumps({"ahead": ahead, **standin.measured_run(llm, fb.batch_generation, run_job)}), flush=True)
shutil.rmtree(work, ignore_errors=True)
