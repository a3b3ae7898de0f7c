"""Check the job before anything runs: the mistakes a deployment or UI run would otherwise find late."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from batchgen.job import JobSpec
from batchgen.preflight import check_cpu_limits, check_engine, check_output_dir, check_sampling
from expectations.check import check_expectations


@task(name="check-job", cache_policy=NO_CACHE, task_run_name="check-job")
def check_job_task(job: JobSpec) -> None:
    """The output folder, the job's own GX expectations on a sample output, the model and its context length, and
    the sampling values by vLLM's own rules.

    The rows are checked as they are loaded and prompted (a bad row is that row's rejection); `batchgen run`
    and `batchgen check` check every row before the flow starts (batchgen.preflight)."""
    check_output_dir(job.output)
    check_cpu_limits(job)
    check_expectations(job)
    _, tokenizer, _, config = check_engine(job.engine)
    check_sampling(job.sampling, config, tokenizer)
