"""A window's tally (counts, truncation, rescued items, tokens) from hand-made tables, as the manifest counts them."""

from __future__ import annotations

import pandas as pd

from batchgen.manifest import package_versions, tally, truncation_counts


def attempt(item_id: str, attempt_no: int, finish_reason: str, failed: list[str], candidate: int = 0) -> dict:
    return {"item_id": item_id, "candidate": candidate, "attempt": attempt_no, "finish_reason": finish_reason,
            "failed": failed, "n_prompt_tokens": 10, "new_output_tokens": 4 * attempt_no}


def window() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Four items: `a` cut off and accepted on its retry, `b` accepted at once, `c` cut off twice and rejected,
    `d` rejected at the prompt stage before the engine saw it."""
    attempts = pd.DataFrame([
        attempt("a", 1, "length", ["truncated"]), attempt("a", 2, "stop", []),
        attempt("b", 1, "stop", []),
        attempt("c", 1, "length", ["truncated"]), attempt("c", 2, "length", ["truncated", "keyword"]),
    ])
    accepted = pd.DataFrame([{"item_id": "a", "candidate": 0, "attempt": 2},
                             {"item_id": "b", "candidate": 0, "attempt": 1}])
    rejected = pd.DataFrame([{"item_id": "c", "reasons": ["truncated", "keyword"]},
                             {"item_id": "d", "reasons": ["prompt_too_long"]}])
    return accepted, rejected, attempts


def test_a_window_tally_counts_each_item_once_with_its_truncation_and_rescue():
    accepted, rejected, attempts = window()

    counted = tally(accepted, rejected, attempts, reused=1)

    assert (counted.items, counted.accepted, counted.rejected) == (4, 2, 2)
    assert counted.generated_items == 3  # d never reached the engine
    assert (counted.truncated_first_pass, counted.truncated_final) == (2, 1)  # a and c cut off; c still at the end
    assert (counted.attempts, counted.retry_attempts, counted.reused) == (5, 2, 1)
    assert counted.rejected_by_reason == {"keyword": 1, "prompt_too_long": 1, "truncated": 1}
    assert counted.rescued == 1 and counted.rescued_by_reason == {"truncated": 1}
    assert (counted.prompt_tokens, counted.output_tokens) == (50, 4 + 8 + 4 + 4 + 8)
    assert counted.rates().pass_rate == 0.5


def test_truncation_counts_items_not_candidates_and_follow_each_candidates_latest_attempt():
    attempts = pd.DataFrame([
        attempt("a", 1, "length", [], candidate=0), attempt("a", 1, "length", [], candidate=1),
        attempt("a", 2, "stop", [], candidate=0),  # candidate 1 was never retried: a is still cut off
        attempt("b", 1, "length", []), attempt("b", 2, "stop", []),
    ])
    assert truncation_counts(attempts) == (2, 1)
    assert truncation_counts(attempts.iloc[0:0]) == (0, 0)


def test_a_window_of_only_rejections_tallies_without_attempts():
    rejected = pd.DataFrame([{"item_id": "x", "reasons": ["missing_field"]}])
    empty = pd.DataFrame(columns=["item_id", "candidate", "attempt", "finish_reason", "failed"])

    counted = tally(pd.DataFrame(columns=["item_id", "candidate", "attempt"]), rejected, empty)

    assert (counted.items, counted.accepted, counted.rejected, counted.generated_items) == (1, 0, 1, 0)
    assert counted.rejected_by_reason == {"missing_field": 1} and counted.rescued_by_reason == {}
    assert (counted.attempts, counted.prompt_tokens, counted.output_tokens) == (0, 0, 0)


def test_package_versions_name_the_installed_ones_and_leave_out_absent_ones():
    versions = package_versions(("pandas", "no-such-distribution-batchgen"))
    assert versions == {"pandas": pd.__version__}
