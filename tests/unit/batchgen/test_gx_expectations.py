"""A job's `expectations.gx` entries: what GX refuses is a job error naming the entry."""

from __future__ import annotations

import pytest

from batchgen.job import JobError, job_from_dict
from tests.jobs import job_with


@pytest.mark.parametrize(("entry", "message"), [
    ({"type": "expect_nothing"}, "expectations.gx.0: 'expect_nothing' is not a Great Expectations expectation type"),
    ({"type": "expect_column_values_to_match_regex", "kwargs": {"column": "text", "regexx": "a"}},
     "expectations.gx.0: expect_column_values_to_match_regex: kwargs.regexx: not an argument of this expectation"),
    ({"type": "expect_column_values_to_match_regex", "kwargs": {"column": "txt", "regex": "a"}},
     "column 'txt' is not an output column; the outputs have text, finish_reason"),
    ({"type": "expect_column_mean_to_be_between", "kwargs": {"column": "n_output_tokens"}},
     "judges the whole table, not each output"),
    ({"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "text"}, "id": "length"},
     "id 'length' is a built-in expectation's"),
])
def test_a_gx_expectation_gx_refuses_is_a_job_error_naming_it(tmp_path, entry, message):
    with pytest.raises(JobError) as err:
        job_from_dict(job_with(expectations={"gx": [entry]}), base_dir=tmp_path)
    assert message in str(err.value)
