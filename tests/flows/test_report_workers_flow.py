"""The flow with worker processes, as on a GPU host: GX validation in validation workers, the publish step's Data
Docs asked of a report worker before the tables are sealed and the charts of the others. The run publishes what a
run without workers does, and the report and Data Docs that `batchgen report` rebuilds."""

from __future__ import annotations

import pandas as pd

import batchgen.report.worker as worker_module
from batchgen.job import job_from_dict
from batchgen.publish import current_publication
from batchgen.report.read import table_figures
from tests.conftest import product_job
from tests.e2e.report_checks import check_report_rebuilds_the_same
from tests.flows.test_batch_generation_flow import stand_in  # noqa: F401  (fixture)
from tests.unit.batchgen.report.test_worker import site


def test_a_run_with_report_workers_publishes_the_report_batchgen_report_rebuilds(tmp_path, monkeypatch,
                                                                                   prefect_server, stand_in):  # noqa: F811
    import tasks.publish
    from flows.batch_generation import batch_generation

    monkeypatch.setattr(worker_module, "_workers", [])
    monkeypatch.setattr(tasks.publish, "charts_apart", lambda: True)  # as where the engine runs on a GPU
    workers = worker_module.start_workers(2)
    try:
        assert [w.data_docs for w in workers] == [True, False]
        assert all(w.ready.wait(timeout=120) for w in workers), "the report workers never got ready"
        asked = []
        original = tasks.publish.start_data_docs

        def start_data_docs(*args):
            asked.append(original(*args))
            return asked[-1]

        monkeypatch.setattr(tasks.publish, "start_data_docs", start_data_docs)
        charts, figures = [], []
        start_charts = tasks.publish.start_charts

        def spied_charts(run_dir, staged, *args):
            figures.append(staged)
            charts.append(start_charts(run_dir, staged, *args))
            return charts[-1]

        monkeypatch.setattr(tasks.publish, "start_charts", spied_charts)
        job = job_from_dict(product_job(tmp_path, 12, expectations={"keyword_column": None},
                                        retry={"max_passes": 1}, window_size=4))
        manifest = batch_generation(job)
        assert manifest.counts.items == 12
        assert len(asked) == 1 and asked[0] is not None and asked[0][0] is workers[0]  # the docs worker took them
        # the other worker was asked for every chart before the seal, from the figures the three windows added up:
        # those of the sealed tables
        assert [(w, which) for w, which, _ in charts[0]] == [(workers[1], [0, 1, 2, 3])]
        published = current_publication(tmp_path / "out")
        sealed = table_figures(published)
        for staged, read in ((figures[0].finish_table(), sealed.finish_table()),
                             (figures[0].lengths_frame(), sealed.lengths_frame()),
                             (figures[0].chunks_frame(None), sealed.chunks_frame(None))):
            pd.testing.assert_frame_equal(staged, read)
        assert len(site(published)) >= 3
        check_report_rebuilds_the_same(published, tmp_path)
    finally:
        for w in workers:
            w.close()
            w.process.wait(timeout=30)


def test_a_run_validated_by_workers_publishes_what_a_run_validated_in_process_does(tmp_path, monkeypatch,
                                                                                     prefect_server, stand_in):  # noqa: F811
    import pyarrow.parquet as pq

    import expectations.workers as validation
    import flows.batch_generation as flow_module
    from batchgen.publish import ATTEMPTS, REJECTED, RESULTS

    def run(name: str) -> dict:
        job = job_from_dict(product_job(tmp_path / name, 24, retry={"max_passes": 1}, window_size=8,
                                        windows_in_flight=2))
        assert flow_module.batch_generation(job).counts.items == 24
        published = current_publication(tmp_path / name / "out")
        tables = {}
        for table in (RESULTS, REJECTED, ATTEMPTS):
            frame = pq.read_table(published / table).to_pandas()
            # what differs between any two runs: the engine's request ids, times
            frame = frame.drop(columns=[c for c in frame.columns
                                        if c.endswith(("_at", "seconds")) or c == "request_id"])
            tables[table] = frame.sort_values([c for c in ("item_id", "candidate", "attempt") if c in frame.columns],
                                              ignore_index=True)
        return tables

    monkeypatch.setattr(validation, "_validators", [])
    here = run("in-process")
    served = []
    original = validation.validate_in_worker
    monkeypatch.setattr(validation, "validate_in_worker", lambda *a: served.append(original(*a)) or served[-1])
    monkeypatch.setattr(flow_module, "validation_workers", lambda in_flight: in_flight)  # as on an accelerator
    started = validation.start_validation_workers(2)
    try:
        assert all(w.ready.wait(timeout=180) for w in started), "the validation workers never got ready"
        there = run("workers")
        # validations ran in the workers; one that found both busy ran in-process, as it should (how many did
        # depends on the machine's load: 4 of 6 on a busy CI run), and the workers are still there after the run
        assert any(answer is not None for answer in served), served
        assert all(w.process.poll() is None for w in started), "a validation worker died during the run"
        for table, frame in here.items():
            assert list(frame.columns) == list(there[table].columns), table
            differ = [c for c in frame.columns if not frame[c].equals(there[table][c])]
            assert not differ, (table, differ)
    finally:
        for w in started:
            w.close()
            w.process.wait(timeout=30)
