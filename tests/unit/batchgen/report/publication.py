"""A small synthetic publication like the publish step writes (real GX results, real Parquet), for the report's
tests, and helpers that read the report page's tables."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd

from batchgen.job import ExpectationsSpec
from batchgen.publish import ATTEMPTS as ATTEMPTS_FILE, REJECTED, RESULTS
from expectations.validate import validate_rows

TEMPLATE = "Describe {{ name }} for {{ audience }}."
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


def table(page: str, table_id: str) -> str:
    """The HTML inside the page's table with this id."""
    return page.split(f'id="{table_id}"')[1].split("</table>")[0]


def cells(row_html: str) -> list[str]:
    """The text of each cell of a table row."""
    return [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row_html, re.S)]
