"""The prompt-preparation sequence (batchgen.prepare) on the real default model's tokenizer: every row a prompt
with its own overrides, or a rejection; a column the job names but the input lacks stops it before any model work."""

from __future__ import annotations

from pathlib import Path

import pytest

import batchgen.tokenizer
from batchgen.items import load_items
from batchgen.job import JobError, JobSpec, job_from_dict
from batchgen.prepare import prepare_prompts


def products_job(tmp_path: Path, **sections) -> JobSpec:
    (tmp_path / "items.csv").write_text("id,name,budget\na,Mug,32\nb,Lamp,\nc,Kettle,lots\n", encoding="utf-8")
    data = {"input": {"path": "items.csv", "id_column": "id"},
            "prompt": {"template": "Describe {{ name }} in one sentence."},
            "engine": {"max_model_len": 512},
            "sampling": {"max_tokens": 16, "overrides": {"max_tokens": "budget"}},
            "output": {"dir": "out"}}
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return job_from_dict(data, base_dir=tmp_path)


def test_every_row_is_a_prompt_with_its_own_budget_or_a_rejection_naming_the_row(tmp_path):
    job = products_job(tmp_path)

    built, model, max_len = prepare_prompts(job, load_items(job.input))

    assert (model.name, max_len) == ("SmolLM2-135M-Instruct", 512)
    prompts = built.prompts
    assert prompts["item_id"].tolist() == ["a", "b"]
    assert "Describe Mug in one sentence." in prompts["prompt"][0]  # after the model's chat template
    assert [len(ids) for ids in prompts["prompt_token_ids"]] == prompts["n_prompt_tokens"].tolist()
    assert prompts["max_tokens"][0] == 32 and prompts["max_tokens"].isna().tolist() == [False, True]  # blank: 16
    [rejected] = built.rejected
    assert (rejected.item_id, rejected.row_number, rejected.reasons) == ("c", 3, ["invalid_override"])
    assert rejected.detail == "row 3: sampling.overrides.max_tokens (column budget): 'lots' is not a whole number"


@pytest.mark.parametrize(("sections", "message"), [
    ({"prompt": {"template": "Describe {{ colour }}."}}, "prompt: the template uses column 'colour'"),
    ({"expectations": {"keyword_column": "brand"}}, "expectations.keyword_column: 'brand' is not a column"),
    ({"sampling": {"overrides": {"temperature": "heat"}}}, "sampling.overrides.temperature: 'heat' is not a column"),
])
def test_a_column_the_input_lacks_is_a_job_error_before_the_tokenizer_loads(tmp_path, monkeypatch, sections,
                                                                             message):
    job = products_job(tmp_path, **sections)

    def no_model(spec):
        raise AssertionError("the tokenizer was loaded before the columns were checked")

    monkeypatch.setattr(batchgen.tokenizer, "load_tokenizer", no_model)
    with pytest.raises(JobError, match=message):
        prepare_prompts(job, load_items(job.input))
