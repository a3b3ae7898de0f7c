"""A run's job: a JobSpec, a job file or a mapping, with the run's parameters applied as overrides."""

from __future__ import annotations

from pathlib import Path

from batchgen.job import JobSpec, job_from_dict, load_job, parse_overrides


def override_pairs(limit: int | None, max_tokens: int | None, overrides: list[str] | None,
                   temperature: float | None = None) -> list[str]:
    """The run's parameters as `key=value` job overrides (the form a deployment run passes on)."""
    pairs = list(overrides or [])
    if limit is not None:
        pairs.append(f"input.limit={limit}")
    if max_tokens is not None:
        pairs.append(f"sampling.max_tokens={max_tokens}")
    if temperature is not None:
        pairs.append(f"sampling.temperature={temperature}")
    return pairs


def resolve_job(job: JobSpec | str | dict, limit: int | None = None, max_tokens: int | None = None,
                output_dir: str | None = None, overrides: list[str] | None = None,
                temperature: float | None = None) -> JobSpec:
    """The job to run: a JobSpec, a job file path, or a mapping, with the run's overrides applied."""
    pairs = override_pairs(limit, max_tokens, overrides, temperature)
    if output_dir is not None:
        pairs.append(f"output.dir={Path(output_dir).resolve()}")
    extra = parse_overrides(pairs)
    if isinstance(job, JobSpec):
        return job_from_dict(job.model_dump(mode="json"), overrides=extra) if extra else job
    if isinstance(job, dict):
        return job_from_dict(job, overrides=extra)
    return load_job(job, overrides=extra)
