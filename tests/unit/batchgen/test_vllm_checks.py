"""What the CPU build of vLLM cannot do, refused before the engine starts (GPUs allow it)."""

from __future__ import annotations

import pytest

from batchgen.job import job_from_dict
from batchgen.vllm_checks import cpu_problem
from tests.jobs import job_with


@pytest.mark.parametrize(("changes", "problem"), [
    ({"sampling": {"seed": 1, "temperature": 0.7}}, "sampling.temperature is 0.7"),
    ({"sampling": {"seed": 1, "temperature": 0, "overrides": {"temperature": "t"}}}, "overrides.temperature"),
    ({"sampling": {"seed": 1, "temperature": 0}, "retry": {"on": ["keyword"], "temperature_step": 0.2}},
     "retry.temperature_step"),
    ({"sampling": {"seed": 1, "temperature": 0}}, None),  # greedy: the seed is harmless
    ({"sampling": {"temperature": 0.7}}, None),
])
def test_a_per_request_seed_is_refused_on_cpu_only_where_it_would_crash_the_engine(tmp_path, changes, problem):
    spec = job_from_dict(job_with(**changes), base_dir=tmp_path)

    found = cpu_problem(spec, cpu=True)

    assert (found is None) == (problem is None)
    if problem:
        assert found[0] == "sampling.seed" and problem in found[1] and "crashes vLLM's CPU engine" in found[1]
    assert cpu_problem(spec, cpu=False) is None  # GPUs take per-request seeds


def test_prompt_logprobs_with_lora_enabled_is_refused_on_cpu_only(tmp_path):
    spec = job_from_dict(job_with(sampling={"prompt_logprobs": 1}, engine={"enable_lora": True}), base_dir=tmp_path)
    field, why = cpu_problem(spec, cpu=True)
    assert field == "sampling.prompt_logprobs" and "engine.enable_lora" in why
    assert cpu_problem(spec, cpu=False) is None
