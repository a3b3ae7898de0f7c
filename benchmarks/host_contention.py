"""How much one thread on this host slows while other cores are busy: hidden SMT siblings, a shared clock.

    python -m benchmarks.host_contention                 # about 20 s on 16 CPUs
    python -m benchmarks.host_contention --out DIR       # DIR/host-contention.json and .md

vLLM's engine core steps a small model at the pace of one Python thread (scheduling, input preparation, sampling
between short GPU kernels), so on a GPU host that thread's speed is the engine's. A VM shows its vCPUs as cores;
two of them may be one physical core's hyperthreads, and a host's clock may drop as more of its cores work. This
times a pure-Python loop on one CPU (the probe's, pinned there), alone and beside one process spinning on each
other CPU in turn, then beside 1, 2, 4, ... spinners on the CPUs that slowed it least. Each figure is the probe's
rate beside the spinners over its rate alone just before (the median of `--timings` timings each), so the host's
drift is taken out.

- A CPU whose spinner takes the probe's rate far lower than the others' do is its hidden sibling: keeping that CPU
  idle (or the engine core's sibling) is worth something on such a host; the other CPUs are not.
- A rate that falls with the number of spinners, wherever they run, is the clock or memory the cores share: any
  CPU work beside the engine slows it, and the lever is doing less of it while the engine generates.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

SETTLE = 0.05  # seconds a spinner runs before the probe is timed beside it
TITLE = "batchgen-contention-spinner"  # in the spinners' command line
# A spinner on one CPU: busy until its parent (this benchmark) is gone or it is killed.
_SPIN = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[2])})
parent, x, n = os.getppid(), 0, 0
while True:
    x = (x * 31 + n) & 0xFFFF
    n += 1
    if n % 200000 == 0 and os.getppid() != parent:
        break
"""


def work(rounds: int) -> int:
    """The probe: integer arithmetic, a list and a dict, as an interpreter's bookkeeping does."""
    x, seen, items = 0, {}, []
    for n in range(rounds):
        x = (x * 31 + n) & 0xFFFF
        seen[x & 1023] = n
        items.append(x)
        if len(items) > 256:
            items.clear()
    return x + len(seen)


def calibrate(seconds: float) -> int:
    """Rounds of `work` that take about `seconds` here, alone."""
    rounds = 10000
    while True:
        started = time.perf_counter()
        work(rounds)
        took = time.perf_counter() - started
        if took >= seconds / 4:
            return max(1, int(rounds * seconds / took))
        rounds *= 4


def rate(rounds: int, timings: int) -> float:
    """Rounds a second: the median of `timings` timings."""
    rates = []
    for _ in range(timings):
        started = time.perf_counter()
        work(rounds)
        rates.append(rounds / (time.perf_counter() - started))
    return statistics.median(rates)


def spinners(cpus: list[int]) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", _SPIN, TITLE, str(cpu)]) for cpu in cpus]


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


def beside(cpus: list[int], rounds: int, timings: int) -> dict[str, Any]:
    """The probe's rate alone, then beside spinners on `cpus`: their ratio."""
    alone = rate(rounds, timings)
    procs = spinners(cpus)
    try:
        time.sleep(SETTLE)
        loaded = rate(rounds, timings)
    finally:
        stop(procs)
    return {"cpus": cpus, "alone": round(alone), "beside": round(loaded), "ratio": round(loaded / alone, 3)}


def counts(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n."""
    out, k = [], 1
    while k < n:
        out.append(k)
        k *= 2
    return out + [n] if n else out


def lscpu() -> dict[str, str]:
    """lscpu's facts about the CPUs (model, threads per core, clock, caches), where it runs."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    keep = ("Model name", "Thread(s) per core", "Core(s) per socket", "Socket(s)", "CPU max MHz", "CPU MHz",
            "L3 cache", "NUMA node(s)", "Hypervisor vendor")
    facts = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {key: facts[key].strip() for key in keep if key in facts}


@contextmanager
def pinned(cpu: int, seconds: float) -> Iterator[int]:
    """This process on `cpu` alone for the block, with the rounds of `work` that take about `seconds` there."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield calibrate(seconds)
    finally:
        os.sched_setaffinity(0, before)


def scan(probe: int, cpus: list[int], seconds: float, timings: int) -> list[dict[str, Any]]:
    """The probe pinned on `probe`, beside one spinner on each other CPU in turn."""
    with pinned(probe, seconds) as rounds:
        return [beside([cpu], rounds, timings) for cpu in cpus if cpu != probe]


def measure(seconds: float = 0.1, timings: int = 3, probe_cpus: list[int] | None = None) -> dict[str, Any]:
    """Each probe CPU's scan (the first's figures at the top level), then the first probe beside 1, 2, 4, ...
    spinners on the CPUs that slowed it least."""
    cpus = sorted(os.sched_getaffinity(0))
    probes = probe_cpus or cpus[:1]
    scans = {probe: scan(probe, cpus, seconds, timings) for probe in probes}
    probe, per_cpu = probes[0], scans[probes[0]]
    # the spinners' CPUs for the counts: those that slowed the probe least first, its suspected sibling last
    quiet = [row["cpus"][0] for row in sorted(per_cpu, key=lambda row: -row["ratio"])]
    with pinned(probe, seconds) as rounds:
        by_count = [beside(quiet[:k], rounds, timings) | {"spinners": k} for k in counts(len(quiet))]

    def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
        ratios = [row["ratio"] for row in rows]
        return {"per_cpu_median": round(statistics.median(ratios), 3) if ratios else None,
                "slowest_cpu": min(rows, key=lambda row: row["ratio"]) if rows else None}

    return {
        "when": datetime.now(timezone.utc).isoformat(),
        "lscpu": lscpu(),
        "cpus": len(cpus),
        "probe_cpu": probe,
        "probe_seconds": seconds,
        "timings": timings,
        "per_cpu": per_cpu,
        "by_count": by_count,
        **summary(per_cpu),
        "other_probes": [{"probe_cpu": other, "per_cpu": scans[other], **summary(scans[other])}
                         for other in probes[1:]],
    }


def scan_lines(lead: str, scanned: dict[str, Any]) -> list[str]:
    """One probe CPU's scan (`per_cpu`, with its summary): a sentence, then the ratio beside each other CPU."""
    slowest = scanned["slowest_cpu"]
    return [f"{lead}: median ratio **{scanned['per_cpu_median']}** over the other CPUs; the lowest "
            f"**{slowest['ratio']}** with it on CPU {slowest['cpus'][0]}.", "",
            "| spinner's CPU | ratio |", "| ---: | ---: |"] + [f"| {row['cpus'][0]} | {row['ratio']} |"
                                                            for row in scanned["per_cpu"]]


def report(result: dict[str, Any]) -> str:
    facts = ", ".join(f"{key} {value}" for key, value in result["lscpu"].items()) or "lscpu not available"
    lines = [
        "# One thread's pace beside busy cores",
        "",
        f"`python -m benchmarks.host_contention` ({result['when']}), {result['cpus']} CPUs: {facts}.",
        "",
        f"The probe (a pure-Python loop of about {result['probe_seconds']} s) on CPU {result['probe_cpu']}; each ratio "
        f"is its rate beside the spinners over its rate alone just before (medians of {result['timings']} timings).",
        "",
    ]
    if result["per_cpu"]:
        lines += scan_lines("Beside one spinner", result)
        lines += ["", "Beside several spinners (on the CPUs that slowed it least first):", "",
                  "| spinners | their CPUs | ratio |", "| ---: | --- | ---: |"]
        lines += [f"| {row['spinners']} | {', '.join(map(str, row['cpus']))} | {row['ratio']} |"
                  for row in result["by_count"]]
        for other in result["other_probes"]:
            lines += [""] + scan_lines(f"The probe on CPU {other['probe_cpu']} beside one spinner", other)
    else:
        lines.append("Only one CPU here: nothing to spin beside the probe.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_contention",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=0.1, help="the probe's length alone (default 0.1 s)")
    parser.add_argument("--timings", type=int, default=3, help="timings per figure, their median kept (default 3)")
    parser.add_argument("--probe-cpu", type=int, nargs="+", default=None,
                        help="the probe's CPU (default: the first allowed); more than one: each is scanned beside a "
                             "spinner on every other CPU (which pairs are siblings), the first also beside several")
    parser.add_argument("--out", type=Path, default=None, help="write host-contention.json and .md into this folder")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.timings < 1:
        parser.error("--seconds must be above 0 and --timings at least 1")
    for cpu in args.probe_cpu or []:
        if cpu not in os.sched_getaffinity(0):
            parser.error(f"--probe-cpu {cpu} is not one of this process's CPUs {sorted(os.sched_getaffinity(0))}")
    result = measure(args.seconds, args.timings, args.probe_cpu)
    text = report(result)
    print(text, end="")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "host-contention.json").write_text(json.dumps(result, indent=2) + "\n")
        (args.out / "host-contention.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
