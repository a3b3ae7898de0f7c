"""The job reference, the JSON Schema and the starter job, all derived from the job model."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pandas as pd
import pytest
import yaml

from batchgen.items import DataError
from batchgen.job import JobSpec, load_job
from batchgen.jobdoc import (
    REFERENCE_PATH,
    REGENERATE,
    SCHEMA_PATH,
    job_schema,
    missing_descriptions,
    reference_markdown,
    schema_text,
    starter_job,
)
from tests.conftest import ROOT

EXAMPLES = [ROOT / "examples" / "product_descriptions.yaml", ROOT / "examples" / "product_descriptions_zh.yaml"]


def test_the_committed_job_reference_is_the_generated_one():
    committed = (ROOT / REFERENCE_PATH).read_text(encoding="utf-8")
    assert committed == reference_markdown(), (
        f"{REFERENCE_PATH} is out of date with batchgen/job.py: run {REGENERATE} and commit the result")


def test_the_committed_json_schema_is_the_generated_one():
    committed = (ROOT / SCHEMA_PATH).read_text(encoding="utf-8")
    assert committed == schema_text(), (
        f"{SCHEMA_PATH} is out of date with batchgen/job.py: run {REGENERATE} and commit the result")


def test_every_job_field_has_a_description():
    assert missing_descriptions() == []


def _rows(markdown: str) -> dict[str, list[str]]:
    rows = {}
    for line in markdown.splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells
    return rows


def _all_fields():
    for name, field in JobSpec.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            for sub, subfield in annotation.model_fields.items():
                yield f"{name}.{sub}", subfield
        else:
            yield name, field


def test_the_reference_lists_every_field_with_its_real_default_and_marks_required_ones():
    rows = _rows(reference_markdown())
    fields = dict(_all_fields())
    assert set(rows) == set(fields)
    for name, field in fields.items():
        default_cell = rows[name][2]
        if field.is_required():
            assert default_cell == "**required**", name
        else:
            value = field.default_factory() if field.default_factory is not None else field.default
            assert default_cell == f"`{json.dumps(value, ensure_ascii=False)}`", name
    # The values the example job sets are not the defaults: the reference shows the model's own.
    assert rows["sampling.max_tokens"][2] == "`16`" and rows["sampling.temperature"][2] == "`1.0`"
    assert rows["output.jsonl"][2] == "`false`"
    assert rows["input.path"][2] == rows["output.dir"][2] == "**required**"
    assert rows["sampling.top_p"][3] == "> 0, ≤ 1"
    assert rows["retry.max_passes"][3] == "≥ 0, ≤ 10"
    assert "`grow`, `continue`" in rows["retry.strategy"][1]


def test_the_schema_accepts_the_example_jobs_and_refuses_what_load_job_refuses():
    validator = jsonschema.Draft202012Validator(job_schema())
    for path in EXAMPLES:
        job = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert list(validator.iter_errors(job)) == [], path
        load_job(path)  # and the model agrees
    job = yaml.safe_load(EXAMPLES[0].read_text(encoding="utf-8"))
    typo = {**job, "sampling": {**job["sampling"], "max_tokn": 5}}
    assert any("max_tokn" in error.message for error in validator.iter_errors(typo))
    zero = {**job, "sampling": {**job["sampling"], "max_tokens": 0}}
    assert [list(error.path) for error in validator.iter_errors(zero)] == [["sampling", "max_tokens"]]
    assert [error.message for error in validator.iter_errors({k: v for k, v in job.items() if k != "output"})] == [
        "'output' is a required property"]


def _write(path: Path, fmt: str, rows: list[dict]) -> Path:
    frame = pd.DataFrame(rows)
    if fmt == "csv":
        frame.to_csv(path, index=False)
    elif fmt == "jsonl":
        frame.to_json(path, orient="records", lines=True, force_ascii=False)
    else:
        frame.to_parquet(path, index=False)
    return path


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_the_starter_job_names_the_file_columns_and_loads(fmt, tmp_path):
    rows = [{"question_id": f"q{i}", "question": f"Why is the sky blue, take {i}?", "topic": "physics"}
            for i in range(5)]
    (tmp_path / "data").mkdir()
    data = _write(tmp_path / "data" / f"questions.{fmt}", fmt, rows)
    job_path = tmp_path / "jobs" / "questions.yaml"
    job_path.parent.mkdir()
    job_path.write_text(starter_job(data, job_path), encoding="utf-8")

    spec = load_job(job_path)
    assert Path(spec.input.path) == data.resolve()
    assert spec.input.id_column == "question_id"
    assert "{{ question }}" in spec.prompt.template and "{{ topic }}" in spec.prompt.template
    assert "question_id" not in spec.prompt.template
    assert spec.sampling.max_tokens > JobSpec.model_fields["sampling"].default_factory().max_tokens
    assert Path(spec.output.dir) == (job_path.parent / "out" / "questions").resolve()
    # The starter is a valid job by the schema too, so an editor shows no error in it.
    assert list(jsonschema.Draft202012Validator(job_schema()).iter_errors(yaml.safe_load(job_path.read_text()))) == []


def test_the_starter_job_without_an_id_column_and_with_unusable_column_names(tmp_path):
    data = _write(tmp_path / "notes.csv", "csv", [{"text": "a", "first name": "Ann"}, {"text": "b", "first name": "Bo"}])
    job_path = tmp_path / "job.yaml"
    text = starter_job(data, job_path)
    job_path.write_text(text, encoding="utf-8")
    spec = load_job(job_path)
    assert spec.input.id_column is None  # ids are hashed from the rows
    assert "{{ text }}" in spec.prompt.template and "first name" not in spec.prompt.template
    assert "not usable as {{ name }}" in text and "first name" in text


def test_the_starter_job_of_an_unreadable_file_is_a_data_error_naming_it(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(DataError, match="empty.csv"):
        starter_job(empty, tmp_path / "job.yaml")
    with pytest.raises(DataError, match="missing.csv"):
        starter_job(tmp_path / "missing.csv", tmp_path / "job.yaml")
