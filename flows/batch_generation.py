"""The batch-generation flow: load -> prompts -> generate -> validate -> retry -> publish.

Run it as `python -m flows.batch_generation JOB.yaml`, `batchgen run JOB.yaml`, or call
`batch_generation(...)` from Python.
"""

from __future__ import annotations

import batchgen  # noqa: F401  (first: sets process defaults before Prefect reads its settings)

import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
from prefect import flow
from pydantic import Field

from batchgen.generation import first_pass_requests
from batchgen.job import JobSpec, load_job, parse_overrides, job_from_dict
from tasks.generate import generate_task
from tasks.load import load_items_task
from tasks.prompts import build_prompts_task
from tasks.publish import publish_task
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
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    spec = resolve_job(job, limit, max_tokens, output_dir, overrides)
    for note in spec.sampling.notes():
        print(f"sampling: {note}")

    loaded = load_items_task(spec)
    prompts = build_prompts_task(spec, loaded)
    keywords = (loaded.items.set_index("item_id")[spec.expectations.keyword_column].astype("string")
                if spec.expectations.keyword_column else None)
    timings["load_and_prompts"] = time.perf_counter() - clock

    generated = generate_task(spec, first_pass_requests(prompts.built.prompts, spec.sampling), "first pass")
    validated = validate_task(spec, generated.rows, keywords, "first pass")
    attempts, results, reused = validated.rows, [validated.result], generated.reused
    gen_seconds, engine_seconds, fresh_tokens = generated.seconds, generated.engine_seconds, generated.fresh_output_tokens

    for pass_number in range(1, spec.retry.max_passes + 1):
        requests = plan_retry_task(spec, attempts, prompts.max_model_len, pass_number)
        if not requests:
            break
        retried = generate_task(spec, requests, f"retry {pass_number}")
        checked = validate_task(spec, retried.rows, keywords, f"retry {pass_number}")
        attempts = pd.concat([attempts, checked.rows], ignore_index=True)
        results.append(checked.result)
        reused += retried.reused
        gen_seconds += retried.seconds
        engine_seconds += retried.engine_seconds
        fresh_tokens += retried.fresh_output_tokens

    timings["generate"] = gen_seconds
    timings["engine_calls"] = engine_seconds
    timings["total_before_publish"] = time.perf_counter() - clock
    return publish_task(spec, loaded, prompts, attempts, results, generated.engine_args, reused, fresh_tokens, timings,
                        started_at)


if __name__ == "__main__":  # vLLM starts its workers with spawn: this module must be importable
    from batchgen.cli import app

    sys.exit(app(["run", *sys.argv[1:]]))
