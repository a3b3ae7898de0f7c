"""The publish step on a timeline: the real flow over n products with the engine stood in (pipeline_only's
measure, windows_in_flight 3 as on a GPU, 80-token outputs by default), with start and end times of the last window's
staging, the publish task and its parts (manifest, seal, exactly-once check, report, commit, artifact), from the
measured run's start. Run from the root of the tree to measure:

    python benchmarks/results/cpu-jsonl-fold/tail_trace.py 10000 80
"""
import functools
import json
import os
import sys
import time

sys.path.insert(0, os.getcwd())
import tasks.publish as tp
import batchgen.publish as bp
EV = []
def traced(name, f):
    @functools.wraps(f)
    def g(*a, **k):
        EV.append((time.perf_counter(), name + " start"))
        try:
            return f(*a, **k)
        finally:
            EV.append((time.perf_counter(), name + " end"))
    return g
for cls, names in ((bp.Publication, ["seal", "commit", "add_window"]),):
    for n in names: setattr(cls, n, traced(n, getattr(cls, n)))
for n in ["check_published_once", "write_report_and_markdown", "create_markdown_artifact", "build_manifest", "finish_publication"]:
    setattr(tp, n, traced(n, getattr(tp, n)))
tp.publish_task.fn = traced("publish_task.fn", tp.publish_task.fn)
import benchmarks.pipeline_only as po
from benchmarks.pipeline_only import measure
n = int(sys.argv[1]); mt = int(sys.argv[2]) if len(sys.argv) > 2 else 80
import benchmarks.run as br
_log = br.log
def log(msg, *a, **k):
    if msg == po.MEASURED_RUN: EV.clear(); EV.append((time.perf_counter(), "MEASURED START"))
    return _log(msg, *a, **k)
br.log = log
fig = measure(n, mt, in_flight=3)
t0 = EV[0][0]
print(json.dumps({"wall": fig["wall_seconds"], "timings": fig["timings_seconds"]}))
last_add = max(t for t, e in EV if e == "add_window end")
for t, e in EV:
    if "add_window" in e and t < last_add - 0.0001: continue
    print(f"{t - t0:8.3f} {e}")
print(f"{fig['wall_seconds']:8.3f} flow returned (wall)")
