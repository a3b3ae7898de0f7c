"""Assembly of the accepted and rejected tables: exactly once, the candidate each selection publishes,
structured-output fields as typed columns."""

from __future__ import annotations

import random

import pandas as pd
import pyarrow as pa
import pytest

from batchgen.assemble import (
    Assembled,
    LostItemsError,
    assemble,
    check_exactly_once,
    choose_candidate,
    choose_candidates,
    rank_candidates,
    structured_values,
)
from batchgen.job import SamplingSpec
from batchgen.records import LOGPROBS_TYPE
from batchgen.retry import latest_attempts
from batchgen.schema import accepted_schema
from tests.frames import COLUMNS, make_items, with_verdicts
from tests.publications import generated


def test_every_item_is_published_exactly_once(scenario):
    result = assemble(scenario.items, COLUMNS, scenario.early, latest_attempts(scenario.attempts))

    accepted = list(result.accepted["item_id"])
    rejected = list(result.rejected["item_id"])
    assert sorted(accepted) == ["p1", "p2"]
    assert sorted(rejected) == ["line-9", "p3", "p4", "p5"]
    assert set(accepted).isdisjoint(rejected)


def test_the_first_passing_candidate_is_accepted(scenario):
    result = assemble(scenario.items, COLUMNS, scenario.early, latest_attempts(scenario.attempts))
    accepted = result.accepted.set_index("item_id")

    assert accepted.at["p1", "candidate"] == 1
    assert accepted.at["p1", "text"] == "这款耳机降噪出色，通勤首选。"
    assert accepted.at["p1", "input"] == {"name": "耳机", "feature": "降噪"}
    assert accepted.at["p1", "row_number"] == 2
    assert accepted.at["p1", "request_id"] == "req-p1-1"
    # the retry's output is the one published for p2
    assert (accepted.at["p2", "attempt"], accepted.at["p2", "strategy"]) == (2, "grow")
    assert accepted.at["p2", "text"] == "The Aurora Mug keeps coffee hot."
    assert accepted.at["p2", "max_tokens"] == 32


def test_a_lower_passing_candidate_wins_over_a_higher_one():
    items = make_items([("p1", "Mug", "hot")])
    final = with_verdicts(generated("p1", ["bad", "good one", "good two"]), [["length"], [], []])
    result = assemble(items, COLUMNS, [], final)
    assert list(result.accepted["candidate"]) == [1]


def test_rejections_carry_their_stage_and_reasons(scenario):
    result = assemble(scenario.items, COLUMNS, scenario.early, latest_attempts(scenario.attempts))
    rejected = result.rejected.set_index("item_id")

    assert (rejected.at["line-9", "stage"], list(rejected.at["line-9", "reasons"])) == ("load", ["invalid_json"])
    assert rejected.at["line-9", "detail"] == "line 9: Expecting value"
    assert (rejected.at["p4", "stage"], list(rejected.at["p4", "reasons"])) == ("prompt", ["missing_field"])
    assert rejected.at["p4", "detail"] == "row 5: feature is empty"
    # a generated item whose candidates all failed: candidate 0 is reported, with its failures
    assert rejected.at["p3", "stage"] == "validate"
    assert list(rejected.at["p3", "reasons"]) == ["keyword", "length"]
    assert rejected.at["p3", "candidate"] == 0
    assert rejected.at["p3", "text"] == "Buy now"
    assert rejected.at["p3", "detail"] == "candidate 0 of 2 failed: keyword, length"
    # an item the engine never answered is not silently dropped
    assert (rejected.at["p5", "stage"], list(rejected.at["p5", "reasons"])) == ("generate", ["not_generated"])
    assert rejected.at["p5", "input"] == {"name": "Lost Lamp", "feature": "bright"}


def test_check_exactly_once_raises_on_a_duplicate(scenario):
    result = assemble(scenario.items, COLUMNS, scenario.early, latest_attempts(scenario.attempts))
    broken = Assembled(accepted=result.accepted,
                       rejected=pd.concat([result.rejected, result.accepted[["item_id"]].iloc[:1]], ignore_index=True))

    with pytest.raises(LostItemsError, match=r"1 duplicated \['p1'\]"):
        check_exactly_once(scenario.items, scenario.early, broken)


def test_check_exactly_once_raises_on_a_missing_item(scenario):
    result = assemble(scenario.items, COLUMNS, scenario.early, latest_attempts(scenario.attempts))
    broken = Assembled(accepted=result.accepted.iloc[1:], rejected=result.rejected)
    with pytest.raises(LostItemsError, match=r"1 missing \['p1'\]"):
        check_exactly_once(scenario.items, scenario.early, broken)


def candidates(texts_logprobs_passed: list[tuple[str, float | None, bool]], item_id: str = "p1") -> pd.DataFrame:
    return pd.DataFrame([
        {"item_id": item_id, "candidate": i, "attempt": 1, "text": text, "cumulative_logprob": logprob,
         "passed": passed, "failed": [] if passed else ["keyword"], "finish_reason": "stop"}
        for i, (text, logprob, passed) in enumerate(texts_logprobs_passed)
    ])


def test_first_passing_publishes_the_best_scored_passing_candidate():
    pool = candidates([("fails, best score", -1.0, False), ("passes", -5.0, True), ("passes, better", -3.0, True)])
    chosen, ok = choose_candidate(pool, "first_passing")
    assert ok and chosen["candidate"] == 2


def test_first_passing_rejects_with_the_best_scored_candidate_when_none_passes():
    pool = candidates([("a", -4.0, False), ("b", -2.0, False)])
    chosen, ok = choose_candidate(pool, "first_passing")
    assert not ok and chosen["candidate"] == 1


def test_max_logprob_publishes_the_highest_cumulative_logprob_and_rejects_it_when_it_fails():
    pool = candidates([("a", -4.0, True), ("b", -0.5, True), ("c", -2.0, True)])
    assert choose_candidate(pool, "max_logprob")[0]["candidate"] == 1
    pool = candidates([("a", -4.0, True), ("b", -0.5, False)])
    chosen, ok = choose_candidate(pool, "max_logprob")
    assert not ok and chosen["candidate"] == 1  # not the passing one: max_logprob does not look at verdicts


def test_unknown_logprobs_rank_last_and_ties_go_to_the_lower_index():
    pool = candidates([("a", None, True), ("b", -1.0, True), ("c", -1.0, True)])
    assert list(rank_candidates(pool)["candidate"]) == [1, 2, 0]


def test_beam_candidates_rank_by_beam_order_not_by_logprob():
    # vLLM ranks beams by the length-penalised score: beam 0 may have the lower cumulative_logprob.
    pool = candidates([("long beam", -6.0, True), ("short beam", -2.0, True)])
    assert choose_candidate(pool, "first_passing", beam=True)[0]["candidate"] == 0
    assert choose_candidate(pool, "max_logprob", beam=True)[0]["candidate"] == 1


def items_frame(ids: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"item_id": pd.Series(ids, dtype="string"),
                         "row_number": pd.Series(range(2, len(ids) + 2), dtype="int64"),
                         "name": [f"name {i}" for i in ids]})


def test_assemble_keeps_candidate_counts_and_the_selection_and_rejects_a_failing_max_logprob():
    final = pd.concat([
        candidates([("a", -4.0, True), ("b", -0.5, False), ("c", -2.0, True)], "p1"),
        candidates([("x", -1.0, True), ("y", -3.0, False)], "p2"),
    ], ignore_index=True)
    for column, value in (("attempt", 1), ("strategy", "first"), ("n_prompt_tokens", 5), ("n_output_tokens", 3),
                          ("max_tokens", 8), ("request_id", "r"), ("prompt", "p")):
        final[column] = value

    first = assemble(items_frame(["p1", "p2"]), ["name"], [], final, SamplingSpec(n=3))
    rows = first.accepted.set_index("item_id")
    assert rows.at["p1", "candidate"] == 2 and rows.at["p2", "candidate"] == 0
    assert (rows.at["p1", "n_candidates"], rows.at["p1", "n_passing"], rows.at["p1", "selection"]) == (
        3, 2, "first_passing")

    best = assemble(items_frame(["p1", "p2"]), ["name"], [], final, SamplingSpec(n=3, selection="max_logprob"))
    assert list(best.accepted["item_id"]) == ["p2"]
    rejected = best.rejected.set_index("item_id")
    assert rejected.at["p1", "candidate"] == 1
    assert "candidate 1 (highest cumulative_logprob) of 3 failed: keyword" == rejected.at["p1", "detail"]


def test_structured_fields_become_typed_result_columns():
    values = structured_values('{"name": "Mug", "price": 12, "tags": ["a", "b"]}', ["name", "price", "tags"])
    assert values == {"name": "Mug", "price": 12, "tags": '["a", "b"]'}
    assert structured_values("not json", ["name"]) == {"name": None}
    frame = pd.DataFrame([{"item_id": "p1", "name": "Mug", "price": 12, "tags": '["a"]', "n_candidates": 2,
                           "logprobs": None}])
    schema = accepted_schema(pa.string(), frame)
    assert schema.field("price").type == pa.int64() and schema.field("name").type == pa.string()
    assert schema.field("n_candidates").type == pa.int32() and schema.field("logprobs").type == LOGPROBS_TYPE


def random_final(seed: int) -> pd.DataFrame:
    rng = random.Random(seed)
    rows = []
    for item in range(rng.randint(1, 12)):
        for candidate in rng.sample(range(6), rng.randint(1, 5)):
            passed = rng.random() < 0.5
            rows.append({"item_id": f"p{item}", "candidate": candidate, "attempt": rng.randint(1, 3),
                         "passed": passed, "failed": [] if passed else ["keyword"],
                         "cumulative_logprob": rng.choice([None, float("nan"), float(rng.randint(-6, 0))]),
                         "text": f"text {item}.{candidate}"})
    rng.shuffle(rows)  # items interleaved, as after retries
    return pd.DataFrame(rows)


@pytest.mark.parametrize("selection", ["first_passing", "max_logprob"])
@pytest.mark.parametrize("beam", [False, True])
def test_choose_candidates_matches_the_per_item_rule(selection, beam):
    for seed in range(60):
        final = random_final(seed)
        groups = list(final.groupby("item_id", sort=False))
        picked = choose_candidates(final, selection, beam)
        expected = [choose_candidate(group, selection, beam) for _, group in groups]
        assert list(picked["item_id"]) == [item for item, _ in groups], seed
        assert list(picked["candidate"]) == [chosen["candidate"] for chosen, _ in expected], (seed, selection, beam)
        assert [bool(p) for p in picked["passed"]] == [ok for _, ok in expected], seed
        assert list(picked["_n_candidates"]) == [len(group) for _, group in groups], seed
        assert list(picked["_n_passing"]) == [int(group["passed"].sum()) for _, group in groups], seed


def test_selection_all_publishes_every_passing_candidate_and_each_item_once():
    from batchgen.assemble import assemble
    from batchgen.job import SamplingSpec
    from batchgen.manifest import tally

    for seed in range(40):
        final = random_final(seed).assign(finish_reason="stop", n_output_tokens=3)
        ids = list(dict.fromkeys(final["item_id"])) + ["never-generated"]
        items = pd.DataFrame({"item_id": ids, "row_number": range(1, len(ids) + 1), "name": ids})

        result = assemble(items, ["name"], [], final, SamplingSpec(n=6, selection="all"))

        passing = final[final["passed"]]
        published = sorted(zip(result.accepted["item_id"], result.accepted["candidate"]))
        assert published == sorted(zip(passing["item_id"], passing["candidate"])), seed
        assert set(result.accepted["selection"]) <= {"all"}
        counts = result.accepted.groupby("item_id")["n_passing"].agg(["first", "size"])
        assert (counts["first"] == counts["size"]).all(), seed  # n_passing: the item's rows in results
        rejected = set(result.rejected["item_id"])
        assert rejected == set(ids) - set(passing["item_id"]), seed
        assert not rejected & set(result.accepted["item_id"])
        counted = tally(result.accepted, result.rejected, final.assign(n_prompt_tokens=4, new_output_tokens=3))
        assert counted["items"] == len(ids) and counted["accepted"] == passing["item_id"].nunique(), seed


def both_ways(monkeypatch, *args, **kwargs) -> tuple[Assembled, Assembled]:
    """assemble's columnar path and its row-by-row one on the same arguments."""
    import batchgen.assemble

    got = []
    for columnar in (True, False):
        monkeypatch.setattr(batchgen.assemble, "COLUMNAR", columnar)
        got.append(assemble(*args, **kwargs))
    return got[0], got[1]


def assert_same(columnar: Assembled, rows: Assembled) -> None:
    pd.testing.assert_frame_equal(columnar.accepted, rows.accepted)
    pd.testing.assert_frame_equal(columnar.rejected, rows.rejected)


@pytest.mark.parametrize("selection", ["first_passing", "max_logprob"])
def test_the_columnar_path_assembles_what_the_rows_do(monkeypatch, scenario, selection):
    """Every field of every accepted and rejected row (early rejections first, then the failed candidates, then
    the items never generated), their dtypes included: the published tables are made from these frames."""
    sampling = SamplingSpec(n=2, selection=selection)
    assert_same(*both_ways(monkeypatch, scenario.items, COLUMNS, scenario.early, latest_attempts(scenario.attempts),
                           sampling))
    for seed in range(40):
        final = random_final(seed).assign(finish_reason="stop", n_output_tokens=3)
        ids = list(dict.fromkeys(final["item_id"])) + ["never-generated"]
        items = pd.DataFrame({"item_id": ids, "row_number": range(1, len(ids) + 1), "name": ids})
        for passing in (None, True, False):  # as drawn, every candidate passing (no rejection), none passing
            drawn = final if passing is None else final.assign(passed=passing,
                                                               failed=[[] if passing else ["keyword"]] * len(final))
            columnar, rows = both_ways(monkeypatch, items, ["name"], [], drawn, SamplingSpec(n=6, selection=selection))
            assert_same(columnar, rows)
