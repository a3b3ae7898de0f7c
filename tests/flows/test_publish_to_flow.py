"""`output.publish_to` through the real flow: a run under a real Prefect server (stand-in engine) publishes
locally and to moto's S3 server on loopback; readers of the bucket get the same dataset."""

from __future__ import annotations

import boto3
import pyarrow.parquet as pq
import pytest

from batchgen.job import job_from_dict
from batchgen.remote import RemoteError, read_current
from tests.conftest import product_job
from tests.flows.test_batch_generation_flow import stand_in  # noqa: F401 (the fixture)
from tests.servers import moto_s3

BUCKET = "flow-datasets"


def test_a_run_is_copied_to_the_bucket_with_its_report(tmp_path, prefect_server, stand_in):  # noqa: F811
    from flows.batch_generation import batch_generation

    url = f"s3://{BUCKET}/products"
    with moto_s3(tmp_path / "moto.log", (BUCKET,)) as endpoint:
        job = job_from_dict(product_job(tmp_path, 12, expectations={"keyword_column": None},
                                        output={"publish_to": url}))
        first = batch_generation(job)
        remote_manifest, tables = read_current(url)
        assert remote_manifest == first  # the manifest the run returned, byte for byte the published one
        local = tmp_path / "out" / "current"
        for name in ("accepted/accepted.parquet", "rejected/rejected.parquet", "attempts/attempts.parquet"):
            assert tables[name].equals(pq.read_table(local / name)), name
        assert tables["accepted/accepted.parquet"].num_rows == first["counts"]["accepted"] == 12

        keys = boto3.client("s3", endpoint_url=endpoint).list_objects_v2(Bucket=BUCKET, Prefix="products/")
        names = {item["Key"] for item in keys["Contents"]}
        # the report and Data Docs travel with the data
        # (a second run switching current.json: tests/unit/batchgen/test_remote.py)
        assert f"products/publications/{first['publication']}/report.html" in names
        assert f"products/publications/{first['publication']}/data_docs/index.html" in names


def test_a_missing_bucket_fails_the_run_after_the_local_publication(tmp_path, prefect_server, stand_in):  # noqa: F811
    from flows.batch_generation import batch_generation

    with moto_s3(tmp_path / "moto.log"):
        job = job_from_dict(product_job(tmp_path, 4, expectations={"keyword_column": None},
                                        output={"publish_to": "s3://not-created/products"}))
        with pytest.raises(RemoteError, match="bucket 'not-created' does not exist"):
            batch_generation.with_options(retries=0)(job)
    assert (tmp_path / "out" / "current" / "manifest.json").is_file()  # readers of output.dir are served


def test_sharded_run_publishes_shards_and_the_merge_through_the_bucket(tmp_path, prefect_server, stand_in,  # noqa: F811
                                                                       monkeypatch):
    """The sharded flow's wiring: shard runs (here in-process instead of on workers) get their own URL, the merge
    reads them from the bucket and switches the top-level current.json; no shard touches it."""
    import uuid

    from prefect.states import Completed

    import flows.sharded_batch_generation as sharded
    from batchgen.remote import read_current_record
    from flows.batch_generation import batch_generation

    shard_runs = []

    def run_here(name, parameters, **_):
        shard_runs.append(parameters)
        batch_generation.with_options(retries=0)(**parameters)
        return type("Run", (), {"state": Completed(), "name": f"local-{len(shard_runs)}", "id": uuid.uuid4()})()

    monkeypatch.setattr(sharded, "run_deployment", run_here)
    from transformers import AutoConfig, AutoTokenizer  # noqa: F401 (imported once here, not by two shard threads at once)

    url = f"s3://{BUCKET}/sharded"
    with moto_s3(tmp_path / "moto.log", (BUCKET,)):
        job = job_from_dict(product_job(tmp_path, 10, expectations={"keyword_column": None},
                                        output={"publish_to": url}))
        merged = sharded.sharded_batch_generation(job, shards=2)
        assert len(shard_runs) == 2  # one run per shard, none retried
        assert sorted(p["overrides"][-1] for p in shard_runs) == [f"output.publish_to={url}/shards/1-of-2",
                                                                  f"output.publish_to={url}/shards/2-of-2"]
        shard_counts = [read_current(f"{url}/shards/{i}-of-2")[0]["counts"]["items"] for i in (1, 2)]
        assert sum(shard_counts) == 10 and all(shard_counts)
        manifest, tables = read_current(url)
        assert manifest == merged and read_current_record(url)["publication"] == merged["publication"]
        assert sorted(tables["accepted/accepted.parquet"].column("item_id").to_pylist()) == \
            sorted(f"p{i:05d}" for i in range(1, 11))
