"""A CPU load that rises with time: on every core, busy for a share of each 100 ms that grows linearly from 0 to
MAX_SHARE over RAMP seconds, then stays there. Started beside a benchmark, it makes the host's pace drift downward
through the run, as a shared GPU host's did (benchmarks/results/gpu-h100/lease-2026-12-07/).

    python benchmarks/results/cpu-pace-probe/hog.py RAMP_SECONDS [MAX_SHARE]
"""

import multiprocessing
import os
import sys
import time

PERIOD = 0.1


def spin(started: float, ramp: float, top: float) -> None:
    while True:
        share = min(top, top * (time.monotonic() - started) / ramp)
        begun = time.monotonic()
        while time.monotonic() - begun < share * PERIOD:
            pass
        time.sleep(max(0.0, PERIOD - (time.monotonic() - begun)))


if __name__ == "__main__":
    ramp, top = float(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 0.9
    started = time.monotonic()
    procs = [multiprocessing.Process(target=spin, args=(started, ramp, top), daemon=True)
             for _ in range(os.cpu_count() or 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
