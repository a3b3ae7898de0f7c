"""The batch-generation flow: load -> prompts -> generate -> validate -> retry -> publish.

Run it as `python -m flows.batch_generation JOB.yaml`, `batchgen run JOB.yaml`, or call
`batch_generation(...)` from Python (with a job path, a JobSpec or a mapping).
"""

from __future__ import annotations

import batchgen  # noqa: F401  (first: sets process defaults before Prefect reads its settings)

import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from contextvars import copy_context
from datetime import datetime, timezone
from typing import Annotated, Any

import pandas as pd
from prefect import flow
from prefect.utilities.annotations import quote
from pydantic import Field, WithJsonSchema

from batchgen.gcheap import frozen_heap
from batchgen.generation import first_pass_requests
from batchgen.heartbeat import heartbeats, quick_heartbeat
from batchgen.items import LoadedItems
from batchgen.job import JOB_MISTAKE_TAG, JobError, JobSpec
from batchgen.progress import job_progress
from batchgen.records import Attempt, Manifest, Window, columns_of
from batchgen.resolve import resolve_job
from batchgen.retry import passes_after_stream
from batchgen.schema import frame_input_codec
from expectations.workers import start_validation_workers
from expectations.workers import wanted as validation_workers
from tasks.check import check_job_task
from tasks.generate import generate_task, start_engine_early, store_keys_held
from tasks.load import load_items_task
from tasks.prompts import build_prompts_task
from tasks.publish import open_publication, preload_publish, publish_task, stage_window_task
from tasks.retry import plan_retry_task
from tasks.validate import Validated, validate_task

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


# quick_heartbeat: the run's heartbeat events are sent from the flow's body (`heartbeats()`) by a thread that ends at
# once with the run, where Prefect's own thread added up to a second to every call (batchgen/heartbeat.py).
@quick_heartbeat
@flow(name="batch-generation", log_prints=True, retries=FLOW_RETRIES, retry_delay_seconds=FLOW_RETRY_DELAY_SECONDS)
def batch_generation(
    job: JobParameter,
    limit: Annotated[int | None, Field(ge=1)] = None,
    max_tokens: Annotated[int | None, Field(ge=1)] = None,
    temperature: Annotated[float | None, Field(ge=0)] = None,
    output_dir: str | None = None,
    overrides: list[str] | None = None,
) -> Manifest:
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
    with heartbeats(), frozen_heap(), job_mistakes_not_retried():  # gcheap: collections walk the run's objects only
        spec = resolve_job(job, limit, max_tokens, output_dir, overrides, temperature)
        check_job_task(spec)  # a job mistake stops here, before the engine starts
        places = windows_in_flight(spec)
        # on an accelerator, GX validates in worker processes (their imports take seconds: started now)
        start_validation_workers(validation_workers(places))
        with open_publication(spec, preload=False) as publication, store_keys_held(spec):  # discarded unless published
            loaded = load_items_task(spec)
            start_engine_early(spec, loaded)
            with job_progress(spec, loaded):
                turns, feeding = FirstPromptsFirst(), FeedingWindows(places)
                in_parallel(lambda window: run_window(spec, window, publication, turns, feeding),
                            split_windows(spec, loaded), workers=window_workers(places, spec.retry.max_passes > 0),
                            started=lambda window, timeout: feeding.taken(window.index, timeout))
            return publish_task(spec, publication, started_at)


@contextmanager
def job_mistakes_not_retried() -> Iterator[None]:
    """A job mistake found mid-run (a JobError: an expectation GX cannot evaluate on the real outputs, say) fails
    the flow run at once, its retries (FLOW_RETRIES) set to none first and the run tagged JOB_MISTAKE_TAG (a
    sharded run does not start the shard again either): Prefect's server reschedules any failed run with retries
    left, and a retry would meet the same mistake after its delay and say it twice. Other failures (an engine that
    died, a file being written, a lost server) keep the run's retries."""
    try:
        yield
    except JobError:
        _no_more_retries()
        raise


def _no_more_retries() -> None:
    """The current flow run's retries set to none (its empirical policy on the server), so that its failure is
    final, and the run tagged JOB_MISTAKE_TAG; nothing outside a flow run or where the server cannot be told (the
    run is then retried as before)."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    run = context.flow_run if context is not None else None
    if run is None:
        return
    # max_retries too: the policy's validator gives a run without retries the (deprecated) max_retries' count
    policy = run.empirical_policy.model_copy(update={"retries": 0, "max_retries": 0})
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run(run.id, empirical_policy=policy, tags=[*(run.tags or []), JOB_MISTAKE_TAG])
    except Exception:  # noqa: BLE001  (the mistake is raised all the same; at worst retried once)
        pass


class FirstPromptsFirst:
    """The first window builds its prompts alone: the windows in flight wait for it before building theirs.
    Prompt building holds the interpreter (templates, token lists): beside two other windows' prompts, the first
    window's would take about three times as long, and its requests are the ones that start the engine. Later
    windows build theirs side by side, as the engine works."""

    def __init__(self) -> None:
        self._first_built = threading.Event()

    @contextmanager
    def turn(self, index: int) -> Iterator[None]:
        """Window `index` (from 1) builds its prompts inside this block: the first at once, the others once the
        first's block has ended, whether it built them or failed."""
        if index > 1:
            self._first_built.wait()
        try:
            yield
        finally:
            if index == 1:
                self._first_built.set()


class FeedingWindows:
    """Which windows feed the engine: at most `slots` at once, taken in the windows' order. A window takes its
    slot before it builds its prompts and gives it back once every request of its first pass has its output: its
    cut-off outputs' retries, its validation and its staging then go on beside the next window's first pass, so
    the engine is not left with one window's few long retries while the next window waits for a slot."""

    def __init__(self, slots: int):
        self._free, self._next = slots, 1
        self._changed = threading.Condition()

    @contextmanager
    def slot(self, index: int) -> Iterator[Callable[[], None]]:
        """Window `index` (from 1) feeds the engine inside this block, once the windows before it have their slot
        and one is free; the block gets a release() to give the slot back early (called again at the end: once
        is enough)."""
        with self._changed:
            self._changed.wait_for(lambda: self._next == index and self._free > 0)
            self._free -= 1
            self._next += 1
            self._changed.notify_all()
        given_back = threading.Event()

        def release() -> None:
            with self._changed:
                if not given_back.is_set():
                    given_back.set()
                    self._free += 1
                    self._changed.notify_all()

        try:
            yield release
        finally:
            release()

    def taken(self, index: int, timeout: float) -> bool:
        """Whether window `index` has taken its slot, waiting up to `timeout` seconds for it."""
        with self._changed:
            return self._changed.wait_for(lambda: self._next > index, timeout)


def run_window(spec: JobSpec, window: Window, publication: Any, turns: FirstPromptsFirst | None = None,
               feeding: FeedingWindows | None = None) -> None:
    """Prompts, the first pass (cut-off outputs retried in its stream when retry.in_stream), validation and retry
    passes of one window of items, staged into the publication."""
    with feeding.slot(window.index) if feeding is not None else nullcontext(lambda: None) as release:
        with turns.turn(window.index) if turns is not None else nullcontext():
            prompts = build_prompts_task(spec, window)
        # quote(): Prefect would otherwise walk every request and token id to track task inputs (seconds per
        # window).
        requests = first_pass_requests(prompts.built.prompts, spec.sampling)
        ahead = AttemptValidations(spec, window, release)
        generated = [generate_task(spec, quote(requests), window.label, prompts.max_model_len,
                                   quote(ahead.requests_done), quote(ahead.attempt_done))]
    if window.index == 1:
        preload_publish()  # the engine has had its first requests: the report gets ready meanwhile
    validated: list[Validated] = []
    validate_attempts(spec, window, generated[-1].rows, validated, ahead.results())
    for _ in range(passes_after_stream(spec, prompts.max_model_len)):
        label = pass_label(window, len(validated))
        requests = plan_retry_task(spec, quote([v.rows for v in validated]), prompts.max_model_len, label)
        if not requests:
            break
        generated.append(generate_task(spec, quote(requests), label, prompts.max_model_len))
        validate_attempts(spec, window, generated[-1].rows, validated)
    stage_window_task(spec, quote(publication), window, prompts, [g.stats for g in generated], quote(validated))


def pass_label(window: Window, passes_before: int) -> str:
    """A window's pass in task run names: the window's label for its first pass, `-retryN` after N passes."""
    return window.label if not passes_before else f"{window.label}-retry{passes_before}"


class AttemptValidations:
    """A window's attempts validated attempt number by attempt number, each as soon as no more attempts of it can
    come (generate_task's attempt_done), in a thread of its own, while the window's later retries still run in
    the engine's stream: the first pass once its requests have their outputs, the first retries once every retry
    of the first pass is back, and so on. On a GPU the retry chains of the last windows end with the engine's
    work; what is left after the engine's last output is then the last retries' own few rows, not one validation
    after another of every attempt number. The validations are tasks of the flow run, as the window's others."""

    def __init__(self, spec: JobSpec, window: Window, release: Callable[[], None]):
        self.spec, self.window, self.release = spec, window, release
        self._context = copy_context()  # the flow run's (the window's thread), entered by the validations' threads
        self._threads: dict[int, threading.Thread] = {}
        self._validated: dict[int, Validated] = {}
        self._errors: dict[int, BaseException] = {}

    def requests_done(self, rows: list[Attempt]) -> None:
        """generate_task's requests_done: the window's slot in the engine goes to the next window."""
        self.release()

    def attempt_done(self, attempt: int, rows: list[Attempt]) -> None:
        """generate_task's attempt_done: attempt number `attempt` has all its `rows`; validated in the background.
        Said once more by a generate task that Prefect retried: the same attempts, validated once."""
        if attempt in self._threads or not rows:
            return
        label = pass_label(self.window, len(self._threads))
        # a copy each: a context is entered by one thread at a time, and two attempt numbers may be validated at once
        thread = threading.Thread(target=self._context.copy().run, args=(self._validate, attempt, rows, label),
                                  daemon=True, name=f"batchgen-validate-{label}")
        self._threads[attempt] = thread
        thread.start()

    def _validate(self, attempt: int, rows: list[Attempt], label: str) -> None:
        try:
            frame = pd.DataFrame(columns_of(rows, Attempt))
            self._validated[attempt] = validate_task(self.spec, quote(frame), self.window.keywords(self.spec), label)
        except BaseException as exc:  # noqa: BLE001  (raised in the window's thread by results())
            self._errors[attempt] = exc

    def results(self) -> dict[int, Validated]:
        """The validations made, by attempt number, once they have ended; the first error, if one failed."""
        for attempt, thread in sorted(self._threads.items()):
            thread.join()
            if attempt in self._errors:
                raise self._errors[attempt]
        return dict(self._validated)


def validate_attempts(spec: JobSpec, window: Window, rows: pd.DataFrame, validated: list[Validated],
                      made: dict[int, Validated] | None = None) -> None:
    """Validate a generate task's attempts, one validation per attempt number (a pass each in the report: the
    first pass, then each retry, also those made in the stream), appended to `validated`. `made`: validations
    already made, by attempt number (AttemptValidations)."""
    groups = [(None, rows)] if rows.empty else list(rows.groupby("attempt", sort=True))
    for attempt, group in groups:
        label = pass_label(window, len(validated))
        done = (made or {}).get(attempt)
        if done is not None:
            if len(done.rows) != len(group):  # every attempt of that number was there when it was validated
                raise RuntimeError(f"window {window.label}: attempt {attempt} was validated on {len(done.rows)} "
                                   f"attempts, the generate task returned {len(group)}")
            validated.append(done)
            continue
        validated.append(validate_task(spec, quote(group), window.keywords(spec), label))


# Windows held at once, per window feeding the engine: a window that has left its place keeps its thread through its
# retries, validation and staging. A cut-off output's retries are a chain (80, then 160, then 320 tokens in the
# example job) that takes the engine's step time per token: on the H200 the first windows' chains lasted 22-27 s
# while a window's first pass took ~5 s, so with twice as many threads as places, windows 7 and 8 waited for
# windows 2 and 1 to be staged, places free (the whole job 48.5 s against raw's 32.6 s). The threads that wait
# for a place hold nothing; a window in its retries holds its rows, so memory stays bounded by this many windows.
# Without retries a window that has left its place only validates and stages its rows: two windows per place are
# enough to keep the engine fed, and where the host's work is slower than the engine (a fast engine on few cores)
# fewer windows wait at once for the same cores, each holding its rows and its thread's malloc arena.
WINDOWS_HELD_PER_PLACE = 8
WINDOWS_HELD_PER_PLACE_NO_RETRIES = 2


def window_workers(places: int, retries: bool = True) -> int:
    """Threads for the run's windows: WINDOWS_HELD_PER_PLACE per window feeding the engine, or
    WINDOWS_HELD_PER_PLACE_NO_RETRIES for a job without retry passes."""
    return (WINDOWS_HELD_PER_PLACE if retries else WINDOWS_HELD_PER_PLACE_NO_RETRIES) * places


def windows_in_flight(spec: JobSpec) -> int:
    """The job's windows_in_flight, else 3 on GPUs and 1 on CPU builds (where the engine needs every core)."""
    if spec.windows_in_flight is not None:
        return spec.windows_in_flight
    from batchgen.engine import on_cpu

    return 1 if on_cpu() else 3


def split_windows(spec: JobSpec, loaded: LoadedItems) -> list[Window]:
    """The run's windows (`item_windows`), numbered from 1; the rows rejected on load go with the first."""
    bounds = item_windows(len(loaded.items), spec.window_size, ramp=windows_in_flight(spec) > 1, ramp_down=RAMP_DOWN)
    inputs = frame_input_codec(loaded.items, loaded.columns, [r.input for r in loaded.rejected])
    return [Window(index=number, label=f"w{number}" if len(bounds) > 1 else "all",
                   items=loaded.items.iloc[start:stop], columns=loaded.columns, inputs=inputs,
                   rejected=loaded.rejected if number == 1 else [])
            for number, (start, stop) in enumerate(bounds, start=1)]


RAMP = 256  # the first and last windows' size when windows overlap (see item_windows)
# Whether the last windows shrink as the first ones grow (item_windows' ramp_down). On an H100 the flow without it
# took 5-24% longer in three repeats, its engine stepping slower while full last windows were built and staged
# (benchmarks/results/gpu-h100/lease-2026-12-06b/; alike on the CPU's stand-in engine: cpu-ramp-down/).
# `benchmarks.run --flow-variants full_to_end` runs the flow without it beside the flow with it.
RAMP_DOWN = True


def item_windows(count: int, size: int, ramp: bool = False, ramp_down: bool = True) -> list[tuple[int, int]]:
    """[start, stop) ranges of at most `size` items; one empty window when there are no items (rejections only).

    With `ramp`, the first windows grow from RAMP items, doubling up to `size`, so that the engine starts on a small
    first window while the next ones are being built; and, with `ramp_down` too, the last windows shrink the same way
    down to RAMP items, so that what is left after the engine's last output (the last window's validation and
    staging) is small. The full windows between share their items evenly: no small window left over in the middle
    or at the end."""
    if count <= 0:
        return [(0, 0)]
    if not ramp or size <= RAMP:
        return [(start, min(start + size, count)) for start in range(0, count, size)]
    steps = []  # RAMP, 2 * RAMP, ... below size
    while (RAMP << len(steps)) < size:
        steps.append(RAMP << len(steps))
    head: list[int] = []
    tail: list[int] = []  # from the end backwards
    left = count
    ends = (head, tail) if ramp_down else (head,)
    for step in (step for step in steps for _ in ends):  # a small window at each end in turn
        if left - step < RAMP:  # what is left goes in the middle, no smaller than a ramp's window
            break
        (tail if ramp_down and len(head) > len(tail) else head).append(step)
        left -= step
    middle = -(-left // size)  # full windows, as even as can be
    widths = head + [left // middle + (i < left % middle) for i in range(middle)] + tail[::-1]
    bounds, start = [], 0
    for width in widths:
        bounds.append((start, start + width))
        start += width
    return bounds


def in_parallel(work: Callable[[Any], None], items: list[Any], workers: int,
                started: Callable[[Any, float], bool] | None = None) -> None:
    """work(item) for every item, `workers` at a time, each in the caller's context (its Prefect flow run): while
    the engine generates one window, the next one's prompts are built and the last one's outputs validated and
    staged, so the engine is fed from several windows at once. The first failure cancels what has not started
    and is raised once the running ones have ended.

    `started(item, timeout)`: whether the item has begun (the windows: taken a place feeding the engine), waiting up
    to `timeout` seconds. With it, an item is handed to a thread only once the one before it has begun, so threads
    are made as the work needs them (windows in their first pass, one waiting for a place, and those still in their
    retries, validation or staging) and a thread that has finished its window takes the next, rather than `workers`
    threads each taking one window in turn: every thread that has worked keeps a malloc arena of its own with what it
    freed. On 2 cores with the engine stood in and 3 windows in flight: peak RSS +1.6-1.7 KB per item from 20,000 to
    200,000 items against 2.5-2.7, and 3,409-3,420 items/s at 200,000 against 2,955-3,111; the same job time with
    retry chains (benchmarks/results/cpu-window-threads-on-demand/)."""
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="batchgen-window") as pool:
        futures: list[Future] = []

        def failed() -> bool:
            return any(future.done() and future.exception() is not None for future in futures)

        try:
            for item in items:
                if failed():
                    break  # raised below; what has not started does not start
                futures.append(pool.submit(copy_context().run, work, item))
                while started is not None and not futures[-1].done() and not started(item, 0.05) and not failed():
                    pass
            for future in futures:
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise


if __name__ == "__main__":  # `python -m flows.batch_generation JOB.yaml [key=value ...]`: the flow itself, Prefect's
    # own console; `batchgen run` (`python -m batchgen run`) adds the checks, the quiet terminal and the summary
    import json

    print(json.dumps(batch_generation(sys.argv[1], overrides=sys.argv[2:]).to_json()["counts"], indent=2))
