"""From items, rejections and validated generations to the published tables.

Every input item ends in exactly one of the two tables: accepted (one chosen candidate)
or rejected (with reasons). `assemble` checks that partition and raises if it is broken,
because that would be a bug, never a data problem.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pandas as pd

from batchgen.items import Rejection


class LostItemsError(AssertionError):
    """The accepted and rejected tables do not account for every item exactly once."""


@dataclass
class Assembled:
    accepted: pd.DataFrame
    rejected: pd.DataFrame


ACCEPTED_FIELDS = [
    "item_id", "row_number", "candidate", "attempt", "strategy", "text", "finish_reason", "n_prompt_tokens",
    "n_output_tokens", "cumulative_logprob", "max_tokens", "request_id", "prompt", "input",
]
REJECTED_FIELDS = [
    "item_id", "row_number", "stage", "reasons", "detail", "candidate", "attempt", "text", "finish_reason",
    "n_output_tokens", "input",
]


def choose_candidate(candidates: pd.DataFrame) -> tuple[pd.Series, bool]:
    """first_passing: the lowest-index candidate that passed every expectation, else candidate 0 (rejected)."""
    ordered = candidates.sort_values("candidate")
    passing = ordered[ordered["passed"]]
    if len(passing):
        return passing.iloc[0], True
    return ordered.iloc[0], False


def assemble(
    items: pd.DataFrame,
    columns: list[str],
    early_rejections: list[Rejection],
    final: pd.DataFrame,
) -> Assembled:
    """Pick the published candidate of each generated item; everything else is a rejection.

    `final` holds the latest attempt of every (item, candidate) with `passed` and `failed`.
    """
    inputs = {row["item_id"]: {c: row[c] for c in columns} for row in items.to_dict(orient="records")}
    numbers = dict(zip(items["item_id"], items["row_number"]))
    accepted: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = [
        {"item_id": r.item_id, "row_number": r.row_number, "stage": r.stage, "reasons": list(r.reasons),
         "detail": r.detail, "candidate": None, "attempt": None, "text": None, "finish_reason": None,
         "n_output_tokens": None, "input": r.input}
        for r in early_rejections
    ]
    generated = set()
    for item_id, candidates in final.groupby("item_id", sort=False):
        generated.add(item_id)
        chosen, ok = choose_candidate(candidates)
        base = {"item_id": item_id, "row_number": numbers.get(item_id), "input": inputs.get(item_id)}
        if ok:
            accepted.append({**base, **{f: chosen[f] for f in ACCEPTED_FIELDS if f not in base}})
        else:
            reasons = list(chosen["failed"])
            rejected.append({
                **base, "stage": "validate", "reasons": reasons,
                "detail": f"candidate {int(chosen['candidate'])} of {len(candidates)} failed: {', '.join(reasons)}",
                "candidate": chosen["candidate"], "attempt": chosen["attempt"], "text": chosen["text"],
                "finish_reason": chosen["finish_reason"], "n_output_tokens": chosen["n_output_tokens"],
            })
    early_ids = {r.item_id for r in early_rejections}
    for item_id in items["item_id"]:
        if item_id not in generated and item_id not in early_ids:
            rejected.append({"item_id": item_id, "row_number": numbers[item_id], "stage": "generate",
                             "reasons": ["not_generated"], "detail": "the engine returned no output",
                             "candidate": None, "attempt": None, "text": None, "finish_reason": None,
                             "n_output_tokens": None, "input": inputs[item_id]})
    result = Assembled(
        accepted=pd.DataFrame(accepted, columns=ACCEPTED_FIELDS),
        rejected=pd.DataFrame(rejected, columns=REJECTED_FIELDS),
    )
    check_exactly_once(items, early_rejections, result)
    return result


def check_exactly_once(items: pd.DataFrame, early_rejections: list[Rejection], result: Assembled) -> None:
    expected = set(items["item_id"]) | {r.item_id for r in early_rejections}
    published = list(result.accepted["item_id"]) + list(result.rejected["item_id"])
    duplicates = {i for i, count in Counter(published).items() if count > 1}
    missing = expected - set(published)
    extra = set(published) - expected
    if duplicates or missing or extra:
        raise LostItemsError(
            f"items not published exactly once: {len(missing)} missing {sorted(missing)[:5]}, "
            f"{len(duplicates)} duplicated {sorted(duplicates)[:5]}, {len(extra)} unknown {sorted(extra)[:5]}"
        )
