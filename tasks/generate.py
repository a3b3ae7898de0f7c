"""The GPU (or CPU) generation step: feeds the process's engine stream, commits outputs as they finish."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE

from batchgen.engine import discard_engine, engine_identity, get_engine, planned_engine_args, start_in_background
from batchgen.generation import run_requests
from batchgen.items import LoadedItems
from batchgen.job import JobSpec
from batchgen.progress import for_run, run_key, window_of
from batchgen.records import Attempt, EngineStats, GenRequest, columns_of
from batchgen.retry import job_stop_seam, job_stream_retry
from batchgen.store import ResultStore


@dataclass
class Generated:
    rows: pd.DataFrame  # the attempts (batchgen.records.Attempt), reused ones included
    stats: EngineStats  # its time in the engine, reuse and fresh tokens
    seconds: float  # the whole task, engine start included


def store_for(job: JobSpec) -> ResultStore:
    return ResultStore(Path(job.output.dir) / ".batchgen" / "results")


def commit_owner(label: str) -> tuple[str, str] | None:
    """(flow run, window) of a generate task in a flow run, else None: its commits are its window's items, which
    no other window of the run asks the store for (`ResultStore.commit`)."""
    from prefect.runtime import flow_run

    run = flow_run.get_id()
    return (str(run), window_of(label)) if run else None


@contextmanager
def store_keys_held(job: JobSpec) -> Iterator[None]:
    """The run's result store's cache of which commit file holds which keys, let go when the run ends (however it
    ends): within the run it spares each window a read of every earlier window's files."""
    try:
        yield
    finally:
        store_for(job).forget_keys()


def start_engine_early(job: JobSpec, loaded: LoadedItems, say: bool = True) -> None:
    """When this output has nothing generated yet, the engine will be needed: start it in the background now, so
    its start overlaps the first window's prompts (a rerun builds it only once a request turns out to be new).
    `say`: print that it starts (in a flow, a log line; the CLI keeps its stdout for the results)."""
    if len(loaded.items) and not store_for(job).has_commits():
        if start_in_background(job.engine, lambda spec: get_engine(spec)) is not None and say:
            print("engine: starting while the first prompts are built")


class Progress:
    """The generate task's progress: the Prefect progress artifact (updated at most every `artifact_every`
    seconds), a log line at most every `every` seconds, and the run's job-level progress (batchgen.progress)."""

    def __init__(self, job: JobSpec, label: str, total: int, every: float = 30.0, artifact_every: float = 2.0):
        self.label, self.total, self.every, self.artifact_every = label, total, every, artifact_every
        # the artifact is made at the first update, once the requests are in the engine: its API call is not
        # paid before the engine gets them
        self.description = f"{job.name}: {label}, requests done (%)"
        self.artifact: Any = None
        self.started = time.monotonic()
        self.logged = self.posted = self.started
        self.job = for_run(run_key(job))
        self.window = window_of(label)

    def update(self, finished: int, fresh_tokens: int, engine_seconds: float, generated: int,
               final: int = 0, new_tokens: int = 0, of: int = 0) -> None:
        """`final`: outputs of this commit that are not cut off; `new_tokens`: its output tokens; `of`: the
        requests known so far."""
        now = time.monotonic()
        self.total = max(self.total, of)  # follow-ups (cut-off outputs grown in the stream) add to it
        if self.job is not None:
            self.job.committed(self.window, final, new_tokens)
        if self.artifact is None:
            self.artifact = create_progress_artifact(progress=100.0 * finished / max(self.total, 1),
                                                     description=self.description)
        elif now - self.posted >= self.artifact_every:  # one API call per update: throttled, not per commit
            self.posted = now
            update_progress_artifact(self.artifact, progress=100.0 * finished / max(self.total, 1))
        if now - self.logged >= self.every or finished == self.total:
            self.logged = now
            rate = fresh_tokens / engine_seconds if engine_seconds else 0.0
            left = (self.total - finished) * engine_seconds / max(generated, 1)
            print(f"generate [{self.label}]: {finished}/{self.total} requests, {rate:.0f} output tokens/s, "
                  f"ETA {left:.0f} s")

    def generating(self) -> None:
        if self.job is not None:
            self.job.generating()

    def close(self) -> None:
        if self.artifact is None:
            self.artifact = create_progress_artifact(progress=100.0, description=self.description)
        else:
            update_progress_artifact(self.artifact, progress=100.0)


# The task works through a process-wide engine, not its inputs: caching by inputs would be
# wrong, and reruns are made cheap by the result store instead. A retry (e.g. after an
# engine worker died) builds a fresh engine and resumes from the last commit.
@task(name="generate", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2, task_run_name="generate-{label}")
def generate_task(job: JobSpec, requests: list[GenRequest], label: str, max_model_len: int | None = None,
                  requests_done: Callable[[list[Attempt]], None] | None = None,
                  attempt_done: Callable[[int, list[Attempt]], None] | None = None) -> Generated:
    """Feed every pending request into the engine's stream; commit outputs as they finish; reuse earlier commits.
    With `max_model_len` (the engine's context, for the budgets), cut-off outputs are grown in the same stream
    as they finish when the job says so (retry.in_stream). `requests_done(rows)` is called once every request has its
    output, before the task ends when retries are still running, with the attempts so far (the flow then feeds the
    engine its next window). `attempt_done(attempt, rows)` is said once per attempt number as soon as no more of
    its attempts can come (batchgen.generation.run_requests): the flow validates it beside the later retries."""
    started = time.perf_counter()
    store = store_for(job)
    args = planned_engine_args(job.engine)
    progress = Progress(job, label, len(requests))
    fresh_tokens, generated = 0, 0
    first_commit_at: float | None = None
    follow_up = job_stream_retry(job, max_model_len, job_stop_seam)

    owner = commit_owner(label)

    def on_commit(new_rows: list[Attempt], finished: int, of: int) -> None:
        nonlocal fresh_tokens, generated, first_commit_at
        store.commit(new_rows, owner)
        tokens, final = 0, 0
        if new_rows:  # rates count engine time only: not the engine's start, not reused results
            first_commit_at = first_commit_at or time.perf_counter()
            for row in new_rows:
                tokens += row.new_output_tokens
                final += row.finish_reason != "length"
            fresh_tokens += tokens
            generated += len({r.request_key for r in new_rows})
        else:  # results reused from earlier commits: counted as finished (the window's staging corrects it)
            final = finished * job.sampling.candidates
        progress.update(finished, fresh_tokens, time.perf_counter() - ready, generated, final, tokens, of)

    used = []  # the engine this task ran on, if it needed one
    ready = started  # when the engine was there: rates and ETAs leave its start out

    def engine():
        nonlocal ready
        used.append(get_engine(job.engine))
        ready = time.perf_counter()
        progress.generating()
        return used[-1]

    try:
        ran = run_requests(engine, requests, job.sampling, engine_identity(args), job.chunk_size,
                           job.commit_seconds, done=lambda keys: store.load(keys, owner),  # its commits only
                           on_commit=on_commit, adapters=job.engine.lora_adapters or None, follow_up=follow_up,
                           on_requests_done=requests_done, on_attempt_done=attempt_done)
    except Exception:
        for dead in used:  # the Prefect retry starts from a fresh engine (another window's may already have)
            discard_engine(job.engine, dead)
        raise
    finally:
        progress.close()
    frame = pd.DataFrame(columns_of(ran.rows, Attempt))
    seconds = time.perf_counter() - started
    print(f"generate [{label}]: {len(requests)} requests"
          + (f" and {ran.follow_ups} cut-off outputs retried in the stream" if ran.follow_ups else "")
          + (f" ({ran.spares_kept} started ahead; {ran.spares_dropped} started ahead and dropped, not needed)"
             if ran.spares_kept or ran.spares_dropped else "")
          + f" -> {len(frame)} outputs"
          + f", {ran.reused} reused, {fresh_tokens} new output tokens in {seconds:.1f} s")
    engine_seconds = (ran.last_output_at - ran.first_added_at
                      if ran.first_added_at is not None and ran.last_output_at is not None else 0.0)
    return Generated(rows=frame, seconds=seconds, stats=EngineStats(
        reused=ran.reused, fresh_output_tokens=fresh_tokens, engine_seconds=engine_seconds, engine_args=args,
        first_added_at=ran.first_added_at, last_output_at=ran.last_output_at, first_commit_at=first_commit_at))
