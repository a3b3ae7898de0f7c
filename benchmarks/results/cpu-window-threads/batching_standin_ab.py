"""The job with retries on a stand-in engine that batches like vLLM, window threads 2 against 8 per place.

    STEP=0.03 CUT=15 MAXTOK=40 PREFECT_HOME=$PWD/.prefect BATCHGEN_CACHE=$PWD/.cache \
        .venv/bin/python benchmarks/results/cpu-window-threads/batching_standin_ab.py 10000 2

The stand-in (benchmarks/standin.py: BatchingStandInEngine) holds at most 1,024 requests running, gives each one
token per step of STEP seconds, so a request of max_tokens takes max_tokens steps, and cuts off CUT% of them (the
others stop at 60% of their budget): a cut-off output's retries (grow x2, 2 passes) are a chain of steps, as on a
GPU. The flow runs with windows_in_flight 3 and its window threads set to 2 or 8 per place, alternating; one JSON
line per run. An ad-hoc measurement kept with its figures (README.md), not a benchmark of the suite."""
import sys, time, shutil, json
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
from benchmarks import run as bench
bench.set_environment()
from prefect.testing.utilities import prefect_test_harness
import benchmarks.standin as standin
llm, job, work, reps = standin.batching_retry_bench(16)
import flows.batch_generation as fb
orig_ip = fb.in_parallel
with prefect_test_harness(server_startup_timeout=120):
    fb.batch_generation(bench.bench_job(bench.write_products(work / "w.csv", 8), work / "ow", 16))
    for rep in range(reps):
        for per in ((2, 8) if rep % 2 == 0 else (8, 2)):
            fb.in_parallel = lambda work_, items, workers, started=None, per=per: orig_ip(work_, items, workers=per * 3,
                                                                                        started=started)
            out = work / f"out-{rep}-{per}"
            t = time.perf_counter()
            m = fb.batch_generation(job.model_copy(update={"output": job.output.model_copy(update={"dir": str(out)})}))
            wall = time.perf_counter() - t
            print(json.dumps({"threads_per_slot": per, "wall": round(wall, 2), "after_last_output": round(t + wall - llm.llm_engine.last_output_at, 2), "timings": {k: round(v, 2) for k, v in m.timings_seconds.items()}, "items": m.counts.items, "generate": round(m.timings_seconds["generate"], 2)}), flush=True)
shutil.rmtree(work, ignore_errors=True)
