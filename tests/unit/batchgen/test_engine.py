"""How batchgen sets up vLLM's engine (pure logic: no engine is started here)."""

from __future__ import annotations

import dataclasses

import pytest

from batchgen.engine import CPU_BLOCK_SIZE, engine_args, engine_in_process
from batchgen.job import EngineSpec
from batchgen.models import ModelRef


@pytest.mark.parametrize(("spec", "cpu", "environ", "expected"), [
    ({}, True, {}, True),  # CPU builds: one process
    ({}, False, {}, False),  # GPUs: vLLM's engine processes
    ({"tensor_parallel_size": 2}, True, {}, False),  # parallel workers need their processes
    ({"pipeline_parallel_size": 2}, True, {}, False),
    ({}, True, {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}, False),  # the user's environment
    ({}, False, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, True),
    ({"multiprocessing": True}, True, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, False),  # the job wins
    ({"multiprocessing": False}, False, {}, True),
])
def test_engine_in_process_follows_the_job_then_the_environment_then_the_platform(spec, cpu, environ, expected):
    assert engine_in_process(EngineSpec(**spec), cpu, environ) is expected


def test_engine_args_are_vllm_keyword_arguments_only(tmp_path):
    model = ModelRef(name="m", path=str(tmp_path))
    cpu = engine_args(EngineSpec(multiprocessing=False), model, cpu=True)
    assert "multiprocessing" not in cpu  # decided by the environment, not an LLM argument
    assert cpu["block_size"] == CPU_BLOCK_SIZE and cpu["enforce_eager"] is True
    gpu = engine_args(EngineSpec(tensor_parallel_size=2, gpu_memory_utilization=0.8), model, cpu=False)
    assert gpu["tensor_parallel_size"] == 2 and gpu["gpu_memory_utilization"] == 0.8
    assert "block_size" not in gpu and gpu["enforce_eager"] is False
    # what the LLM is built with: each key a field of vLLM's own EngineArgs, or LLM(...) refuses it
    from vllm import EngineArgs

    fields = {field.name for field in dataclasses.fields(EngineArgs)}
    assert set(cpu) - fields == set() and set(gpu) - fields == set()
