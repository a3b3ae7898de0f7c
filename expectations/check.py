"""The job's own GX expectations (`expectations.gx`) tried once on a sample output, before the engine starts.

GX builds each from the job when it loads (its type, kwargs and column checked), but whether it can be evaluated
on the outputs shows only when it runs: `expect_column_values_to_be_between` on `text` with a number raises inside
GX. `batchgen check`, `batchgen run` and the flow's check task call `check_expectations`, so that mistake stops
the job naming the expectation (a JobError) instead of failing the first window after the engine has started.
"""

from __future__ import annotations

from batchgen.job import JobSpec

# One output as the validate task's rows hold it (the attempt record's columns and their types; it ended on a stop
# string).
SAMPLE_OUTPUT = {"item_id": "sample", "candidate": 0, "attempt": 1, "text": "A sample output.", "finish_reason": "stop",
                 "stop_reason": "\n\n", "n_output_tokens": 4, "n_prompt_tokens": 12, "cumulative_logprob": -1.5}


# Suites that evaluated on the sample in this process: `batchgen run` checks a job before its flow starts and the
# flow's check task checks it again in the same process (a GX validation each); a suite that failed is tried again.
_EVALUATED: set[tuple[str, str]] = set()


def check_expectations(spec: JobSpec) -> None:
    """The job's suite on SAMPLE_OUTPUT when the job names GX expectations of its own (GX is imported only then):
    expectations.validate.ExpectationError, a JobError, where GX cannot evaluate one. Once per suite and process."""
    if not spec.expectations.gx:
        return
    import pandas as pd

    from expectations.validate import validate_rows

    suite = (spec.expectations.model_dump_json(), repr(spec.sampling.structured))  # as validate's suites are keyed
    if suite in _EVALUATED:
        return
    keywords = pd.Series({"sample": "sample"}) if spec.expectations.keyword_column else None
    validate_rows(pd.DataFrame([SAMPLE_OUTPUT]), spec.expectations, keywords, f"{spec.name}-check",
                  structured=spec.sampling.structured)
    _EVALUATED.add(suite)
