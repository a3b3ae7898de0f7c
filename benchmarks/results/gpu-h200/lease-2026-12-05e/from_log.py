"""The figures of paired80.log's runs, read from the flow's own log lines (the run was stopped by its time limit
before it wrote latest.json): per flow run, output tokens generated, cut-off outputs retried in the stream, the
retries' outputs cut off again, those left cut off after the last pass, accepted and rejected; per job with
retries, its time against the raw call beside it.

    python benchmarks/results/gpu-h200/lease-2026-12-05e/from_log.py [another benchmarks.run log]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

LOG = Path(__file__).with_name("paired80.log")


def main() -> None:
    runs: list[dict] = []
    log = Path(sys.argv[1]) if len(sys.argv) > 1 else LOG
    for line in log.read_text(encoding="utf-8").splitlines():
        started = re.match(r"\[bench [\d:]+\] \(a'?\) the flow on (\d+) items, max_tokens (\d+)(.*)", line)
        if started:
            strategy = re.search(r"'strategy': '(\w+)'", started.group(3))
            runs.append({"run": strategy.group(1) if strategy else "retries off", "tokens": 0, "retried": 0,
                         "cut_again": 0, "left_cut": 0})
            continue
        if not runs:
            continue
        run = runs[-1]
        if m := re.search(r"with retries \(\w+\): job ([\d.]+) s against raw first pass ([\d.]+) s", line):
            run["job_s"], run["raw_s"] = float(m.group(1)), float(m.group(2))
        if line.startswith("[bench "):  # the benchmark's own step: this flow run's lines have ended
            run["closed"] = True
        if run.get("closed"):
            continue
        if m := re.search(r"generate \[[^\]]+\]: \d+ requests(?: and (\d+) cut-off outputs retried in the stream)? "
                          r"-> \d+ outputs, \d+ reused, (\d+) new output tokens", line):
            run["tokens"] += int(m.group(2))
            run["retried"] += int(m.group(1) or 0)
        if m := re.search(r"validate \[w\d+-retry1\]: .*truncated failed (\d+)", line):
            run["cut_again"] += int(m.group(1))
        if m := re.search(r"plan \[w\d+-retry3\]: (\d+) outputs cut off", line):
            run["left_cut"] += int(m.group(1))
        if m := re.search(r"publish: (\d+) accepted, (\d+) rejected", line):
            run["accepted"], run["rejected"] = int(m.group(1)), int(m.group(2))
    print("| run | output tokens | retry attempts in the stream | retries cut off again | left cut off | accepted "
          "| job s | raw first pass s | raw / job |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for run in runs:
        if "accepted" not in run:
            print(f"| {run['run']} | (stopped by the time limit) | | | | | | | |")
            continue
        job, raw = run.get("job_s"), run.get("raw_s")
        print(f"| {run['run']} | {run['tokens']:,} | {run['retried']:,} | {run['cut_again']} | {run['left_cut']} "
              f"| {run['accepted']:,} | {job or ''} | {raw or ''} | {f'{raw / job:.3f}' if job else ''} |")


if __name__ == "__main__":
    main()
