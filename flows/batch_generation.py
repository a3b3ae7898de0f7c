"""The batch-generation flow: load -> prompts -> generate -> validate -> retry -> publish.

Run it as `python -m flows.batch_generation JOB.yaml`, `batchgen run JOB.yaml`, or call
`batch_generation(...)` from Python.
"""

from __future__ import annotations

import batchgen  # noqa: F401  (first: sets process defaults before Prefect reads its settings)

import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
from prefect import flow
from prefect.utilities.annotations import quote
from pydantic import Field

from batchgen.generation import first_pass_requests
from batchgen.items import LoadedItems
from batchgen.job import JobSpec, load_job, parse_overrides, job_from_dict
from batchgen.manifest import add_tallies
from batchgen.publish import open_publication
from batchgen.schema import frame_input_codec
from expectations.validate import merge_results
from tasks.generate import Generated, generate_task
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


@flow(name="batch-generation", log_prints=True, retries=FLOW_RETRIES, retry_delay_seconds=FLOW_RETRY_DELAY_SECONDS)
def batch_generation(
    job: JobSpec | str,
    limit: Annotated[int | None, Field(ge=1)] = None,
    max_tokens: Annotated[int | None, Field(ge=1)] = None,
    output_dir: str | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Generate one output per input item, validate, retry cut-off outputs, publish; returns the manifest.

    Args:
        job: A job file path (relative to the project folder when run by a deployment), or the job itself.
        limit: Only the first N input rows.
        max_tokens: The first pass's sampling.max_tokens.
        output_dir: Publish here instead of the job's output.dir.
        overrides: More job settings as key=value, e.g. sampling.temperature=0.2 or input.path=data/x.csv.
    """
    started_at = datetime.now(timezone.utc)
    timings: dict[str, float] = {"load_and_prompts": 0.0, "generate": 0.0, "engine_calls": 0.0,
                                 "validate_and_stage": 0.0}
    clock = time.perf_counter()
    spec = resolve_job(job, limit, max_tokens, output_dir, overrides)
    for note in spec.sampling.notes():
        print(f"sampling: {note}")

    loaded = load_items_task(spec)
    keywords = (loaded.items.set_index("item_id")[spec.expectations.keyword_column].astype("string")
                if spec.expectations.keyword_column else None)
    # One staged publication for the whole run; each window adds its rows to it and is then let go.
    staging = open_publication(Path(spec.output.dir))
    codec = frame_input_codec(loaded.items, loaded.columns, [r.input for r in loaded.rejected])
    timings["load_and_prompts"] += time.perf_counter() - clock

    windows = item_windows(len(loaded.items), spec.window_size)
    run = RunTotals()
    for index, (start, stop) in enumerate(windows):
        where = f"window {index + 1}/{len(windows)}, " if len(windows) > 1 else ""
        items = loaded.items.iloc[start:stop]
        run_window(spec, index, where, LoadedItems(items=items, rejected=[], columns=loaded.columns),
                   loaded.rejected if index == 0 else [], keywords, staging, codec, run, timings)

    timings["total_before_publish"] = time.perf_counter() - clock
    return publish_task(spec, staging, run.counted, quote([merge_results(results) for results in run.validation]),
                        run.model, run.engine_args, run.reused, run.fresh_tokens, timings, started_at)


def item_windows(count: int, size: int) -> list[tuple[int, int]]:
    """[start, stop) ranges of at most `size` items; one empty window when there are no items (rejections only)."""
    return [(start, min(start + size, count)) for start in range(0, count, size)] or [(0, 0)]


@dataclass
class RunTotals:
    """What the run keeps of its windows: counts and GX results, never their rows."""

    counted: dict[str, Any] | None = None
    validation: list[list[dict[str, Any]]] = field(default_factory=list)  # per pass, one result per window
    reused: int = 0
    fresh_tokens: int = 0
    model: Any = None
    engine_args: dict[str, Any] = field(default_factory=dict)

    def add(self, generated: Generated, timings: dict[str, float]) -> None:
        self.reused += generated.reused
        self.fresh_tokens += generated.fresh_output_tokens
        timings["generate"] += generated.seconds
        timings["engine_calls"] += generated.engine_seconds


def run_window(spec: JobSpec, index: int, where: str, window: LoadedItems, load_rejections: list,
               keywords: pd.Series | None, staging: Path, codec: Any, run: RunTotals,
               timings: dict[str, float]) -> None:
    """Prompts, the first pass, validation and retry passes of one window of items, staged into the publication."""
    clock = time.perf_counter()
    prompts = build_prompts_task(spec, window)
    run.model = prompts.model
    timings["load_and_prompts"] += time.perf_counter() - clock

    # quote(): Prefect would otherwise walk every request and token id to track task inputs (seconds per window).
    requests = first_pass_requests(prompts.built.prompts, spec.sampling)
    generated = generate_task(spec, quote(requests), f"{where}first pass")
    clock = time.perf_counter()
    validated = validate_task(spec, generated.rows, keywords, f"{where}first pass")
    timings["validate_and_stage"] += time.perf_counter() - clock
    attempts, results = validated.rows, [validated.result]
    run.engine_args = generated.engine_args
    run.add(generated, timings)

    for pass_number in range(1, spec.retry.max_passes + 1):
        requests = plan_retry_task(spec, attempts, prompts.max_model_len, pass_number)
        if not requests:
            break
        retried = generate_task(spec, quote(requests), f"{where}retry {pass_number}")
        clock = time.perf_counter()
        checked = validate_task(spec, retried.rows, keywords, f"{where}retry {pass_number}")
        attempts = pd.concat([attempts, checked.rows], ignore_index=True)
        timings["validate_and_stage"] += time.perf_counter() - clock
        results.append(checked.result)
        run.add(retried, timings)

    clock = time.perf_counter()
    counted = stage_window_task(spec, staging, index, window.items, window.columns,
                                quote(load_rejections + prompts.built.rejected), attempts, codec)
    timings["validate_and_stage"] += time.perf_counter() - clock
    run.counted = add_tallies(run.counted, counted)
    for number, result in enumerate(results):
        if number == len(run.validation):
            run.validation.append([])
        run.validation[number].append(result)


if __name__ == "__main__":  # vLLM starts its workers with spawn: this module must be importable
    from batchgen.cli import app

    sys.exit(app(["run", *sys.argv[1:]]))
