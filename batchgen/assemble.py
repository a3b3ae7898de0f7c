"""From items, rejections and validated generations to the published tables.

Every input item ends in exactly one of the two tables: accepted (one chosen candidate,
or with selection `all` every passing one, a row each) or rejected (with reasons). `assemble` checks that partition and raises if it is broken,
because that would be a bug, never a data problem.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from batchgen.job import SamplingSpec
from batchgen.records import ACCEPTED_FIELDS, CHOICE_FIELDS, Rejection, columns_of


# Whether `assemble` makes a window's rows a column at a time where one candidate is published per item
# (picked_columns); the same frames as row by row (assemble_rows), which the tests compare it with.
COLUMNAR = True


class LostItemsError(AssertionError):
    """The accepted and rejected tables do not account for every item exactly once."""


@dataclass
class Assembled:
    accepted: pd.DataFrame
    rejected: pd.DataFrame


def rank_candidates(candidates: pd.DataFrame, beam: bool = False) -> pd.DataFrame:
    """Best-scored first. Beam search: the beam's rank (vLLM's length-penalised score, candidate 0 is best);
    sampling: the highest cumulative_logprob (unknown last), ties by candidate index."""
    if beam:
        return candidates.sort_values("candidate", kind="stable")
    score = pd.to_numeric(candidates["cumulative_logprob"], errors="coerce").fillna(float("-inf"))
    return candidates.assign(_score=-score).sort_values(["_score", "candidate"], kind="stable").drop(columns="_score")


def choose_candidate(candidates: pd.DataFrame, selection: str = "first_passing",
                     beam: bool = False) -> tuple[pd.Series, bool]:
    """The candidate to publish and whether it passed.

    first_passing: the best-scored candidate that passed every expectation, else the best-scored one (the
    item is rejected with its failures). max_logprob: the highest cumulative_logprob, passing or not
    (vLLM V0's best_of); the item is rejected when that candidate fails.
    """
    ordered = rank_candidates(candidates, beam if selection == "first_passing" else False)
    if selection == "max_logprob":
        return ordered.iloc[0], bool(ordered.iloc[0]["passed"])
    passing = ordered[ordered["passed"].astype(bool)]
    if len(passing):
        return passing.iloc[0], True
    return ordered.iloc[0], False


def choose_candidates(final: pd.DataFrame, selection: str = "first_passing",
                      beam: bool = False) -> pd.DataFrame:
    """`choose_candidate` for every item at once (one sort instead of one per item): the chosen row of each
    item, in the order items first appear in `final`, with `_n_candidates` and `_n_passing`."""
    frame = final.reset_index(drop=True)
    codes, _ = pd.factorize(frame["item_id"])
    passed = frame["passed"].astype(bool).to_numpy()
    keys = pd.DataFrame({"_item": codes, "_candidate": frame["candidate"].to_numpy()})
    by = ["_item"]
    if selection != "max_logprob":
        keys["_fail"] = ~passed  # first_passing: a passing candidate first, else the best-scored one
        by.append("_fail")
    if not (beam and selection == "first_passing"):
        score = pd.to_numeric(frame["cumulative_logprob"], errors="coerce").fillna(float("-inf"))
        keys["_score"] = -score.to_numpy()
        by.append("_score")
    by.append("_candidate")
    first = keys.sort_values(by, kind="stable").drop_duplicates("_item", keep="first")
    chosen = frame.loc[first.index].reset_index(drop=True)
    n_items = len(first)
    chosen["_n_candidates"] = np.bincount(codes, minlength=n_items)[first["_item"].to_numpy()]
    chosen["_n_passing"] = np.bincount(codes, weights=passed, minlength=n_items).astype(int)[first["_item"].to_numpy()]
    return chosen


def records(frame: pd.DataFrame, columns: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows of `frame` as dicts of `columns` (all by default): DataFrame.to_dict(orient="records") built from
    whole columns (Series.tolist), which is several times faster for a window's thousands of rows."""
    columns = list(frame.columns) if columns is None else columns
    values = [frame[column].tolist() for column in columns]
    return [dict(zip(columns, row)) for row in zip(*values)] if columns else [{} for _ in range(len(frame))]


def structured_columns(schema: dict[str, Any] | None) -> list[str]:
    """The published columns of a JSON schema: its top-level properties."""
    return list((schema or {}).get("properties", {}))


def structured_values(text: str, names: list[str]) -> dict[str, Any]:
    """A passing structured output's top-level fields; objects and arrays as JSON text."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        value = None
    value = value if isinstance(value, dict) else {}
    out = {}
    for name in names:
        field = value.get(name)
        out[name] = json.dumps(field, ensure_ascii=False) if isinstance(field, (dict, list)) else field
    return out


def assemble(
    items: pd.DataFrame,
    columns: list[str],
    early_rejections: list[Rejection],
    final: pd.DataFrame,
    sampling: SamplingSpec | None = None,
) -> Assembled:
    """Pick the published candidate of each generated item; everything else is a rejection.

    `final` holds the latest attempt of every (item, candidate) with `passed` and `failed`.
    """
    sampling = sampling or SamplingSpec()
    fields = [*ACCEPTED_FIELDS, *CHOICE_FIELDS]
    if sampling.overrides.get("temperature"):
        fields.append("temperature")
    if sampling.logprobs is not None:
        fields.append("logprobs")
    if "lora" in final.columns and final["lora"].notna().any():
        fields.append("lora")  # the adapter that wrote each output (engine.lora, engine.lora_column)
    extra = structured_columns(sampling.json_schema)
    fields += extra
    # whole columns as Python lists: iterating an Arrow-backed column value by value costs several times more
    item_ids = items["item_id"].tolist()
    inputs = dict(zip(item_ids, records(items, columns)))
    numbers = dict(zip(item_ids, items["row_number"].tolist()))
    accepted: list[dict[str, Any]] = []
    rejected: list[Rejection] = list(early_rejections)
    generated = set()
    accepted_columns: dict[str, list[Any]] | None = None  # the columnar path's (picked_columns)
    every = sampling.selection == "all"  # every passing candidate is published; the item's verdict is first_passing's
    chosen_by = "first_passing" if every else sampling.selection
    picked = choose_candidates(final, chosen_by, sampling.use_beam_search) if len(final) else final
    passing = (final[final["passed"].astype(bool)].sort_values(["item_id", "candidate"], kind="stable")
               .groupby("item_id", sort=False) if every and len(final) else None)
    copied = [f for f in fields if f in picked.columns and f not in ("item_id", "row_number", "input")]
    if every or extra or not COLUMNAR:  # a row per published candidate, a structured output's fields
        assemble_rows(picked, passing, copied, extra, numbers, inputs, sampling, accepted, rejected, generated)
    elif len(picked):
        accepted_columns, rejected_columns = picked_columns(picked, copied, numbers, inputs, sampling)
        generated.update(accepted_columns["item_id"], rejected_columns["item_id"])
    early_ids = {r.item_id for r in early_rejections}
    for item_id in item_ids:
        if item_id not in generated and item_id not in early_ids:
            rejected.append(Rejection(item_id, numbers[item_id], "generate", ["not_generated"],
                                      "the engine returned no output", inputs[item_id]))
    if accepted_columns is None:
        result = Assembled(accepted=pd.DataFrame(accepted, columns=fields),
                           rejected=pd.DataFrame(columns_of(rejected, Rejection)))
    else:  # the picked candidates' columns, with the rejections made before and after them around theirs
        before, after = columns_of(list(early_rejections), Rejection), columns_of(rejected[len(early_rejections):],
                                                                                  Rejection)
        count = len(accepted_columns["item_id"])
        result = Assembled(
            accepted=pd.DataFrame({f: accepted_columns.get(f, [np.nan] * count) for f in fields}, columns=fields)
            if count else pd.DataFrame([], columns=fields),
            rejected=pd.DataFrame({f: before[f] + rejected_columns[f] + after[f] for f in before}))
    check_exactly_once(items, early_rejections, result)
    return result


def picked_columns(picked: pd.DataFrame, copied: list[str], numbers: dict[str, Any], inputs: dict[str, Any],
                   sampling: SamplingSpec) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    """`assemble`'s rows as columns, one candidate published per item (not selection `all`, not a structured
    output): the accepted rows' columns (item_id, row_number, input, `copied`, the choice's) and the rejected
    ones' (Rejection's fields), each a list in `picked`'s order: the values `assemble_rows` gives, made a column at
    a time rather than a dict per row (a window of 1,824 rows on 2 cores: `assemble` 21-28 ms against 28-42, medians
    of two rounds: benchmarks/results/cpu-columnar-assemble/)."""
    passed = picked["passed"].astype(bool).to_numpy()
    kept, failed = np.flatnonzero(passed).tolist(), np.flatnonzero(~passed).tolist()
    ids, n_candidates = picked["item_id"].tolist(), picked["_n_candidates"].astype(int).tolist()

    def take(values: list[Any], rows: list[int]) -> list[Any]:
        return [values[row] for row in rows]

    accepted_ids = take(ids, kept)
    accepted: dict[str, list[Any]] = {"item_id": accepted_ids, "row_number": [numbers.get(i) for i in accepted_ids],
                                      "input": [inputs.get(i) for i in accepted_ids]}
    for name in copied:
        accepted[name] = take(picked[name].tolist(), kept)
    accepted.update(n_candidates=take(n_candidates, kept),
                    n_passing=take(picked["_n_passing"].astype(int).tolist(), kept),
                    selection=[sampling.selection] * len(kept))
    rejected_ids = take(ids, failed)
    reasons = [list(failures) for failures in take(picked["failed"].tolist(), failed)]
    counts, candidates = take(n_candidates, failed), take(picked["candidate"].tolist(), failed)
    best = sampling.selection == "max_logprob"
    rejected = {
        "item_id": rejected_ids, "row_number": [numbers.get(i) for i in rejected_ids],
        "stage": ["validate"] * len(failed), "reasons": reasons,
        "detail": [f"candidate {int(candidate)}{' (highest cumulative_logprob)' if best and n > 1 else ''} of {n} "
                   f"failed: {', '.join(why)}" for candidate, n, why in zip(candidates, counts, reasons)],
        "input": [inputs.get(i) for i in rejected_ids], "candidate": candidates,
        **{name: take(picked[name].tolist(), failed) for name in ("attempt", "text", "finish_reason",
                                                                  "n_output_tokens")}}
    return accepted, rejected


def assemble_rows(picked: pd.DataFrame, passing: Any, copied: list[str], extra: list[str],
                  numbers: dict[str, Any], inputs: dict[str, Any], sampling: SamplingSpec,
                  accepted: list[dict[str, Any]], rejected: list[Rejection], generated: set[str]) -> None:
    """`assemble`'s rows one by one, into `accepted` (a dict each) and `rejected`: with selection `all` (every
    passing candidate of `passing`, the passing rows grouped by item) or a structured output's fields."""
    every = passing is not None
    # the columns read below, not every attempt column (token ids and logprobs as Python lists cost the most)
    read = {"item_id", "passed", "failed", "candidate", "attempt", "text", "finish_reason", "n_output_tokens",
            "_n_candidates", "_n_passing", *copied}
    for chosen in records(picked, [c for c in picked.columns if c in read]):
        item_id = chosen["item_id"]
        generated.add(item_id)
        ok, n_candidates = bool(chosen["passed"]), int(chosen["_n_candidates"])
        base = {"item_id": item_id, "row_number": numbers.get(item_id), "input": inputs.get(item_id)}
        if ok:
            for published in (records(passing.get_group(item_id)) if every else [chosen]):
                row = {**base, **{f: published[f] for f in copied}}
                row.update(n_candidates=n_candidates, n_passing=int(chosen["_n_passing"]),
                           selection=sampling.selection)
                if extra:  # a structured output's fields (json_schema): the text parsed only then
                    row.update(structured_values(published["text"], extra))
                accepted.append(row)
        else:
            reasons = list(chosen["failed"])
            which = " (highest cumulative_logprob)" if sampling.selection == "max_logprob" and n_candidates > 1 else ""
            rejected.append(Rejection(
                **base, stage="validate", reasons=reasons,
                detail=f"candidate {int(chosen['candidate'])}{which} of {n_candidates} failed: {', '.join(reasons)}",
                candidate=chosen["candidate"], attempt=chosen["attempt"], text=chosen["text"],
                finish_reason=chosen["finish_reason"], n_output_tokens=chosen["n_output_tokens"]))


def check_exactly_once(items: pd.DataFrame, early_rejections: list[Rejection], result: Assembled) -> None:
    """Every item is accepted or rejected, once. With selection `all` an accepted item has one results row per
    published candidate: it counts once, and no candidate twice."""
    expected = set(items["item_id"].tolist()) | {r.item_id for r in early_rejections}
    rows = result.accepted[["item_id", "candidate"]]
    if rows.duplicated().any():
        twice = rows[rows.duplicated()]
        raise LostItemsError(f"candidates published twice: {list(map(tuple, twice.to_numpy()[:5]))}")
    published = list(dict.fromkeys(result.accepted["item_id"].tolist())) + result.rejected["item_id"].tolist()
    duplicates = {i for i, count in Counter(published).items() if count > 1}
    missing = expected - set(published)
    extra = set(published) - expected
    if duplicates or missing or extra:
        raise LostItemsError(
            f"items not published exactly once: {len(missing)} missing {sorted(missing)[:5]}, "
            f"{len(duplicates)} duplicated {sorted(duplicates)[:5]}, {len(extra)} unknown {sorted(extra)[:5]}"
        )
