"""assemble picks every item's candidate with one sort (choose_candidates): it must pick exactly what the
per-item rule (choose_candidate) picks, for every selection, with and without beam search."""

from __future__ import annotations

import random

import pandas as pd
import pytest

from batchgen.assemble import choose_candidate, choose_candidates


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
