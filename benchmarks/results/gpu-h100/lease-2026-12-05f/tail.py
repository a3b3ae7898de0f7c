"""What each job with retries did after its generate tasks ended, read from a paired80 log: when the last generate
task, the last validation and the last window's staging finished, and publishing (seconds after the last generate
task). python tail.py new1-paired80.log ..."""
import re
import sys
from datetime import datetime

LINE = re.compile(r"^(\d\d:\d\d:\d\d\.\d+) \| INFO +\| Task run '([^']+)' - (.*)$")


def seconds(stamp: str) -> float:
    t = datetime.strptime(stamp, "%H:%M:%S.%f")
    return t.hour * 3600 + t.minute * 60 + t.second + t.microsecond / 1e6


for path in sys.argv[1:]:
    run, ends = None, {}
    for line in open(path, encoding="utf-8"):
        if "(a') the flow on" in line:
            run, ends = "with retries", {}
        match = LINE.match(line.rstrip("\n"))
        if run is None or match is None:
            continue
        stamp, task, message = match.groups()
        kind = task.split("-")[0]
        if message.startswith("Finished in state Completed"):
            ends.setdefault(kind, []).append((seconds(stamp), task))
        if task == "publish" and " accepted, " in message:
            name = re.search(r"out-10000-80-retries-([a-z_0-9]+)/", message).group(1)
            last_generate = max(ends["generate"])[0]
            windows = sum(1 for t, _ in ends["generate"] if t > last_generate - 0.5)
            after = lambda kind: max(ends[kind])[0] - last_generate
            print(f"{path}: {name}: generate tasks ending in the last 0.5 s {windows}; after the last one: "
                  f"validations end +{after('validate'):.2f} s, staging ends +{after('stage'):.2f} s, "
                  f"published +{seconds(stamp) - last_generate:.2f} s")
            run = None
