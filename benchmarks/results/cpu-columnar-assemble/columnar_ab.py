"""`assemble` and a window's whole staging (stage_window_task's body) on captured windows (capture_window.py),
columnar (batchgen.assemble.COLUMNAR) and row by row alternating, N rounds each, in one process.

    N=15 PREFECT_HOME=$PWD/.prefect BATCHGEN_CACHE=$PWD/.cache .venv/bin/python \\
        benchmarks/results/cpu-columnar-assemble/columnar_ab.py /tmp/window-rejected.pkl /tmp/window-accepted.pkl

An ad-hoc measurement kept with its figures (README.md), not a benchmark of the suite."""
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import pandas as pd  # noqa: E402

import batchgen.assemble as assembling  # noqa: E402
import tasks.publish as publish  # noqa: E402
from batchgen.retry import latest_attempts  # noqa: E402

ROUNDS = int(os.environ.get("N", "15"))
for path in sys.argv[1:]:
    job, window, prompts, engine, validated = pickle.load(open(path, "rb"))
    job = job.model_copy(update={"output": job.output.model_copy(update={"dir": tempfile.mkdtemp()})})
    attempts = pd.concat([v.rows for v in validated], ignore_index=True)
    final, rejected = latest_attempts(attempts), window.rejected + prompts.built.rejected
    assembled, staged = {True: [], False: []}, {True: [], False: []}
    with publish.open_publication(job, preload=False) as publication:
        index = 100
        for _ in range(ROUNDS):
            for columnar in (True, False):
                assembling.COLUMNAR = columnar
                started = time.perf_counter()
                assembling.assemble(window.items, window.columns, rejected, final, job.sampling)
                assembled[columnar].append(time.perf_counter() - started)
                index += 1
                started = time.perf_counter()
                publish.stage_window_task.fn(job, publication, window.__class__(**{**window.__dict__, "index": index}),
                                             prompts, engine, validated)
                staged[columnar].append(time.perf_counter() - started)
    for columnar in (True, False):
        print(f"{Path(path).name}: {len(window.items)} items, {int(attempts['passed'].sum())} passing, "
              f"{'columnar' if columnar else 'by rows'}: assemble median "
              f"{1000 * statistics.median(assembled[columnar]):.1f} ms (min {1000 * min(assembled[columnar]):.1f}), "
              f"staging median {1000 * statistics.median(staged[columnar]):.1f} ms "
              f"(min {1000 * min(staged[columnar]):.1f})", flush=True)
