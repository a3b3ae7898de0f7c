"""GX validation results of a pass's windows as one result: counts summed, the row lists bounded.

Below GX itself: plain JSON-like dicts as `expectations.validate` writes them (`result_as_json`), so that the run's
totals (batchgen.records.RunTotals) fold each window's result into one as the windows are staged.
"""

from __future__ import annotations

import copy
import json
from typing import Any

# Counts in a GX result that add up across windows, and the row lists it carries.
_COUNTS = ("element_count", "unexpected_count", "missing_count")
PARTIAL_ROWS = 20  # GX's own size of the partial lists
LISTED_ROWS = 1000  # failing rows listed per expectation in a merged result; every row's verdict is in attempts
# each row list of a result and how many entries it keeps
ROW_LISTS = (("partial_unexpected_list", PARTIAL_ROWS), ("partial_unexpected_index_list", PARTIAL_ROWS),
             ("unexpected_list", LISTED_ROWS), ("unexpected_index_list", LISTED_ROWS))


def merge_results(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One GX validation result for several windows of one pass (same suite, disjoint rows).

    Counts are summed and percentages recomputed, so the merged result reads like one
    validation of all the rows. The row lists keep their first LISTED_ROWS entries (the
    partial lists, GX's 20), so the result's size does not grow with the run; the verdict
    of every row is in attempts.parquet (`passed`, `failed`). `fold_results` then
    `finish_results`, a window at a time.
    """
    merged = None
    for result in results:
        merged = fold_results(merged, result)
    return finish_results(merged)


def fold_results(merged: dict[str, Any] | None, more: dict[str, Any]) -> dict[str, Any] | None:
    """`merged` (earlier windows' results of one pass folded together, None before the first) with one more
    window's result: counts summed, row lists joined and bounded, so that a run keeps one bounded result per
    pass however many windows it has, not every window's. Neither argument is changed (the new result shares
    their list entries); `finish_results` makes it a result to publish."""
    if not more.get("results"):
        return merged
    if merged is None:
        return more
    outcomes = []
    for mine, theirs in zip(merged["results"], more["results"]):
        ours, other = mine.get("result") or {}, theirs.get("result") or {}
        result = dict(ours)
        for key in _COUNTS:
            if key in ours or key in other:
                result[key] = (ours.get(key) or 0) + (other.get(key) or 0)
        for key, cap in ROW_LISTS:
            if key in ours or key in other:
                kept = (ours.get(key) or [])[:cap]
                result[key] = kept + (other.get(key) or [])[:cap - len(kept)]
        if "partial_unexpected_counts" in ours or "partial_unexpected_counts" in other:
            counts: dict[str, dict[str, Any]] = {}
            for entry in (ours.get("partial_unexpected_counts") or []) + (other.get("partial_unexpected_counts") or []):
                key = json.dumps(entry.get("value"), sort_keys=True, default=str)
                counts.setdefault(key, {"value": entry.get("value"), "count": 0})["count"] += entry.get("count", 0)
            result["partial_unexpected_counts"] = sorted(counts.values(), key=lambda e: -e["count"])[:PARTIAL_ROWS]
        outcomes.append({**mine, "success": bool(mine.get("success")) and bool(theirs.get("success")),
                         "result": result})
    return {**merged, "results": outcomes}


def finish_results(merged: dict[str, Any] | None) -> dict[str, Any]:
    """A fold of windows' results (`fold_results`) as one result: lists bounded, percentages and statistics
    recomputed from the summed counts."""
    if merged is None:
        return {"success": True, "results": [], "statistics": {}}
    merged = copy.deepcopy(merged)
    for outcome in merged["results"]:
        res = outcome.get("result") or {}
        for key, cap in ROW_LISTS:
            if isinstance(res.get(key), list):
                res[key] = res[key][:cap]
        if "element_count" not in res:
            continue
        total = res["element_count"]
        missing, unexpected = res.get("missing_count") or 0, res.get("unexpected_count") or 0
        present = total - missing
        if "unexpected_percent" in res:
            res["unexpected_percent"] = 100.0 * unexpected / present if present else None
        if "unexpected_percent_nonmissing" in res:
            res["unexpected_percent_nonmissing"] = 100.0 * unexpected / present if present else None
        if "unexpected_percent_total" in res:
            res["unexpected_percent_total"] = 100.0 * unexpected / total if total else None
        if "missing_percent" in res:
            res["missing_percent"] = 100.0 * missing / total if total else None
    successes = sum(bool(o.get("success")) for o in merged["results"])
    evaluated = len(merged["results"])
    merged["success"] = successes == evaluated
    merged["statistics"] = {**merged.get("statistics", {}), "evaluated_expectations": evaluated,
                            "successful_expectations": successes, "unsuccessful_expectations": evaluated - successes,
                            "success_percent": 100.0 * successes / evaluated if evaluated else None}
    return merged
