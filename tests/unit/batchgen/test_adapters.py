"""LoRA adapters in the job: engine arguments, which adapter each row uses, and the job errors."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from batchgen.adapters import apply_adapters, lora_request
from batchgen.engine import engine_args
from batchgen.generation import first_pass_requests, request_key, sampling_kwargs
from batchgen.job import JobError, SamplingSpec, job_from_dict
from batchgen.models import ModelRef
from batchgen.prompts import BuiltPrompts
from tests.jobs import job_with


def adapter(folder: Path, rank: int = 8) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank}), encoding="utf-8")
    return folder


def lora_job(tmp_path: Path, **engine) -> dict:
    adapter(tmp_path / "adapters" / "warm")
    adapter(tmp_path / "adapters" / "terse")
    return job_with(engine={"enable_lora": True, "max_lora_rank": 8,
                            "lora_adapters": {"warm": "adapters/warm", "terse": "adapters/terse"}, **engine})


def test_adapters_resolve_against_the_job_file_and_reach_vllm_llm(tmp_path):
    job = job_from_dict(lora_job(tmp_path, lora="warm", max_loras=2), base_dir=tmp_path)

    assert job.engine.lora_adapters["warm"] == str((tmp_path / "adapters" / "warm").resolve())
    args = engine_args(job.engine, ModelRef(name="m", path="/m"), cpu=False)
    assert args["enable_lora"] is True and args["max_lora_rank"] == 8 and args["max_loras"] == 2
    # CPU builds: one adapter slot more than the job's adapters, left empty for base-model requests
    assert engine_args(job.engine, ModelRef(name="m", path="/m"), cpu=True)["max_loras"] == 3
    assert "enable_lora" not in engine_args(job_from_dict(job_with(), base_dir=tmp_path).engine,
                                            ModelRef(name="m", path="/m"), cpu=True)


def test_each_row_uses_its_columns_adapter_or_the_jobs_and_an_unknown_one_rejects_the_row(tmp_path):
    job = job_from_dict(lora_job(tmp_path, lora="warm", lora_column="tone"), base_dir=tmp_path)
    items = pd.DataFrame({"item_id": ["a", "b", "c"], "row_number": [2, 3, 4], "tone": ["terse", None, "loud"]})
    prompts = pd.DataFrame({"item_id": ["a", "b", "c"], "prompt": ["p"] * 3, "prompt_token_ids": [[1]] * 3,
                            "n_prompt_tokens": [1] * 3})

    built = apply_adapters(BuiltPrompts(prompts=prompts), items, job.engine, ["tone"])

    assert built.prompts["lora"].tolist() == ["terse", "warm"]
    [rejected] = built.rejected
    assert rejected.item_id == "c" and rejected.reasons == ["invalid_override"]
    assert "row 4: engine.lora_column (column tone): 'loud' is not an adapter" in rejected.detail
    requests = first_pass_requests(built.prompts, SamplingSpec())
    assert [r.lora for r in requests] == ["terse", "warm"]
    base = sampling_kwargs(SamplingSpec())
    assert request_key(requests[0], base, "m") != request_key(
        type(requests[0])(**{**requests[0].__dict__, "lora": None}), base, "m")  # an adapter's results are its own
    request = lora_request(job.engine.lora_adapters, "warm")
    assert (request.lora_name, request.lora_int_id) == ("warm", 2)  # ids: the names' sorted order, from 1
    assert lora_request(job.engine.lora_adapters, None) is None


def test_a_blank_adapter_cell_of_any_missing_kind_uses_the_jobs_adapter(tmp_path):
    """Parquet's nullable strings read as pd.NA: blank like None, NaN or spaces (not an adapter named '<NA>')."""
    job = job_from_dict(lora_job(tmp_path, lora="warm", lora_column="tone"), base_dir=tmp_path)
    tones = pd.array(["terse", None, " ", None], dtype="string")
    tones[3] = pd.NA
    items = pd.DataFrame({"item_id": list("abcd"), "row_number": [2, 3, 4, 5], "tone": tones})
    prompts = pd.DataFrame({"item_id": list("abcd"), "prompt": ["p"] * 4, "prompt_token_ids": [[1]] * 4,
                            "n_prompt_tokens": [1] * 4})

    built = apply_adapters(BuiltPrompts(prompts=prompts), items, job.engine, ["tone"])

    assert built.prompts["lora"].tolist() == ["terse", "warm", "warm", "warm"] and not built.rejected


@pytest.mark.parametrize(("engine", "message"), [
    ({"lora_adapters": {"x": "adapters/warm"}, "enable_lora": False}, "needs enable_lora: true"),
    ({"lora": "cold"}, "engine.lora: 'cold' is not in lora_adapters"),
    ({"lora_adapters": {"x": "nowhere"}}, "engine.lora_adapters.x: "),
    ({"max_lora_rank": 4}, "engine.lora_adapters.warm: rank 8 is above max_lora_rank 4"),
])
def test_adapter_settings_that_cannot_work_are_job_errors(tmp_path, engine, message):
    data = lora_job(tmp_path)
    data["engine"].update(engine)
    with pytest.raises(JobError) as err:
        job_from_dict(data, base_dir=tmp_path)
    assert message in str(err.value)
