"""The publish step's parts, timed: the real flow over n products with the engine stood in (pipeline_only's
measure, windows_in_flight 3 as on a GPU, `max_tokens`-token outputs, 80 by default), timers wrapped around
Publication.add_window/seal/commit, the tables' writes and hashes, the check that every item is published once,
the manifest, the report and the Prefect artifact. Run from the root of the tree to measure:

    python benchmarks/results/cpu-seal-join/tail_timings.py 10000 80

Prints the run's figures (JSON), then per timed function: calls (the warm-up run's first), sum, max, the last
calls' seconds.
"""
import functools
import json
import os
import sys
import time

sys.path.insert(0, os.getcwd())
import tasks.publish as tp
import batchgen.publish as bp
T = {}
def timed(name, f):
    @functools.wraps(f)
    def g(*a, **k):
        s = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            T.setdefault(name, []).append(round(time.perf_counter() - s, 4))
    return g
bp.Publication.seal = timed("seal", bp.Publication.seal)
bp.Publication.commit = timed("commit", bp.Publication.commit)
bp.Publication.add_window = timed("add_window", bp.Publication.add_window)
bp._write_table = timed("write_table", bp._write_table)
bp.sha256_of = timed("sha256", bp.sha256_of)
tp.check_published_once = timed("check_once", tp.check_published_once)
tp.write_report_and_markdown = timed("report", tp.write_report_and_markdown)
tp.create_markdown_artifact = timed("artifact", tp.create_markdown_artifact)
tp.build_manifest = timed("build_manifest", tp.build_manifest)
from benchmarks.pipeline_only import measure
n = int(sys.argv[1]); mt = int(sys.argv[2]) if len(sys.argv) > 2 else 80
fig = measure(n, mt, in_flight=3)
print(json.dumps({"wall": fig["wall_seconds"], "publish_and_rest": fig["publish_and_rest_seconds"],
                  "timings": fig["timings_seconds"]}))
for k, v in T.items():
    print(k, "n=%d" % len(v), "sum=%.3f" % sum(v), "max=%.3f" % max(v), v[-6:] if len(v) < 12 else "")
