"""The GPU (or CPU) generation step: holds the engine, commits every chunk."""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from prefect import task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE

from batchgen.engine import discard_engine, engine_args, get_engine, on_cpu
from batchgen.generation import GenRequest, run_requests
from batchgen.job import JobSpec
from batchgen.models import resolve_model
from batchgen.schema import ATTEMPT_SCHEMA
from batchgen.store import ResultStore


@dataclass
class Generated:
    rows: pd.DataFrame
    reused: int  # requests answered from earlier commits
    fresh_output_tokens: int
    seconds: float  # the whole task, engine start included
    engine_seconds: float  # inside engine calls only
    engine_args: dict


@functools.cache
def _devnull():
    return open(os.devnull, "w")


def live_progress(label: str, artifact_id, every: float = 2.0):
    """A tqdm class for vLLM: a terminal bar (when there is a terminal) and the Prefect progress artifact."""
    from tqdm import tqdm

    def factory(done: int, total: int):
        class Bar(tqdm):
            def __init__(self, *args, **kwargs):
                # Not disabled off a terminal (vLLM reads the bar's timings): it draws into the void.
                kwargs.update(total=total, initial=done, desc=f"generate [{label}]", unit="req", leave=False,
                              file=sys.stderr if sys.stderr.isatty() else _devnull(), mininterval=1.0)
                super().__init__(*args, **kwargs)
                self._sent = time.monotonic()

            def update(self, n=1):  # vLLM passes the candidates of one finished request: count the request
                super().update(1)
                if time.monotonic() - self._sent >= every:
                    self._sent = time.monotonic()
                    update_progress_artifact(artifact_id, progress=100.0 * self.n / max(total, 1))

        return Bar

    return factory


def store_for(job: JobSpec) -> ResultStore:
    return ResultStore(Path(job.output.dir) / ".batchgen" / "results")


# The task works through a process-wide engine, not its inputs: caching by inputs would be
# wrong, and reruns are made cheap by the result store instead. A retry (e.g. after an
# engine worker died) builds a fresh engine and resumes from the last committed chunk.
@task(name="generate", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2)
def generate_task(job: JobSpec, requests: list[GenRequest], label: str) -> Generated:
    """Generate every pending request with the process's engine; reuse committed results."""
    started = time.perf_counter()
    store = store_for(job)
    model = resolve_model(job.engine.model)
    args = engine_args(job.engine, model, on_cpu())
    identity = json.dumps({k: v for k, v in args.items() if k not in ("tokenizer",)}, sort_keys=True, default=str)
    total = len(requests)
    progress_id = create_progress_artifact(progress=0.0, description=f"{job.name}: {label}, requests done (%)")
    fresh_tokens, engine_seconds, generated = 0, 0.0, 0

    def on_chunk(new_rows: list[dict], finished: int, of: int) -> None:
        nonlocal fresh_tokens, engine_seconds, generated
        store.commit(new_rows)
        if new_rows:  # rates count engine time only: not the engine's start, not reused results
            fresh_tokens += sum(r["new_output_tokens"] for r in new_rows)
            engine_seconds += new_rows[0]["chunk_seconds"]
            generated += len({r["request_key"] for r in new_rows})
        rate = fresh_tokens / engine_seconds if engine_seconds else 0.0
        left = (of - finished) * engine_seconds / max(generated, 1)
        update_progress_artifact(progress_id, progress=100.0 * finished / max(of, 1))
        print(f"generate [{label}]: {finished}/{of} requests, {rate:.0f} output tokens/s, ETA {left:.0f} s")

    try:
        rows, reused = run_requests(lambda: get_engine(job.engine).llm, requests, job.sampling, identity,
                                    job.chunk_size, done=store.load, on_chunk=on_chunk,  # this window's commits only
                                    progress=live_progress(label, progress_id))
    except Exception:
        discard_engine(job.engine)  # the Prefect retry starts from a fresh engine
        raise
    update_progress_artifact(progress_id, progress=100.0)
    frame = pd.DataFrame(rows, columns=ATTEMPT_SCHEMA.names)
    seconds = time.perf_counter() - started
    print(f"generate [{label}]: {total} requests -> {len(frame)} outputs, {reused} reused, "
          f"{fresh_tokens} new output tokens in {seconds:.1f} s")
    return Generated(rows=frame, reused=reused, fresh_output_tokens=fresh_tokens, seconds=seconds,
                     engine_seconds=engine_seconds, engine_args=args)
