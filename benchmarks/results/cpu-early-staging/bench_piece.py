# Needs the tree of 593796a (stage_first_pass_task); the window pickled by ../cpu-staging-window/dump.py.
import pickle, time, sys, tempfile, dataclasses, gc
from pathlib import Path
import pandas as pd
from batchgen.schema import frame_input_codec
from batchgen.publish import Publication
from tasks.publish import stage_window_task, stage_first_pass_task, final_after_first_pass
job, window, prompts, engine, validated = pickle.load(open("/tmp/acct/window.pkl", "rb"))
window = dataclasses.replace(window, inputs=frame_input_codec(window.items, window.columns, []))
gc.collect(); gc.freeze()
tmp = Path(tempfile.mkdtemp())
def run(early):
    pub = Publication.open(tmp / f"o{time.perf_counter_ns()}", jsonl=True)
    t0 = time.perf_counter()
    e = None
    if early:
        e = stage_first_pass_task.fn(job, pub, window, validated[0], final_after_first_pass(validated[0].rows))
    t1 = time.perf_counter()
    stage_window_task.fn(job, pub, window, prompts, engine, validated, e)
    t2 = time.perf_counter()
    pub.discard()
    return t1 - t0, t2 - t1
for early in (False, True, False, True):
    res = sorted(run(early) for _ in range(7))
    print("early" if early else "whole", "first %.1f ms, last %.1f ms" % (res[3][0]*1000, res[3][1]*1000))
print(len(final_after_first_pass(validated[0].rows)), "of", len(window.items), "final after first pass")
import cProfile, pstats
pub = Publication.open(tmp / "prof", jsonl=True)
e = stage_first_pass_task.fn(job, pub, window, validated[0], final_after_first_pass(validated[0].rows))
pr = cProfile.Profile(); pr.enable()
for _ in range(10):
    stage_window_task.fn(job, pub, window, prompts, engine, validated, e)
pr.disable(); pstats.Stats(pr).sort_stats("cumulative").print_stats(40)
