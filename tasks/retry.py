"""Pick the outputs that failed one of retry.on for another pass."""

from __future__ import annotations

from collections import Counter

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from batchgen.job import JobSpec
from batchgen.records import GenRequest
from batchgen.retry import job_stop_seam, latest_attempts, plan_retries


@task(name="plan-retry", cache_policy=NO_CACHE, task_run_name="plan-retry-{label}")
def plan_retry_task(job: JobSpec, passes: list[pd.DataFrame], max_model_len: int, label: str) -> list[GenRequest]:
    """Requests for the candidates whose latest attempt (across the validated `passes` so far) failed one of
    retry.on (cut off, or an expectation)."""
    latest = latest_attempts(pd.concat(passes, ignore_index=True))
    cut = int((latest["finish_reason"] == "length").sum()) if len(latest) else 0
    requests = plan_retries(latest, job.retry, max_model_len,
                            job.sampling.candidates if job.sampling.use_beam_search else None,
                            job.sampling.temperature,
                            job_stop_seam(job))
    by_strategy = Counter(r.strategy for r in requests)
    print(f"plan [{label}]: {cut} outputs cut off by max_tokens, "
          f"{len(requests) - by_strategy['resample']} can grow ({job.retry.strategy}, budgets up to "
          f"{max((r.max_tokens for r in requests if r.strategy != 'resample'), default=0)}), "
          f"{by_strategy['resample']} resampled for {', '.join(job.retry.on)}")
    return requests
