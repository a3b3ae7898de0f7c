"""What bounds the pipeline's items/s on this machine, besides batchgen's own code: tokenizing and Prefect.

    python -m benchmarks.pipeline_floor                                    # 60,000 items, windows of 2,048 and 8,192
    python -m benchmarks.pipeline_floor --items 60000 --window-sizes 2048 8192 --rounds 2 --out DIR

Every prompt is tokenized (78 us of a core per prompt of the example job on this project's EPYC), and every
window is four Prefect task runs and three artifact calls, each of which costs the client and, more, the Prefect
server CPU. Neither is batchgen's own code, so together they put a ceiling on `benchmarks.pipeline_only`:

    items/s <= cores / (tokenizer core-seconds per item + Prefect CPU per item)

where Prefect CPU per item = (task runs x CPU per task run + artifact calls x CPU per call) / items, counted from
the measured run. Measured here, in one run: (1) the tokenizer on one thread, on the example job's chat-templated
prompts; (2) Prefect's CPU per trivial task run and per artifact call (a progress artifact made and updated, a
table artifact), client (this process) and server (its temporary server's process) apart, under
`prefect_test_harness` as the pipeline benchmark runs; (3) `benchmarks.pipeline_only` at each window size, a fresh
process each, in alternating rounds, with its measured items/s beside the ceiling that (1) and (2) set for it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.pipeline_only import cpu_seconds, prompt_texts, run_child

TASKS = 200  # trivial task runs timed; as many artifact calls of each kind


def tokenizer_per_item(items: int) -> dict[str, Any]:
    """Core-microseconds per prompt of the example job (chat-templated, as the flow tokenizes them), one thread."""
    import tempfile

    from benchmarks import run as bench
    from batchgen.prompts import TOKENIZE_BATCH

    with tempfile.TemporaryDirectory(prefix="batchgen-floor-") as folder:
        work = Path(folder)
        tokenizer, texts = prompt_texts(bench.bench_job(bench.write_products(work / "products.csv", items),
                                                        work / "out", 4))
    fast = tokenizer._tokenizer
    started, cpu = time.perf_counter(), time.thread_time()
    tokens = 0
    for start in range(0, len(texts), TOKENIZE_BATCH):
        encoded = fast.encode_batch_fast(texts[start:start + TOKENIZE_BATCH], add_special_tokens=False)
        tokens += sum(len(e.ids) for e in encoded)
    wall, cpu = time.perf_counter() - started, time.thread_time() - cpu
    per_item = 1e6 / len(texts)
    return {"items": len(texts), "prompt_tokens_per_item": round(tokens / len(texts), 1),
            "us_per_item": round(wall * per_item, 1), "thread_cpu_us_per_item": round(cpu * per_item, 1)}


def prefect_costs(tasks: int = TASKS) -> dict[str, Any]:
    """CPU milliseconds per trivial task run and per artifact call, of this process and of the Prefect server."""
    from prefect import flow, task
    from prefect.artifacts import create_progress_artifact, create_table_artifact, update_progress_artifact
    from prefect.cache_policies import NO_CACHE
    from prefect.testing.utilities import prefect_test_harness

    @task(cache_policy=NO_CACHE)
    def plain(i: int) -> int:
        return i

    @flow
    def task_runs(n: int) -> None:
        for i in range(n):
            plain(i)

    @flow
    def artifact_calls(n: int) -> None:
        for _ in range(n):  # what a window's generate and validate tasks make
            made = create_progress_artifact(progress=1.0, description="floor")
            update_progress_artifact(made, progress=100.0)
            create_table_artifact(table=[{"expectation": "length", "passed": 1}], description="floor")

    def settled() -> dict[str, float]:
        """CPU seconds so far, once the server has gone quiet (it records task runs after the flow returns)."""
        before = cpu_seconds()
        while True:
            time.sleep(1.0)
            now = cpu_seconds()
            if now.get("prefect_server", 0.0) - before.get("prefect_server", 0.0) < 0.02:
                return now
            before = now

    out: dict[str, Any] = {}
    with prefect_test_harness(server_startup_timeout=120):
        task_runs(5)
        artifact_calls(2)
        for name, run, calls in (("task_run", task_runs, tasks), ("artifact_call", artifact_calls, 3 * tasks)):
            before = settled()
            started = time.perf_counter()
            run(tasks)
            wall = time.perf_counter() - started
            after = settled()
            client = after["main"] - before["main"]  # this process: the flow, its tasks and Prefect's threads
            server = after.get("prefect_server", 0.0) - before.get("prefect_server", 0.0)
            out[name] = {"calls": calls, "wall_ms": round(1000 * wall / calls, 2),
                         "client_cpu_ms": round(1000 * client / calls, 2),
                         "server_cpu_ms": round(1000 * server / calls, 2)}
    return out


def ceiling(figures: dict[str, Any], tokenizer: dict[str, Any], prefect: dict[str, Any], cores: int) -> dict[str, Any]:
    """The items/s that tokenizing and Prefect alone allow a pipeline run with these figures on `cores` cores."""
    items = figures["items"]
    records = figures.get("prefect") or {}
    task_runs, artifacts = records.get("task_runs", 0), records.get("artifacts", 0)
    per_task = prefect["task_run"]["client_cpu_ms"] + prefect["task_run"]["server_cpu_ms"]
    per_call = prefect["artifact_call"]["client_cpu_ms"] + prefect["artifact_call"]["server_cpu_ms"]
    # a run's artifacts come from two calls each at most (a progress artifact is made, then updated)
    prefect_us = 1000 * (task_runs * per_task + 1.5 * artifacts * per_call) / items
    floor_us = tokenizer["thread_cpu_us_per_item"] + prefect_us
    used = sum((figures.get("cpu_seconds") or {}).values())
    return {"task_runs": task_runs, "artifacts": artifacts, "prefect_cpu_us_per_item": round(prefect_us, 1),
            "tokenizer_cpu_us_per_item": tokenizer["thread_cpu_us_per_item"],
            "ceiling_items_per_s": round(cores * 1e6 / floor_us),
            "measured_cpu_us_per_item": round(1e6 * used / items, 1) if used else None}


def measure_windows(items: int, window_sizes: list[int], rounds: int, stop_percent: int) -> list[dict[str, Any]]:
    """benchmarks.pipeline_only at each window size, a fresh process each, the sizes alternating round by round."""
    from benchmarks import run as bench

    runs = []
    for round_number in range(1, rounds + 1):
        for size in window_sizes:
            argv = [sys.executable, "-m", "benchmarks.pipeline_only", "--one", str(items), "--window-size", str(size),
                    "--stop-percent", str(stop_percent)]
            bench.log(f"pipeline floor: round {round_number}, windows of {size}")
            figures = run_child(argv, f"the run with windows of {size}")
            runs.append({"round": round_number, "window_size": size, "figures": figures})
    return runs


def render(result: dict[str, Any]) -> list[str]:
    tok, prefect = result["tokenizer"], result["prefect"]
    lines = [
        "# What bounds the pipeline's items/s here: tokenizing and Prefect", "",
        f"`{result['command']}` ({result['finished_at']}), {result['cores']} cores.", "",
        f"- Tokenizer, one thread: **{tok['thread_cpu_us_per_item']} us of CPU per prompt** "
        f"({tok['prompt_tokens_per_item']} tokens, {tok['items']:,} chat-templated prompts of the example job).",
        f"- Prefect, per trivial task run: client {prefect['task_run']['client_cpu_ms']} ms, **server "
        f"{prefect['task_run']['server_cpu_ms']} ms** of CPU ({prefect['task_run']['wall_ms']} ms of the caller's "
        f"time); per artifact call: client {prefect['artifact_call']['client_cpu_ms']} ms, server "
        f"{prefect['artifact_call']['server_cpu_ms']} ms ({prefect['artifact_call']['wall_ms']} ms).", "",
        "| round | window size | task runs | artifacts | Prefect CPU per item (us) | CPU per item, all (us) "
        "| ceiling: tokenizer + Prefect (items/s) | **measured (items/s)** | peak RSS above warm-up (MB) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in result["runs"]:
        f, c = run["figures"], run["ceiling"]
        lines.append(f"| {run['round']} | {run['window_size']:,} | {c['task_runs']} | {c['artifacts']} "
                     f"| {c['prefect_cpu_us_per_item']} | {c['measured_cpu_us_per_item']} "
                     f"| {c['ceiling_items_per_s']:,} | **{f['items_per_second']:,.0f}** "
                     f"| {f['peak_above_warm_up_mb']:,.0f} |")
    lines += ["", "CPU per item, all: the measured run's CPU seconds (the flow's process and the Prefect server) over "
              "its items. The ceiling leaves batchgen's own work out: a run can only come below it.", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pipeline_floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=60000, help="items per pipeline run (default 60,000)")
    parser.add_argument("--window-sizes", type=int, nargs="+", default=[2048, 8192], help="default 2048 8192")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of runs, the window sizes alternating")
    parser.add_argument("--stop-percent", type=int, default=90, help="as benchmarks.pipeline_only (default 90)")
    parser.add_argument("--tasks", type=int, default=TASKS, help=f"trivial task runs timed (default {TASKS}), and as "
                        "many of each artifact call")
    parser.add_argument("--out", type=Path, help="write DIR/latest.json and latest.md")
    args = parser.parse_args(argv)
    if min(args.items, args.rounds, args.tasks, *args.window_sizes) < 1:
        parser.error("--items, --rounds, --tasks and --window-sizes must be positive")
    if not 0 <= args.stop_percent <= 100:
        parser.error("--stop-percent must be between 0 and 100")
    from benchmarks import run as bench

    bench.set_environment()
    from batchgen.workers import usable_cores

    result: dict[str, Any] = {"command": "python -m benchmarks.pipeline_floor " + " ".join(argv or sys.argv[1:]),
                              "started_at": datetime.now(timezone.utc).isoformat(), "cores": usable_cores(),
                              "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}
    bench.log("pipeline floor: the tokenizer on one thread")
    result["tokenizer"] = tokenizer_per_item(min(args.items, 20000))
    bench.log("pipeline floor: Prefect's CPU per task run and per artifact call")
    result["prefect"] = prefect_costs(args.tasks)
    result["runs"] = measure_windows(args.items, args.window_sizes, args.rounds, args.stop_percent)
    for run in result["runs"]:
        run["ceiling"] = ceiling(run["figures"], result["tokenizer"], result["prefect"], result["cores"])
    result["finished_at"] = datetime.now(timezone.utc).isoformat()
    result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    text = "\n".join(render(result))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        page = {**result, "machine": bench.machine_facts(), "versions": bench.package_versions()}
        (args.out / "latest.json").write_text(json.dumps(page, indent=2, default=str) + "\n", encoding="utf-8")
        (args.out / "latest.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
