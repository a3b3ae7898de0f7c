"""The publish step with report workers, as on a GPU host: the Data Docs asked of a worker before the tables are
sealed, the charts of the others; the publication's report and Data Docs are what `batchgen report` rebuilds."""

from __future__ import annotations

import shutil

import batchgen.report.worker as worker_module
from batchgen.job import job_from_dict
from batchgen.publish import current_publication
from batchgen.report import REPORT, write_report
from tests.conftest import product_job
from tests.flows.test_batch_generation_flow import stand_in  # noqa: F401  (fixture)
from tests.unit.batchgen.report.test_worker import site, without_ids


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
        job = job_from_dict(product_job(tmp_path, 12, expectations={"keyword_column": None},
                                        retry={"max_passes": 1}))
        manifest = batch_generation(job)
        assert manifest.counts.items == 12
        assert len(asked) == 1 and asked[0] is not None and asked[0][0] is workers[0]  # the docs worker took them
        published = current_publication(tmp_path / "out")
        rebuilt = tmp_path / "rebuilt"
        shutil.copytree(published, rebuilt)
        monkeypatch.setattr(worker_module, "_workers", [])  # in-process, as `batchgen report` does it
        write_report(rebuilt)
        assert site(published) == site(rebuilt) and len(site(published)) >= 3
        assert (without_ids((published / REPORT).read_text(encoding="utf-8"))
                == without_ids((rebuilt / REPORT).read_text(encoding="utf-8")))
    finally:
        for w in workers:
            w.close()
            w.process.wait(timeout=30)
