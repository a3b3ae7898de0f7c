"""Every SamplingParams field of the installed vLLM is a job field, a passthrough or set by batchgen;
an unknown name gets the list of valid ones (on vLLM's own classes, no engine)."""

from __future__ import annotations

import pytest

from batchgen.job import JobError, SamplingSpec, job_from_dict
from batchgen.vllm_sampling import MANAGED_PARAMS, vllm_sampling_fields
from tests.jobs import job_with
from tests.sampling import PASSTHROUGH_VALUES


def test_every_field_of_vllms_sampling_params_is_a_job_field_a_passthrough_or_set_by_batchgen():
    declared = set(SamplingSpec.model_fields)
    rest = set(vllm_sampling_fields()) - declared - set(MANAGED_PARAMS)
    assert rest == set(PASSTHROUGH_VALUES) | {"repetition_detection"}  # a struct: tested on its own below


def test_an_unknown_name_gets_the_list_of_valid_ones(tmp_path):
    with pytest.raises(JobError) as err:
        job_from_dict(job_with(sampling={"skip_special_token": False}), base_dir=tmp_path)
    valid = str(err.value).split("valid names: ")[1].split(", ")
    assert {"skip_special_tokens", "bad_words", "temperature", "seed", "regex", "selection"} <= set(valid)
    assert not set(MANAGED_PARAMS) & set(valid)
