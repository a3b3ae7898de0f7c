"""Where one method's engine steps spend more than another's: the engine core's profiles side by side, by function.

    python -m benchmarks.profile_compare OUT/engine-core-profiles/60000x16-repeat1-{raw,default,stream}.txt
    python -m benchmarks.profile_compare OUT/engine-core-profiles --thread MainThread --top 20

Reads the collapsed stacks that `benchmarks.run --profile-engine-core` keeps (one file per method and repeat; a
folder stands for its .txt files) and prints a Markdown table: one column per file, one row per function with the
seconds one thread spent in it and in what it called (each stack counted once per function), the functions whose
seconds differ most between the files first; of a chain of callers with the same seconds in every file (the
process's start down to vLLM's step), only the deepest.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from benchmarks.run import PROFILE_RATE, collapsed_stacks

CLOSE = 0.02  # functions whose seconds are within this share of each other's in every file: one row (a chain)


def inclusive(collapsed: str, thread: str) -> tuple[Counter[str], int, dict[str, int]]:
    """Samples by function (a stack once per function in it), all samples, and each function's depth (its least
    frame index) in the threads named `thread`."""
    by_function: Counter[str] = Counter()
    depth: dict[str, int] = {}
    samples = 0
    for name, functions, n in collapsed_stacks(collapsed):
        if name != thread:
            continue
        samples += n
        for index, function in enumerate(functions):
            depth[function] = min(depth.get(function, index), index)
        for function in set(functions):
            by_function[function] += n
    return by_function, samples, depth


def compare(profiles: dict[str, str], thread: str = "MainThread", top: int = 25,
            rate: int = PROFILE_RATE) -> list[str]:
    """The table's lines for `profiles` (label -> collapsed stacks)."""
    counted = {label: inclusive(text, thread) for label, text in profiles.items()}
    functions = set().union(*(c for c, _, _ in counted.values()))
    seconds = {f: [c[f] for c, _, _ in counted.values()] for f in functions}
    depth = {f: min(d.get(f, 1 << 30) for _, _, d in counted.values()) for f in functions}

    def close(a: list[int], b: list[int]) -> bool:
        return all(abs(x - y) <= max(CLOSE * max(x, y), 2) for x, y in zip(a, b))

    # the functions whose seconds differ most between the files; of a chain of callers with the same seconds
    # (a function and the one it spends all its time in), the deepest stands for all
    rows: list[str] = []
    for f in sorted(functions, key=lambda f: (-(max(seconds[f]) - min(seconds[f])), -depth[f], f)):
        near = next((i for i, shown in enumerate(rows) if close(seconds[shown], seconds[f])), None)
        if near is None and len(rows) < top:
            rows.append(f)
        elif near is not None and depth[f] > depth[rows[near]]:
            rows[near] = f
    lines = ["| seconds, " + thread + " and what it called | " + " | ".join(counted) + " |",
             "| --- |" + " ---: |" * len(counted),
             "| the thread, active | " + " | ".join(f"{total / rate:.2f}" for _, total, _ in counted.values()) + " |"]
    lines += [f"| `{f}` | " + " | ".join(f"{n / rate:.2f}" for n in seconds[f]) + " |" for f in rows]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_compare", description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", type=Path,
                        help="collapsed stacks from --profile-engine-core (files, or folders of .txt files)")
    parser.add_argument("--thread", default="MainThread", help="the thread to compare (default MainThread: the "
                                                               "engine core's steps)")
    parser.add_argument("--top", type=int, default=25, help="functions shown (default 25)")
    parser.add_argument("--rate", type=int, default=PROFILE_RATE, help=f"py-spy's samples a second (default "
                                                                       f"{PROFILE_RATE}, --profile-engine-core's)")
    args = parser.parse_args(argv)
    files = [f for p in args.paths for f in (sorted(p.glob("*.txt")) if p.is_dir() else [p])]
    missing = [str(f) for f in files if not f.is_file()]
    if missing or not files:
        parser.error(f"no such profile: {', '.join(missing)}" if missing else "no .txt profiles in those folders")
    if args.top < 1 or args.rate < 1:
        parser.error("--top and --rate must be at least 1")
    print("\n".join(compare({f.stem: f.read_text(encoding="utf-8", errors="replace") for f in files},
                            args.thread, args.top, args.rate)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
