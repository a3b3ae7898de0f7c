import pickle, time, sys, tempfile, dataclasses, gc, cProfile, pstats
from pathlib import Path
from batchgen.schema import frame_input_codec
from batchgen.publish import Publication
from tasks.publish import stage_window_task
job, window, prompts, engine, validated = pickle.load(open("/tmp/acct/window.pkl", "rb"))
window = dataclasses.replace(window, inputs=frame_input_codec(window.items, window.columns, []))
gc.collect(); gc.freeze()
tmp = Path(tempfile.mkdtemp())
def run():
    pub = Publication.open(tmp / f"o{time.perf_counter_ns()}", jsonl=True)
    t = time.perf_counter(); stage_window_task.fn(job, pub, window, prompts, engine, validated); t = time.perf_counter() - t
    pub.discard(); return t
print("whole: median %.1f ms" % (sorted(run() for _ in range(9))[4] * 1000))
if "--profile" in sys.argv:
    pr = cProfile.Profile(); pr.enable()
    for _ in range(10): run()
    pr.disable(); pstats.Stats(pr).sort_stats(sys.argv[2] if len(sys.argv) > 2 else "tottime").print_stats(30)
