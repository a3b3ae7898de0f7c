"""Profile the flow's own work (time outside engine calls) with pyinstrument.

    python -m benchmarks.profile_flow --items 1000 --max-tokens 8 --out /tmp/profile

Builds the engine once, runs a warm-up flow (8 items), then one profiled flow run on
`--items` example products; writes profile.html and profile.txt (pyinstrument's call tree
of the main thread) and prints the manifest's timings. A small max_tokens keeps the engine's
share small, so the pipeline's own costs stand out.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_flow", description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--interval", type=float, default=0.001, help="pyinstrument sampling interval (s)")
    parser.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="batchgen-profile-")))
    args = parser.parse_args(argv)

    from benchmarks import run as bench

    bench.set_environment()
    from prefect.testing.utilities import prefect_test_harness
    from pyinstrument import Profiler

    import batchgen.engine

    work = Path(tempfile.mkdtemp(prefix="batchgen-profile-work-"))
    args.out.mkdir(parents=True, exist_ok=True)
    memory = bench.TreeMemory()
    with prefect_test_harness(server_startup_timeout=120):
        engine, _ = bench.start_engine(memory)
        warm_job = bench.bench_job(bench.write_products(work / "warm.csv", 8), work / "out-warm", 4)
        bench.check_engine_spec(warm_job)
        bench.run_flow(warm_job, memory)
        job = bench.bench_job(bench.write_products(work / f"products-{args.items}.csv", args.items),
                              work / "out", args.max_tokens)
        from flows.batch_generation import batch_generation

        profiler = Profiler(interval=args.interval)
        started = time.perf_counter()
        profiler.start()
        manifest = batch_generation(job)
        profiler.stop()
        wall = time.perf_counter() - started
        batchgen.engine.shutdown_all()
    memory.close()
    timings = manifest["timings_seconds"]
    summary = {"items": args.items, "max_tokens": args.max_tokens, "wall_seconds": round(wall, 3),
               "timings_seconds": timings,
               "outside_engine_seconds": round(wall - timings["engine_calls"], 3),
               "outside_engine_per_item_ms": round(1000 * (wall - timings["engine_calls"]) / args.items, 3)}
    (args.out / "profile.html").write_text(profiler.output_html(), encoding="utf-8")
    (args.out / "profile.txt").write_text(profiler.output_text(unicode=False, color=False, show_all=False),
                                          encoding="utf-8")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.out / 'profile.html'} and profile.txt")
    return 0


if __name__ == "__main__":  # vLLM spawns its engine core: this module must be importable
    sys.exit(main())
