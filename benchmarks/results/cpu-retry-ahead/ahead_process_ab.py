"""The job with retries on the stand-in engine that batches like vLLM, run inside an engine process of its own (as
every GPU run is: batchgen.engine_process), retry.ahead off and on, alternating.

    STEP=0.03 CUT=15 PREFECT_HOME=$PWD/.prefect BATCHGEN_CACHE=$PWD/.cache \
        .venv/bin/python benchmarks/results/cpu-retry-ahead/ahead_process_ab.py 2000 2

The stand-in (benchmarks/standin.py: BatchingStandInEngine; 1,024 at once, one token per step of STEP s, CUT% of
the requests cut off by a hash of their id, first come first served) in the engine process, spares and their
withdrawals crossing its socket; the example job's retries (grow x2 up to 320 tokens, 2 passes, in the stream),
80 tokens, windows in flight 3. One JSON line per run: wall time, the engine's steps and busy seconds (its
stream's counters), the seconds from the last output to the end of staging. An ad-hoc measurement kept with its
figures (README.md)."""
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))


class BatchingLLM:
    """The factory the engine process builds: vllm.LLM's surface over benchmarks.standin.batching_standin()."""

    def __init__(self):
        from benchmarks.standin import batching_standin

        self.llm_engine = batching_standin()
        self.llm_engine.model_config = SimpleNamespace(max_model_len=2048, dtype="float32")

    def get_tokenizer(self):
        return None


def main():
    from benchmarks import run as bench
    bench.set_environment()
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT)]
                                               + [p for p in [os.environ.get("PYTHONPATH")] if p])
    from batchgen.engine_process import ProcessEngine
    from batchgen.models import resolve_model
    from benchmarks.standin import ahead_runs, retry_bench_job
    model = resolve_model(None)
    engine = ProcessEngine(model, {}, {}, factory="ahead_process_ab:BatchingLLM")
    import batchgen.engine
    batchgen.engine.get_engine = lambda spec: engine
    import tasks.generate
    tasks.generate.get_engine = lambda spec: engine
    items, reps = int(sys.argv[1]), int(sys.argv[2])
    work = Path(tempfile.mkdtemp())
    job = retry_bench_job(items, work, 80)
    import flows.batch_generation as fb
    from prefect.testing.utilities import prefect_test_harness
    from batchgen.engine_process import stream_feed
    with prefect_test_harness(server_startup_timeout=120):
        fb.batch_generation(bench.bench_job(bench.write_products(work / "w.csv", 8), work / "ow", 16))
        for ahead, run_job in ahead_runs(job, work, reps):
            f0 = engine.run(stream_feed)
            t = time.perf_counter()
            m = fb.batch_generation(run_job)
            wall = time.perf_counter() - t
            f1 = engine.run(stream_feed)
            ts = m.timings_seconds
            print(json.dumps({"ahead": ahead, "wall": round(wall, 2), "steps": f1["steps"] - f0["steps"],
                              "busy": round(f1["busy_seconds"] - f0["busy_seconds"], 2),
                              "after_last_output": round(ts["total_before_publish"] - ts["last_output"], 2),
                              "generate": round(ts["generate"], 2)}), flush=True)
    engine.close()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    import ahead_process_ab
    ahead_process_ab.main()
