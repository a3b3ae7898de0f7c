"""How batchgen sets up vLLM's engine (pure logic: no engine is started here)."""

from __future__ import annotations

import dataclasses

import pytest

from batchgen.engine import (CPU_BLOCK_SIZE, engine_args, engine_identity, engine_in_process, front_end_in_process,
                             start_in_background)
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


@pytest.mark.parametrize(("spec", "cpu", "expected"), [
    ({}, False, False),  # GPUs: vLLM's front end in a process of its own, beside the pipeline's
    ({}, True, True),  # CPU builds: the engine needs every core
    ({"front_end_process": True}, True, False),  # the job decides
    ({"front_end_process": False}, False, True),
])
def test_front_end_runs_apart_on_gpus_unless_the_job_says(spec, cpu, expected):
    assert front_end_in_process(EngineSpec(**spec), cpu) is expected


def test_where_the_front_end_runs_is_no_part_of_request_keys(tmp_path):
    """Results generated with the front end in the run's process are reused with it apart, and the other way."""
    model = ModelRef(name="m", path=str(tmp_path))
    here, apart = (engine_args(EngineSpec(front_end_process=flag), model, cpu=False) for flag in (False, True))
    assert engine_identity(here) == engine_identity(apart) and "front_end_process" not in apart


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


def test_an_engine_starting_in_the_background_is_not_started_twice():
    """`batchgen run` starts the engine once the job's checks pass; the flow asks again: one start."""
    import threading

    release, built = threading.Event(), []

    def build(spec):
        release.wait(10)
        built.append(spec)

    spec = EngineSpec(model="/nowhere/start-once")
    first = start_in_background(spec, build)
    assert first is not None and start_in_background(spec, build) is None  # already starting
    release.set()
    first.join(10)
    assert len(built) == 1
