"""The job with retries on a stand-in engine that batches like vLLM: window threads made all at once (the tree
before) against as windows take their places (`in_parallel`'s `started`), 8 per place at most either way.

    STEP=0.03 CUT=15 MAXTOK=40 PREFECT_HOME=$PWD/.prefect BATCHGEN_CACHE=$PWD/.cache \\
        .venv/bin/python benchmarks/results/cpu-window-threads-on-demand/retry_chains_ab.py 10000 2

As ../cpu-window-threads/batching_standin_ab.py (its stand-in, windows in flight 3, retries grow x2 for 2 passes in
the stream), alternating the two ways; one JSON line per run, with the window threads the run made."""
import json
import shutil
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import run as bench  # noqa: E402

bench.set_environment()
from prefect.testing.utilities import prefect_test_harness  # noqa: E402

import benchmarks.standin as standin  # noqa: E402

llm, job, work, reps = standin.batching_retry_bench(16)
import flows.batch_generation as fb  # noqa: E402

original = fb.in_parallel
with prefect_test_harness(server_startup_timeout=120):
    fb.batch_generation(bench.bench_job(bench.write_products(work / "w.csv", 8), work / "ow", 16))
    for rep in range(reps):
        for way in (("all_at_once", "on_demand") if rep % 2 == 0 else ("on_demand", "all_at_once")):
            fb.in_parallel = lambda work_, items, workers, started=None, way=way: original(
                work_, items, workers=workers, started=started if way == "on_demand" else None)
            before = {t.ident for t in threading.enumerate()}
            made: set[int] = set()
            out = work / f"out-{rep}-{way}"
            begun = time.perf_counter()
            watch = threading.Event()

            def count() -> None:
                while not watch.wait(0.05):
                    made.update(t.ident for t in threading.enumerate()
                                if t.name.startswith("batchgen-window") and t.ident not in before)

            threading.Thread(target=count, daemon=True).start()
            manifest = fb.batch_generation(job.model_copy(update={"output": job.output.model_copy(
                update={"dir": str(out)})}))
            wall = time.perf_counter() - begun
            watch.set()
            print(json.dumps({"way": way, "wall": round(wall, 2), "window_threads": len(made),
                              "after_last_output": round(begun + wall - llm.llm_engine.last_output_at, 2),
                              "generate": round(manifest.timings_seconds["generate"], 2),
                              "items": manifest.counts.items}), flush=True)
shutil.rmtree(work, ignore_errors=True)
