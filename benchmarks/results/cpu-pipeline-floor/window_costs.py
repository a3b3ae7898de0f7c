"""Thread CPU seconds of the flow's steps in one pipeline-only run, per item: run at two window sizes, the
difference over the difference in windows is each step's fixed cost per window.

    PYTHONPATH=$PWD python benchmarks/results/cpu-pipeline-floor/window_costs.py 30000 512
    PYTHONPATH=$PWD python benchmarks/results/cpu-pipeline-floor/window_costs.py 30000 2048

Each task's function (and some functions inside) is wrapped to add its thread's CPU time (time.thread_time): the
tokenizer's pool threads, Prefect's own threads and its server are not in these figures (benchmarks.pipeline_floor
measures Prefect's); one run of benchmarks.pipeline_only's `measure` (engine stood in, 90% of outputs accepted).
"""

import collections
import functools
import importlib
import sys
import threading
import time

from benchmarks import pipeline_only

spent: collections.Counter = collections.Counter()
lock = threading.Lock()


def timed(fn, label):
    @functools.wraps(fn)  # Prefect binds a task's parameters by its function's signature
    def inner(*args, **kwargs):
        started = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            with lock:
                spent[label] += time.thread_time() - started
    return inner


def wrap(owner, name, label):
    owner = importlib.import_module(owner) if isinstance(owner, str) else owner
    setattr(owner, name, timed(getattr(owner, name), label))


import batchgen.publish  # noqa: E402
import batchgen.store  # noqa: E402
import tasks.generate  # noqa: E402
import tasks.prompts  # noqa: E402
import tasks.publish  # noqa: E402
import tasks.validate  # noqa: E402

for name in ("assemble", "tally", "latest_attempts"):
    wrap("tasks.publish", name, f"stage.{name}")
for name, label in (("frame_tables", "frame_tables"), ("_write_jsonl", "jsonl_parts"),
                    ("write_atomic", "parquet_parts")):
    wrap("batchgen.publish", name, f"stage.{label}")
wrap(batchgen.publish._WindowJoin, "add", "stage.join")
wrap(batchgen.store.ResultStore, "commit", "generate.store_commit")
wrap("tasks.generate", "run_requests", "generate.run_requests")
wrap("expectations.validate", "validate_frame", "validate.gx")
for task, label in ((tasks.prompts.build_prompts_task, "prompts"), (tasks.generate.generate_task, "generate"),
                    (tasks.validate.validate_task, "validate"), (tasks.publish.stage_window_task, "stage"),
                    (tasks.publish.publish_task, "publish")):
    task.fn = timed(task.fn, label)

items, window = int(sys.argv[1]), int(sys.argv[2])
figures = pipeline_only.measure(items, 4, None, None, 90, window)
print(f"{items:,} items, windows of {window:,}: {figures['items_per_second']:,.0f} items/s, "
      f"task runs {figures['prefect'].get('task_runs')}, CPU s {figures['cpu_seconds']}")
for label, seconds in sorted(spent.items()):
    print(f"{label:28s} {seconds:6.2f} s {1e6 * seconds / items:6.1f} us/item")
