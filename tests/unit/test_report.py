"""The run report built from a small synthetic publication (real GX results, real Parquet, real matplotlib)."""

from __future__ import annotations

import base64
import json
import re
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pytest

from batchgen.job import ExpectationsSpec
from batchgen.publish import ATTEMPTS as ATTEMPTS_FILE, REJECTED, RESULTS
from batchgen.report import (
    DATA_DOCS,
    NotAPublicationError,
    load_publication,
    report_markdown,
    throughput,
    write_report,
)
from expectations.validate import validate_rows

STARTED = datetime(2026, 11, 29, 12, 0, 0, tzinfo=timezone.utc)
HOSTILE = '<script>alert("x")</script> & <b>bold</b>'

# item, row, attempt, text, finish reason, new tokens, chunk finished (s after start; None: no time recorded)
ATTEMPTS = [
    ("p1", 1, 1, "A sturdy mug that keeps coffee hot.", "stop", 9, 10.0),
    ("p2", 2, 1, "A lamp for reading late at", "length", 8, 10.0),
    ("p3", 3, 1, "Headphones with a long battery life.", "stop", 8, 10.0),
    ("p4", 4, 1, HOSTILE, "stop", 12, 10.0),
    ("p5", 5, 1, "A kettle, reused from an earlier run.", "stop", 9, -300.0),
    ("p2", 2, 2, "A lamp for late reading, dimmable.", "stop", 4, 25.0),
]


def make_publication(root: Path, spec: ExpectationsSpec | None = None) -> dict:
    """A publication directory like the publish step writes: 6 items, 4 accepted, 2 rejected, a retry pass."""
    spec = spec or ExpectationsSpec(min_chars=10, max_chars=40, must_not_match=["<script"])
    root.mkdir(parents=True, exist_ok=True)
    attempts = pd.DataFrame([
        {"item_id": i, "candidate": 0, "attempt": a, "text": t, "finish_reason": f, "new_output_tokens": n,
         "chunk_seconds": 5.0 if a == 2 else 8.0,
         "chunk_finished_at": STARTED + timedelta(seconds=s)}
        for i, _, a, t, f, n, s in ATTEMPTS
    ])
    attempts["chunk_finished_at"] = pd.to_datetime(attempts["chunk_finished_at"], utc=True)
    validation, checked = [], []
    for attempt in (1, 2):
        rows = attempts[attempts["attempt"] == attempt].reset_index(drop=True)
        result = validate_rows(rows, spec, None, suite_name="report-test-outputs")
        verdicts = result.verdicts.set_index("row_key")
        keys = rows["item_id"] + "#0#" + rows["attempt"].astype(str)
        checked.append(rows.assign(passed=[bool(verdicts.at[k, "passed"]) for k in keys],
                                   failed=[list(verdicts.at[k, "failed"]) for k in keys]))
        validation.append(result.result)
    attempts = pd.concat(checked, ignore_index=True)
    final = attempts.sort_values("attempt").groupby("item_id").tail(1).sort_values("item_id")
    rows_of = {i: r for i, r, *_ in ATTEMPTS}
    accepted = final[final["passed"]].assign(row_number=lambda f: f["item_id"].map(rows_of))
    failed = final[~final["passed"]]
    rejected = pd.DataFrame(
        [{"item_id": r.item_id, "row_number": rows_of[r.item_id], "stage": "validate", "reasons": list(r.failed),
          "detail": f"candidate 0 of 1 failed: {', '.join(r.failed)}", "attempt": r.attempt, "text": r.text,
          "finish_reason": r.finish_reason, "n_output_tokens": r.new_output_tokens} for r in failed.itertuples()]
        + [{"item_id": "p6", "row_number": 6, "stage": "prompt", "reasons": ["prompt_too_long"],
            "detail": "the prompt has 9000 tokens; the model allows 8192", "attempt": None, "text": None,
            "finish_reason": None, "n_output_tokens": None}])
    for name in (RESULTS, REJECTED, ATTEMPTS_FILE):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
    accepted[["item_id", "row_number", "attempt", "text", "finish_reason", "new_output_tokens"]].rename(
        columns={"new_output_tokens": "n_output_tokens"}).to_parquet(root / RESULTS)
    rejected.to_parquet(root / REJECTED)
    attempts.to_parquet(root / ATTEMPTS_FILE)
    (root / "validation.json").write_text(json.dumps(validation, default=str), encoding="utf-8")
    reasons = rejected["reasons"].explode().value_counts().sort_index().to_dict()
    manifest = {
        "job": "report-test", "flow_run_id": "0000-test", "started_at": STARTED.isoformat(),
        "finished_at": (STARTED + timedelta(seconds=30)).isoformat(),
        "counts": {"items": 6, "accepted": len(accepted), "rejected": len(rejected), "generated_items": 5,
                   "truncated_first_pass": 1, "truncated_final": 0, "attempts": len(attempts), "retry_attempts": 1,
                   "reused": 1, "rejected_by_reason": reasons, "rescued": 1, "rescued_by_reason": {"truncated": 1}},
        "rates": {"pass_rate": round(len(accepted) / 6, 4), "truncation_first_pass": 0.2, "truncation_final": 0.0},
        "tokens": {"prompt": 300, "output": 50, "generated_this_run": 41, "output_per_second": 3.15},
        "timings_seconds": {"generate": 13.0, "engine_calls": 13.0},
        "model": {"name": "SmolLM2-135M-Instruct"},
        "expectations": spec.model_dump(mode="json"),
    }
    (root / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return manifest


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> tuple[Path, dict, str]:
    root = tmp_path_factory.mktemp("report") / "run"
    manifest = make_publication(root)
    path = write_report(root)
    return root, manifest, path.read_text(encoding="utf-8")


def test_the_synthetic_publication_is_what_the_report_tests_need(published):
    root, manifest, _ = published
    assert manifest["counts"] == {**manifest["counts"], "accepted": 4, "rejected": 2}
    assert manifest["counts"]["rejected_by_reason"] == {"length": 1, "must_not_match": 1, "prompt_too_long": 1}


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


def test_four_charts_are_embedded_pngs_and_nothing_is_fetched(published):
    _, _, page = published
    charts = re.findall(r'<img class="chart" alt="([^"]+)" src="data:image/png;base64,([^"]+)"', page)
    assert [title for title, _ in charts] == ["Finish reasons per attempt", "Output length against the expected bounds",
                                              "Pass rate per expectation", "Throughput over the run"]
    for _, data in charts:
        png = base64.b64decode(data)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert not re.search(r'(src|href)="(https?:)?//', page)  # readable offline: no CDN, no remote asset


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


def test_data_docs_are_built_with_relative_links_that_survive_a_move(published, tmp_path):
    root, _, page = published
    links = re.findall(r'<a (?:id="data-docs"|class="docs-page") href="([^"]+)"', page)
    assert links[0] == f"{DATA_DOCS}/index.html" and len(links) == 4  # index, suite, first pass, retry 1
    moved = tmp_path / "moved"
    shutil.copytree(root, moved)
    for link in links:
        assert not link.startswith(("/", "file:")), link
        target = moved / link
        assert target.is_file(), link
    first_pass = (moved / links[2]).read_text(encoding="utf-8")
    assert "Expectation Validation Result" in first_pass and "first-pass" in first_pass
    assert "Output length between 10 and 40 characters" in first_pass  # the suite's own descriptions


def test_throughput_counts_only_chunks_finished_in_this_run(published):
    root, _, _ = published
    chunks = throughput(load_publication(root))
    assert list(chunks["seconds"]) == [10.0, 25.0]  # the reused chunk (before the start) is left out
    assert list(chunks["tokens"]) == [37, 4]
    assert list(chunks["tokens_per_second"]) == [37 / 8.0, 4 / 5.0]
    assert list(chunks["cumulative_tokens"]) == [37, 41]


def test_markdown_has_the_same_figures(published):
    root, manifest, _ = published
    markdown = report_markdown(root)
    assert "| attempt | length | stop |" in markdown
    assert "| 1 | 1 | 4 |" in markdown and "| 2 | 0 | 1 |" in markdown
    assert "| first pass | length | 5 | 1 | 80.0% |" in markdown
    assert "| retry 1 | must_not_match | 1 | 0 | 100.0% |" in markdown
    assert "2 engine chunks, 41 output tokens" in markdown


def test_rebuilding_replaces_the_report_and_data_docs(published):
    root, _, _ = published
    stale = root / DATA_DOCS / "stale.html"
    stale.write_text("old", encoding="utf-8")
    write_report(root)
    assert not stale.exists() and (root / DATA_DOCS / "index.html").is_file()


def test_a_directory_without_a_publication_is_named_in_the_error(tmp_path):
    (tmp_path / "manifest.json").write_text("{}", encoding="utf-8")
    with pytest.raises(NotAPublicationError, match="missing accepted/accepted.parquet, rejected/rejected.parquet"):
        write_report(tmp_path)
    with pytest.raises(NotAPublicationError, match="is not a directory"):
        write_report(tmp_path / "nowhere")


def test_a_run_where_every_output_is_rejected_still_gets_a_full_report(tmp_path):
    manifest = make_publication(tmp_path / "run", ExpectationsSpec(min_chars=500))
    assert manifest["counts"]["accepted"] == 0
    page = write_report(tmp_path / "run").read_text(encoding="utf-8")
    assert len(re.findall(r'<img class="chart"[^>]+src="data:image/png;base64,', page)) == 4
    assert 'data-count="accepted">0<' in page
    assert "Sample of accepted outputs (0 of 0)" in page
    assert page.count('<span class="reason">length</span>') == 5  # p6 was rejected before generation
