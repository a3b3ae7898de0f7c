"""The batch-generation flow: load -> prompts -> generate -> validate -> retry -> publish.

Run it as `python -m flows.batch_generation JOB.yaml`, `batchgen run JOB.yaml`, or call
`batch_generation(...)` from Python (with a job path, a JobSpec or a mapping).
"""

from __future__ import annotations

import batchgen  # noqa: F401  (first: sets process defaults before Prefect reads its settings)

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import copy_context
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
from prefect import flow
from prefect.utilities.annotations import quote
from pydantic import Field, WithJsonSchema

from batchgen.generation import first_pass_requests
from batchgen.items import LoadedItems
from batchgen.job import JobSpec, load_job, parse_overrides, job_from_dict
from batchgen.manifest import add_tallies
from batchgen.progress import JobProgress, tracked
from batchgen.publish import discard, open_publication
from batchgen.schema import frame_input_codec
from expectations.validate import merge_results
from tasks.check import check_job_task
from tasks.generate import Generated, generate_task, start_engine, store_for
from tasks.load import load_items_task
from tasks.prompts import build_prompts_task
from tasks.publish import publish_task, stage_window_task
from tasks.retry import plan_retry_task
from tasks.validate import validate_task


def override_pairs(limit: int | None, max_tokens: int | None, overrides: list[str] | None) -> list[str]:
    """The run's parameters as `key=value` job overrides (the form a deployment run passes on)."""
    pairs = list(overrides or [])
    if limit is not None:
        pairs.append(f"input.limit={limit}")
    if max_tokens is not None:
        pairs.append(f"sampling.max_tokens={max_tokens}")
    return pairs


def resolve_job(job: JobSpec | str | dict, limit: int | None = None, max_tokens: int | None = None,
                output_dir: str | None = None, overrides: list[str] | None = None) -> JobSpec:
    """The job to run: a JobSpec, a job file path, or a mapping, with the run's overrides applied."""
    pairs = override_pairs(limit, max_tokens, overrides)
    if output_dir is not None:
        pairs.append(f"output.dir={Path(output_dir).resolve()}")
    extra = parse_overrides(pairs)
    if isinstance(job, JobSpec):
        return job_from_dict(job.model_dump(mode="json"), overrides=extra) if extra else job
    if isinstance(job, dict):
        return job_from_dict(job, overrides=extra)
    return load_job(job, overrides=extra)


# A failed run is retried once as a whole: the retry resumes from the result store, so it
# regenerates only what the failed attempt had not committed. Change with
# batch_generation.with_options(retries=..., retry_delay_seconds=...) or `batchgen run --retries`.
FLOW_RETRIES, FLOW_RETRY_DELAY_SECONDS = 1, 10


# The flow's parameters are the Prefect UI's form (Run -> Custom run): `job` shows as a path (a JobSpec's ~60
# fields do not belong in a form; Python callers may still pass a JobSpec or a mapping), the common overrides as
# typed fields with the docstring's descriptions and their bounds (an optional one as Prefect's "type | None"
# switch), anything else as `overrides` lines.
JobParameter = Annotated[JobSpec | dict | str, WithJsonSchema(
    {"type": "string", "title": "job", "examples": ["examples/product_descriptions.yaml"]})]


@flow(name="batch-generation", log_prints=True, retries=FLOW_RETRIES, retry_delay_seconds=FLOW_RETRY_DELAY_SECONDS)
def batch_generation(
    job: JobParameter,
    limit: Annotated[int | None, Field(ge=1)] = None,
    max_tokens: Annotated[int | None, Field(ge=1)] = None,
    temperature: Annotated[float | None, Field(ge=0)] = None,
    output_dir: str | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Generate one output per input item, validate, retry cut-off outputs, publish; returns the manifest.

    Args:
        job: The job file (YAML): a path relative to the project folder the worker runs in, or absolute.
        limit: Only the first N input rows.
        max_tokens: Token budget of the first pass (sampling.max_tokens), 1 or more; cut-off outputs are retried
            with more.
        temperature: Sampling temperature (sampling.temperature), 0 or more; 0 is greedy.
        output_dir: Publish into this folder instead of the job's output.dir (readers use its `current`).
        overrides: More job settings, one key=value each, e.g. sampling.top_p=0.9 or input.path=data/x.csv
            (docs/job-reference.md lists every field).
    """
    started_at = datetime.now(timezone.utc)
    run = RunTotals()
    extra = [*(overrides or []), *([f"sampling.temperature={temperature}"] if temperature is not None else [])]
    spec = resolve_job(job, limit, max_tokens, output_dir, extra)
    for note in spec.sampling.notes():
        print(f"sampling: {note}")

    with run.clock("load_and_prompts"):
        check_job_task(spec)  # a job mistake stops here, before the engine starts
        loaded = load_items_task(spec)
        keywords = (loaded.items.set_index("item_id")[spec.expectations.keyword_column].astype("string")
                    if spec.expectations.keyword_column else None)
        # One staged publication for the whole run; each window adds its rows to it and is then let go.
        staging = open_publication(Path(spec.output.dir))
        codec = frame_input_codec(loaded.items, loaded.columns, [r.input for r in loaded.rejected])

    if len(loaded.items) and not store_for(spec).has_commits():
        # Nothing of this output was generated before: the engine will be needed, so its start overlaps the
        # prompts of the first window. (A rerun builds it only once a request turns out to be new.)
        print("engine: starting while the first prompts are built")
        start_engine(spec)

    in_flight = windows_in_flight(spec)
    windows = item_windows(len(loaded.items), spec.window_size, ramp=in_flight > 1)
    # One progress for the whole job (items done of all items, across windows and retry passes).
    run.progress = JobProgress(spec.name, len(loaded.items) + len(loaded.rejected), spec.sampling.candidates)
    # While the engine generates one window, the next one's prompts are built and the last one's outputs
    # validated and staged: the engine is fed from several windows at once and never waits for them.
    with tracked(str(Path(spec.output.dir).resolve()), run.progress), \
            ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="batchgen-window") as pool:
        futures = []
        for index, (start, stop) in enumerate(windows):
            label = f"w{index + 1}" if len(windows) > 1 else "all"
            window = LoadedItems(items=loaded.items.iloc[start:stop], rejected=[], columns=loaded.columns)
            futures.append(pool.submit(copy_context().run, run_window, spec, index, label, window,
                                       loaded.rejected if index == 0 else [], keywords, staging, codec, run))
        try:
            for future in futures:
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            pool.shutdown(wait=True)
            discard(staging)  # its copy of the data goes now, not when a later run cleans up
            raise

    run.stop_clock()
    return publish_task(spec, staging, run.counted, quote([merge_results(results) for results in run.validation]),
                        run.model, run.engine_args, run.reused, run.fresh_tokens, run.timings(), started_at)


def windows_in_flight(spec: JobSpec) -> int:
    """The job's windows_in_flight, else 3 on GPUs and 1 on CPU builds (where the engine needs every core)."""
    if spec.windows_in_flight is not None:
        return spec.windows_in_flight
    from batchgen.engine import on_cpu

    return 1 if on_cpu() else 3


RAMP = 256  # the first window's size when windows overlap: the engine gets its first requests early


def item_windows(count: int, size: int, ramp: bool = False) -> list[tuple[int, int]]:
    """[start, stop) ranges of at most `size` items; one empty window when there are no items (rejections only).

    With `ramp`, the first windows grow from RAMP items, doubling up to `size`: the engine starts on the
    first small window while the next ones are being built."""
    bounds, start, width = [], 0, min(RAMP, size) if ramp else size
    while start < count:
        stop = min(start + width, count)
        bounds.append((start, stop))
        start, width = stop, min(width * 2, size)
    return bounds or [(0, 0)]


@dataclass
class RunTotals:
    """What the run keeps of its windows: counts, GX results and figures, never their rows. Windows report from
    their own threads."""

    counted: dict[str, Any] | None = None
    validation: list[list[dict[str, Any]]] = field(default_factory=list)  # per pass, one result per window
    reused: int = 0
    fresh_tokens: int = 0
    model: Any = None
    engine_args: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=lambda: {"load_and_prompts": 0.0, "validate_and_stage": 0.0})
    started: float = field(default_factory=time.perf_counter)
    before_publish: float | None = None
    first_added: float | None = None
    last_output: float | None = None
    first_commit: float | None = None
    engine_seconds: float = 0.0
    progress: JobProgress | None = None  # the job-level progress (terminal bar, or a line every 30 s)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @contextmanager
    def clock(self, step: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            with self.lock:
                self.seconds[step] += time.perf_counter() - started

    def add(self, generated: Generated) -> None:
        with self.lock:
            self.reused += generated.reused
            self.fresh_tokens += generated.fresh_output_tokens
            self.engine_seconds += generated.engine_seconds
            self.engine_args = generated.engine_args
            if generated.first_added_at is not None:
                self.first_added = min(self.first_added or generated.first_added_at, generated.first_added_at)
                self.last_output = max(self.last_output or generated.last_output_at, generated.last_output_at)
            if generated.first_commit_at is not None:
                self.first_commit = min(self.first_commit or generated.first_commit_at, generated.first_commit_at)

    def add_window(self, counted: dict[str, Any], results: list[dict[str, Any]]) -> None:
        with self.lock:
            self.counted = add_tallies(self.counted, counted)
            for number, result in enumerate(results):
                if number == len(self.validation):
                    self.validation.append([])
                self.validation[number].append(result)

    def stop_clock(self) -> None:
        self.before_publish = time.perf_counter()

    def timings(self) -> dict[str, float]:
        """The manifest's timings_seconds. generate: from the first request entering the engine to the last
        output; engine_calls: the tasks' time in the engine, summed, at most generate (windows overlap);
        first_request / first_output: from the flow's start to the first request entering the engine / the first
        committed output."""
        span = (self.last_output - self.first_added) if self.first_added is not None else 0.0
        timings = {**self.seconds, "generate": span, "engine_calls": min(self.engine_seconds, span),
                   "total_before_publish": (self.before_publish or time.perf_counter()) - self.started}
        if self.first_added is not None:
            timings["first_request"] = self.first_added - self.started
        if self.first_commit is not None:
            timings["first_output"] = self.first_commit - self.started
        return timings


def run_window(spec: JobSpec, index: int, label: str, window: LoadedItems, load_rejections: list,
               keywords: pd.Series | None, staging: Path, codec: Any, run: RunTotals) -> None:
    """Prompts, the first pass, validation and retry passes of one window of items, staged into the publication."""
    if run.progress is not None:
        run.progress.window(label, len(window.items) + len(load_rejections))
    with run.clock("load_and_prompts"):
        prompts = build_prompts_task.with_options(task_run_name=f"build-prompts-{label}")(spec, window)
        run.model = prompts.model
        # quote(): Prefect would otherwise walk every request and token id to track task inputs (seconds per window).
        requests = first_pass_requests(prompts.built.prompts, spec.sampling)
    generated = generate_task(spec, quote(requests), label)
    del requests
    run.add(generated)
    with run.clock("validate_and_stage"):
        validated = validate_task.with_options(task_run_name=f"validate-{label}")(
            spec, generated.rows, keywords, f"{label} first pass")
    attempts, results = validated.rows, [validated.result]

    for pass_number in range(1, spec.retry.max_passes + 1):
        requests = plan_retry_task.with_options(task_run_name=f"plan-retry-{label}-{pass_number}")(
            spec, attempts, prompts.max_model_len, pass_number)
        if not requests:
            break
        retried = generate_task(spec, quote(requests), f"{label}-retry{pass_number}")
        run.add(retried)
        with run.clock("validate_and_stage"):
            checked = validate_task.with_options(task_run_name=f"validate-{label}-retry{pass_number}")(
                spec, retried.rows, keywords, f"{label} retry {pass_number}")
            attempts = pd.concat([attempts, checked.rows], ignore_index=True)
        results.append(checked.result)

    with run.clock("validate_and_stage"):
        counted = stage_window_task.with_options(task_run_name=f"stage-window-{label}")(
            spec, staging, index, window.items, window.columns, quote(load_rejections + prompts.built.rejected),
            attempts, codec)
    run.add_window(counted, results)
    if run.progress is not None:
        run.progress.staged_window(label, counted["items"])


if __name__ == "__main__":  # vLLM starts its workers with spawn: this module must be importable
    from batchgen.cli import app

    sys.exit(app(["run", *sys.argv[1:]]))
