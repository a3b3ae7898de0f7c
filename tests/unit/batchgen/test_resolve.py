"""The job a run resolves: a JobSpec, a job file or a mapping, with the run's parameters as overrides."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from batchgen.job import JobError, JobSpec, job_from_dict
from batchgen.resolve import override_pairs, resolve_job


def job_dict(tmp_path: Path) -> dict:
    (tmp_path / "items.csv").write_text("id,name\n1,Mug\n2,Lamp\n", encoding="utf-8")
    return {"input": {"path": str(tmp_path / "items.csv"), "id_column": "id"},
            "prompt": {"template": "Describe {{ name }}."}, "sampling": {"max_tokens": 32, "temperature": 0.7},
            "output": {"dir": str(tmp_path / "out")}}


def test_the_runs_parameters_become_job_overrides_after_the_given_ones():
    assert override_pairs(None, None, None) == []
    assert override_pairs(5, 64, ["retry.max_passes=1"], 0.2) == [
        "retry.max_passes=1", "input.limit=5", "sampling.max_tokens=64", "sampling.temperature=0.2"]


@pytest.mark.parametrize("form", ["file", "mapping", "spec"])
def test_each_form_of_a_job_gets_the_runs_parameters(tmp_path, form):
    data = job_dict(tmp_path)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    job = {"file": str(path), "mapping": data, "spec": job_from_dict(data)}[form]

    spec = resolve_job(job, limit=1, max_tokens=64, output_dir="elsewhere", overrides=["retry.max_passes=1"],
                       temperature=0.2)

    assert spec.input.limit == 1 and spec.sampling.max_tokens == 64 and spec.sampling.temperature == 0.2
    assert spec.retry.max_passes == 1
    assert spec.output.dir == str(Path("elsewhere").resolve())  # the run's folder, absolute
    assert spec.prompt.template == "Describe {{ name }}."


def test_a_spec_without_parameters_is_run_as_it_is(tmp_path):
    spec = job_from_dict(job_dict(tmp_path))
    assert resolve_job(spec) is spec
    assert isinstance(resolve_job(job_dict(tmp_path)), JobSpec)


def test_a_parameter_wins_over_an_override_of_the_same_field(tmp_path):
    spec = resolve_job(job_dict(tmp_path), max_tokens=64, overrides=["sampling.max_tokens=16"])
    assert spec.sampling.max_tokens == 64


def test_a_parameter_outside_the_jobs_bounds_is_a_job_error_naming_the_field(tmp_path):
    with pytest.raises(JobError, match="sampling.max_tokens"):
        resolve_job(job_dict(tmp_path), max_tokens=0)
