"""Several runs of the flow on one engine whose front end has a process of its own (as on GPUs), on the real CPU
engine: after each run, what the engine's process and the flow's process hold (objects the collector tracks,
threads, the stream's queues), and which kinds of objects the flow's process gained between the second and the
last run.

    python benchmarks/results/cpu-runs-on-one-engine/runs.py ITEMS RUNS      # e.g. 32 5, 160 4
"""
import collections
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[2])]  # probe (the engine process finds it on PYTHONPATH), the repo

import benchmarks.run as br  # noqa: E402
import probe  # noqa: E402

br.set_environment()
br.ENGINE.update(front_end_process=True)
from prefect.testing.utilities import prefect_test_harness  # noqa: E402

from flows.batch_generation import batch_generation  # noqa: E402


def kinds() -> collections.Counter:
    gc.collect()  # what is still referenced, not cycles the collector has not reached yet
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


work = Path(tempfile.mkdtemp(prefix="runs-on-one-engine-"))
products = br.write_products(work / "products.csv", int(sys.argv[1]))
runs = int(sys.argv[2])
with prefect_test_harness(server_startup_timeout=120):
    engine, info = br.start_engine(br.TreeMemory())
    print("front end:", info["front_end"], flush=True)
    for i in range(runs):
        started, before = time.perf_counter(), engine.feed()
        batch_generation(br.bench_job(products, work / f"out-{i}", 4))
        wall, after = time.perf_counter() - started, engine.feed()
        steps = after["steps"] - before["steps"]
        print(json.dumps({"run": i, "wall": round(wall, 2), "steps": steps,
                          "ms_step": round(1000 * (after["busy_seconds"] - before["busy_seconds"]) / max(steps, 1)),
                          "engine": engine.run(probe.heap), "flow": probe.heap(),
                          "flow_after_collect": probe.heap(collect=True)}), flush=True)
        if i == 1:
            second = kinds()
    gained = kinds() - second
    print(f"gained by the flow's process from run 1 to run {runs - 1}: {sum(gained.values())} objects;",
          ", ".join(f"{k} {v}" for k, v in gained.most_common(15)), flush=True)
    engine.close()
