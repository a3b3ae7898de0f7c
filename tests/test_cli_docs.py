"""`batchgen schema` and `batchgen init` as a user meets them: a schema an editor can use, a starter job `check` accepts."""

from __future__ import annotations

import json

import jsonschema
import yaml

from batchgen.jobdoc import job_schema, reference_markdown
from tests.conftest import write_products
from tests.test_cli import run_cli


def test_schema_prints_the_json_schema_an_editor_validates_job_files_with(tmp_path):
    result = run_cli(["schema"], tmp_path)
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    assert schema == json.loads(json.dumps(job_schema()))
    jsonschema.Draft202012Validator.check_schema(schema)
    assert set(schema["required"]) == {"input", "prompt", "output"}

    written = run_cli(["schema", "--markdown", "-o", str(tmp_path / "reference.md")], tmp_path)
    assert written.returncode == 0, written.stderr
    assert (tmp_path / "reference.md").read_text(encoding="utf-8") == reference_markdown()


def test_init_writes_a_starter_job_that_check_accepts(tmp_path):
    (tmp_path / "data").mkdir()
    rows = write_products(tmp_path / "data" / "my products.csv", 6)
    job = tmp_path / "jobs" / "products.yaml"
    made = run_cli(["init", str(tmp_path / "data" / "my products.csv"), "-o", str(job)], tmp_path)
    assert made.returncode == 0, made.stderr
    assert f"batchgen check {job}" in made.stderr
    spec = yaml.safe_load(job.read_text(encoding="utf-8"))
    assert spec["input"] == {"path": "../data/my products.csv", "id_column": "product_id"}
    assert list(jsonschema.Draft202012Validator(job_schema()).iter_errors(spec)) == []

    checked = run_cli(["check", str(job)], tmp_path)
    assert checked.returncode == 0, checked.stderr
    report = json.loads(checked.stdout)
    assert report["items"] == report["would_generate"] == len(rows)
    assert report["would_reject"] == []

    again = run_cli(["init", str(tmp_path / "data" / "my products.csv"), "-o", str(job)], tmp_path)
    assert again.returncode == 2 and "--force" in again.stderr  # an existing job is not overwritten


def test_init_on_a_file_it_cannot_read_exits_3_naming_it(tmp_path):
    (tmp_path / "ragged.csv").write_text("a,b\n1,2\n3\n", encoding="utf-8")
    result = run_cli(["init", str(tmp_path / "ragged.csv"), "-o", str(tmp_path / "job.yaml")], tmp_path)
    assert result.returncode == 3
    assert "ragged.csv: line 3" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "job.yaml").exists()
