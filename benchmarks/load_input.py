"""Loading a large input: time and peak memory of `load_items` on N example rows, each in a fresh process.

    python -m benchmarks.load_input 1000000                 # CSV with an id column (the example job's input)
    python -m benchmarks.load_input 1000000 --hashed        # no id column: ids hashed from the rows
    python -m benchmarks.load_input 1000000 --limit 100     # input.limit stops reading early

The rows are `examples/make_products.py`'s, written once to a temporary CSV. The figure is the
loading process's peak RSS (ru_maxrss: the interpreter and imports included, printed apart)
and the wall time of `load_items` alone. Prints one JSON line; `--out FILE` also writes it.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(path: str, id_column: str | None, limit: int | None) -> dict:
    from batchgen.items import load_items
    from batchgen.job import InputSpec

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    loaded = load_items(InputSpec(path=path, id_column=id_column, limit=limit))
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"items": len(loaded.items), "rejected": len(loaded.rejected), "load_seconds": round(seconds, 2),
            "peak_rss_mb": round(peak / 1024, 1), "rss_before_load_mb": round(before / 1024, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load_input", description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", type=int)
    parser.add_argument("--hashed", action="store_true", help="no id column: ids are hashed from the rows")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--measure", nargs=3, help=argparse.SUPPRESS)  # the child: PATH ID_COLUMN LIMIT
    args = parser.parse_args(argv)
    if args.measure:
        path, id_column, limit = args.measure
        print(json.dumps(measure(path, None if id_column == "-" else id_column,
                                 None if limit == "-" else int(limit))))
        return 0
    sys.path.insert(0, str(ROOT))
    from benchmarks.run import write_products

    work = Path(tempfile.mkdtemp(prefix="batchgen-load-"))
    csv = write_products(work / "products.csv", args.rows)
    child = [sys.executable, "-m", "benchmarks.load_input", "0", "--measure", str(csv),
             "-" if args.hashed else "product_id", "-" if args.limit is None else str(args.limit)]
    done = subprocess.run(child, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stderr[-3000:])
        return done.returncode
    figures = {"rows": args.rows, "file_mb": round(csv.stat().st_size / 2**20, 1), "hashed_ids": args.hashed,
               "limit": args.limit, **json.loads(done.stdout.strip().splitlines()[-1])}
    line = json.dumps(figures)
    print(line)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(line + "\n", encoding="utf-8")
    csv.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
