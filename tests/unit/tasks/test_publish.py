"""The publish task's check that a staging holds each expected item exactly once."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen.assemble import LostItemsError
from batchgen.publish import REJECTED, RESULTS
from batchgen.records import Manifest
from tasks.publish import check_published_once


def test_check_published_once_refuses_a_staging_that_lost_or_doubled_an_item(tmp_path):
    def staging(name: str, results: list[str], rejected: list[str]) -> Path:
        folder = tmp_path / name
        (folder / "accepted").mkdir(parents=True)
        (folder / "rejected").mkdir()
        pq.write_table(pa.table({"item_id": pa.array(results, pa.string()), "text": ["x"] * len(results)}),
                       folder / RESULTS)
        pq.write_table(pa.table({"item_id": pa.array(rejected, pa.string())}), folder / REJECTED)
        return folder

    check_published_once(staging("good", ["a", "b"], ["c"]), 3)
    with pytest.raises(LostItemsError, match="2 published rows, 2 distinct items, 3 expected"):
        check_published_once(staging("lost", ["a", "b"], []), 3)
    with pytest.raises(LostItemsError, match="3 published rows, 2 distinct items, 3 expected"):
        check_published_once(staging("twice", ["a", "b"], ["a"]), 3)  # a window accepted it, another rejected it


@pytest.mark.parametrize(("cpu", "apart"), [(True, False), (False, True)])
def test_the_chart_worker_runs_only_where_the_engine_does_not_use_the_cores(monkeypatch, cpu, apart):
    """On CPU builds the engine's threads use every core, and a worker process importing matplotlib beside them
    slowed generation (benchmarks/results/cpu-paired/); on an accelerator the worker draws beside the Data Docs."""
    import batchgen.engine
    from tasks.publish import charts_apart

    monkeypatch.setattr(batchgen.engine, "on_cpu", lambda: cpu)
    assert charts_apart() is apart


def test_a_window_staged_early_and_last_publishes_every_item_once_early_items_first(tmp_path):
    """The items none of whose first outputs was cut off are final after the first pass: the window's early piece
    stages them while the cut-off ones are retried; its last piece stages the rest with every later attempt, the
    window's engine figures and GX results. Every item ends once in accepted or rejected, every attempt once, and
    the window's counts add up to what one staging of the whole window counts."""
    import pandas as pd

    from batchgen.job import JobSpec
    from batchgen.publish import ATTEMPTS, Publication
    from batchgen.records import EngineStats, Rejection, Window
    from batchgen.schema import frame_input_codec
    from tasks.publish import final_after_first_pass, stage_first_pass_task, stage_window_task
    from tasks.validate import Validated
    from tests.frames import COLUMNS, make_items, with_verdicts
    from tests.publications import generated

    items = make_items([(f"i{k}", f"name {k}", "feature") for k in range(6)])
    # i0 and i3 cut off (i3 as one of two candidates: the item waits for it), i5's prompt was too long
    first = pd.concat([with_verdicts(generated("i0", ["cut"], ["length"]), [["truncated"]]),
                       with_verdicts(generated("i1", ["a whole text"]), [[]]),
                       with_verdicts(generated("i2", ["a whole text"]), [["keyword"]]),
                       with_verdicts(generated("i3", ["whole", "cut"], ["stop", "length"]), [[], ["truncated"]]),
                       with_verdicts(generated("i4", ["a whole text"]), [[]])], ignore_index=True)
    retried = with_verdicts(generated("i0", ["grown whole text"], attempt=2) +
                            generated("i3", ["grown", "grown too"], attempt=2), [[], [], []])
    assert final_after_first_pass(first) == {"i1", "i2", "i4"}

    job = JobSpec.model_validate({"input": {"path": "x.csv"}, "prompt": {"template": "{{ name }}"},
                                  "output": {"dir": str(tmp_path / "out")}})
    too_long = Rejection("i5", 7, "prompt", ["prompt_too_long"], "too long", {"name": "name 5", "feature": "feature"})
    prompts = SimpleNamespace(built=SimpleNamespace(rejected=[too_long]), seconds=0.5, model=None)
    window = Window(index=1, label="w1", items=items, columns=COLUMNS, inputs=frame_input_codec(items, COLUMNS, []))
    validated = [Validated(first, {"results": []}, 0.1), Validated(retried, {"results": []}, 0.1)]

    def staged(early: bool) -> tuple[Publication, list]:
        publication = Publication.open(tmp_path / f"out-{early}", jsonl=True)
        before = stage_first_pass_task.fn(job, publication, window, validated[0],
                                            final_after_first_pass(first)) if early else None
        last = stage_window_task.fn(job, publication, window, prompts, [EngineStats(fresh_output_tokens=7)], validated, before)
        return publication, [before, last]

    whole, (_, whole_tally) = staged(early=False)
    publication, (early, last) = staged(early=True)
    assert early.item_ids == {"i1", "i2", "i4"} and early.items == 3
    assert last.items == 3 and whole_tally.items == 6
    assert publication.totals.tally == whole.totals.tally  # the same counts, summed over the two pieces
    assert publication.totals.engine.fresh_output_tokens == 7 and len(publication.totals.validation) == 2

    for pub in (whole, publication):
        pub.seal(Manifest(job="early"), [])
    accepted = pq.read_table(publication.staging / RESULTS).to_pandas()
    rejected = pq.read_table(publication.staging / REJECTED).to_pandas()
    attempts = pq.read_table(publication.staging / ATTEMPTS).to_pandas()
    assert list(accepted["item_id"]) == ["i1", "i4", "i0", "i3"]  # the early piece's first
    assert list(rejected["item_id"]) == ["i2", "i5"]
    assert sorted(zip(attempts["item_id"], attempts["attempt"], attempts["candidate"])) == sorted(
        zip(pq.read_table(whole.staging / ATTEMPTS).to_pandas()["item_id"],
            pq.read_table(whole.staging / ATTEMPTS).to_pandas()["attempt"],
            pq.read_table(whole.staging / ATTEMPTS).to_pandas()["candidate"]))
    assert len(attempts) == len(first) + len(retried)
    check_published_once(publication.staging, 6)
    publication.discard()
    whole.discard()
