"""The flow's parameters (the Prefect UI's form): a job file path and the common overrides, under a real Prefect
server with a stand-in engine."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import product_job
from tests.flows.test_batch_generation_flow import stand_in  # noqa: F401 (fixture)


def test_a_job_path_with_the_forms_overrides_runs_the_overridden_job(tmp_path, prefect_server, stand_in):  # noqa: F811
    from flows.batch_generation import batch_generation

    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(product_job(tmp_path, 6, expectations={"keyword_column": None})), encoding="utf-8")
    out = tmp_path / "elsewhere"
    manifest = batch_generation(str(job), limit=4, max_tokens=32, temperature=0.0, output_dir=str(out),
                                overrides=["sampling.top_p=0.5"])
    published = json.loads((out / "current" / "manifest.json").read_text())
    assert published["publication"] == manifest["publication"]
    assert published["counts"]["items"] == 4
    assert {key: published["sampling"][key] for key in ("max_tokens", "temperature", "top_p")} == {
        "max_tokens": 32, "temperature": 0.0, "top_p": 0.5}
    assert not (tmp_path / "out").exists()  # the job's own output.dir was not written


def test_a_value_outside_the_forms_bounds_is_refused_before_the_run(tmp_path, prefect_server, stand_in):  # noqa: F811
    from prefect.exceptions import ParameterTypeError

    from flows.batch_generation import batch_generation

    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(product_job(tmp_path, 2)), encoding="utf-8")
    with pytest.raises(ParameterTypeError, match="temperature"):
        batch_generation(str(job), temperature=-1.0)
    assert stand_in.calls == []
