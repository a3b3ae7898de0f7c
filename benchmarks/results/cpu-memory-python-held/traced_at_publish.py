"""What Python holds at the publish step that it did not hold after the warm-up: tracemalloc from the measured
run's start, snapshot as publish begins; top lines."""
import sys, tracemalloc, collections
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
import benchmarks.pipeline_only as po
import benchmarks.run as bench
SNAP = {}
orig_log = bench.log
def log(message):
    if message == po.MEASURED_RUN:
        tracemalloc.start(4)
    return orig_log(message)
bench.log = log
orig = po.measure
def measure(*a, **k):
    import tasks.publish as tp
    fn = tp.publish_task.fn
    def wrapped(*args, **kw):
        if tracemalloc.is_tracing(): SNAP["s"] = tracemalloc.take_snapshot()
        SNAP["size"] = tracemalloc.get_traced_memory()
        return fn(*args, **kw)
    tp.publish_task.fn = wrapped
    return orig(*a, **k)
po.measure = measure
po.main(["--one", sys.argv[1], "--windows-in-flight", "3"] + sys.argv[2:])
s = SNAP["s"]
print("traced at publish (current, peak) MB:", [round(x / 2**20, 1) for x in SNAP["size"]], file=sys.stderr)
for stat in s.statistics("traceback")[:12]:
    print(f"{stat.size/2**20:8.2f} MB {stat.count:8d} blocks", file=sys.stderr)
    for line in stat.traceback.format()[-8:]:
        print("      " + line.strip(), file=sys.stderr)
