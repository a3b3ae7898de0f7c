"""Publishing to shared storage: a real S3-compatible server (moto in server mode) on loopback, real Parquet."""

from __future__ import annotations

from pathlib import Path

import boto3
import pyarrow.parquet as pq
import pytest

from batchgen.assemble import LostItemsError, assemble
from batchgen.job import job_from_dict, parse_overrides
from batchgen.publish import ATTEMPTS, REJECTED, RESULTS, current_publication
from batchgen.remote import RemoteError, read_current, read_current_record, read_publication, upload_publication
from batchgen.retry import latest_attempts
from batchgen.shards import shard_dir, shard_url
from tests.frames import COLUMNS, make_items, publish_shard, with_verdicts
from tests.jobs import job_publishing_to
from tests.publications import generated, merge, stage_frames
from tests.servers import moto_s3

BUCKET = "batchgen-shared"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on a free loopback port (AWS_* set for pyarrow and boto3); a boto3 client on it."""
    with moto_s3(tmp_path_factory.mktemp("moto") / "server.log", (BUCKET,)) as endpoint:
        yield boto3.client("s3", endpoint_url=endpoint)


def _publish(out: Path, names: list[str], extra: str | None = None) -> Path:
    """A real committed publication (results, rejected, attempts, validation, manifest) of the given items."""
    items = make_items([(f"p{i}", name, "quiet") for i, name in enumerate(names, 1)])
    attempts = with_verdicts([row for i, name in enumerate(names, 1)
                              for row in generated(f"p{i}", [f"{name} is quiet.", "short"])],
                             [[], ["length"]] * len(names))
    result = assemble(items, COLUMNS, [], latest_attempts(attempts))
    publication = stage_frames(out, result.accepted, result.rejected, attempts, [{"success": True}],
                               {"job": "remote", "counts": {"items": len(names), "accepted": len(result.accepted)}})
    if extra:
        (publication.staging / "report.html").write_text(extra, encoding="utf-8")
        (publication.staging / "data_docs").mkdir()
        (publication.staging / "data_docs" / "index.html").write_text(extra, encoding="utf-8")
    return publication.commit()


def _keys(client, prefix: str) -> set[str]:
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return {item["Key"].removeprefix(prefix) for item in listed.get("Contents", [])}


def test_publication_round_trips_through_s3(s3, tmp_path):
    url = f"s3://{BUCKET}/round-trip"
    local = _publish(tmp_path / "out", ["Aurora Mug", "耳机", "Trail Boots"], extra="<html>report</html>")
    record = upload_publication(local, url)

    assert record["publication"] == local.name
    assert read_current_record(url) == record
    assert {RESULTS, REJECTED, ATTEMPTS, "jsonl/accepted.jsonl", "validation.json", "README.md",
            "manifest.json", "report.html", "data_docs/index.html"} <= _keys(s3, f"round-trip/publications/{local.name}/")
    manifest, tables = read_current(url)
    assert manifest["publication"] == local.name
    assert set(tables) == {RESULTS, REJECTED, ATTEMPTS}
    for name, table in tables.items():
        assert table.equals(pq.read_table(local / name)), name
    assert sorted(tables[RESULTS].column("item_id").to_pylist()) == ["p1", "p2", "p3"]
    assert "耳机 is quiet." in tables[RESULTS].column("text").to_pylist()


def test_second_publication_switches_current_and_keeps_the_first(s3, tmp_path):
    url = f"s3://{BUCKET}/two-runs/"
    first = _publish(tmp_path / "out", ["Aurora Mug"])
    upload_publication(first, url)
    second = _publish(tmp_path / "out", ["Aurora Mug", "Trail Boots"])
    upload_publication(second, url)

    manifest, tables = read_current(url)
    assert manifest["publication"] == second.name == current_publication(tmp_path / "out").name
    assert tables[RESULTS].num_rows == 2
    old_manifest, old_tables = read_publication(url, first.name)  # still whole, for readers that began on it
    assert old_manifest["publication"] == first.name
    assert old_tables[RESULTS].column("item_id").to_pylist() == ["p1"]


def test_keep_prunes_older_publications_after_the_switch(s3, tmp_path):
    url = f"s3://{BUCKET}/pruned"
    published = [upload_publication(_publish(tmp_path / "out", ["Mug"] * n), url, keep=2)["publication"]
                 for n in (1, 2, 3)]
    remaining = {key.split("/", 1)[0] for key in _keys(s3, "pruned/publications/")} - {""}  # "": a folder marker
    assert remaining == set(published[1:])
    assert read_current(url)[0]["publication"] == published[2]


def test_a_changed_file_at_the_url_is_refused(s3, tmp_path):
    url = f"s3://{BUCKET}/tampered"
    local = _publish(tmp_path / "out", ["Aurora Mug", "Trail Boots"])
    upload_publication(local, url)
    s3.put_object(Bucket=BUCKET, Key=f"tampered/publications/{local.name}/{RESULTS}",
                  Body=(local / REJECTED).read_bytes())
    with pytest.raises(RemoteError, match=f"{local.name}/{RESULTS} does not match its SHA-256"):
        read_current(url)


def test_unknown_bucket_is_named_and_nothing_is_written(s3, tmp_path):
    local = _publish(tmp_path / "out", ["Aurora Mug"])
    with pytest.raises(RemoteError, match="bucket 'no-such-bucket' does not exist"):
        upload_publication(local, "s3://no-such-bucket/x")
    with pytest.raises(RemoteError, match="nothing published yet"):
        read_current(f"s3://{BUCKET}/never-written")


def test_a_local_shared_path_works_the_same_way(tmp_path):
    shared = tmp_path / "mounted" / "datasets"
    local = _publish(tmp_path / "out", ["Aurora Mug"], extra="report")
    upload_publication(local, str(shared))
    assert (shared / "current.json").is_file()
    assert not [p for p in shared.iterdir() if p.name.endswith(".tmp")]
    manifest, tables = read_current(str(shared))
    assert manifest["publication"] == local.name
    assert tables[RESULTS].equals(pq.read_table(local / RESULTS))


def test_publish_to_is_optional_and_a_relative_path_resolves_against_the_job(tmp_path):
    assert job_from_dict(job_publishing_to(tmp_path, None)).output.publish_to is None
    assert job_from_dict(job_publishing_to(tmp_path, "s3://bucket/p")).output.publish_to == "s3://bucket/p"
    job = job_from_dict(job_publishing_to(tmp_path, "shared/datasets"), base_dir=tmp_path)
    assert job.output.publish_to == str((tmp_path / "shared" / "datasets").resolve())


def test_shards_switch_publish_to_off_with_an_override(tmp_path):
    """Without publish_to the sharded flow passes each shard this override (with it, the shard's own URL)."""
    job = job_from_dict(job_publishing_to(tmp_path, "s3://bucket/p"),
                        overrides=parse_overrides(["output.publish_to=null"]))
    assert job.output.publish_to is None


def test_merge_reads_shard_publications_from_the_bucket(s3, tmp_path):
    """Sharded runs with output.publish_to: each worker's shard is read back from <url>/shards/, not a shared folder."""
    url = f"s3://{BUCKET}/sharded"
    urls = [shard_url(url, i, 2) for i in range(2)]
    worker_a, worker_b = tmp_path / "machine-a" / "out", tmp_path / "machine-b" / "out"
    publish_shard(worker_a, 0, 2, ["a", "b"], ["c"])
    upload_publication(current_publication(shard_dir(worker_a, 0, 2)), urls[0])
    merger = tmp_path / "machine-c" / "out"
    elsewhere = [shard_dir(merger, i, 2) for i in range(2)]  # never written: the merge must not need them
    with pytest.raises(RemoteError, match="shards/2-of-2: nothing published yet"):
        merge(merger, elsewhere, ["a", "b", "c", "d"], {"job": "merged"}, jsonl=False, shard_urls=urls)

    publish_shard(worker_b, 1, 2, ["d"], [])
    upload_publication(current_publication(shard_dir(worker_b, 1, 2)), urls[1])
    written, staging = merge(merger, elsewhere, ["a", "b", "c", "d"], {"job": "merged"}, jsonl=False,
                                    shard_urls=urls)
    staging.commit()
    assert written["counts"]["items"] == 4 and written["counts"]["accepted"] == 3
    assert [s["flow_run_id"] for s in written["shards"]] == ["run-0", "run-1"]
    assert sorted(pq.read_table(current_publication(merger) / RESULTS).column("item_id").to_pylist()) == ["a", "b", "d"]
    assert not any(path.exists() for path in elsewhere)
    with pytest.raises(LostItemsError, match="1 items missing"):
        merge(merger, elsewhere, ["a", "b", "c", "d", "e"], {}, jsonl=False, shard_urls=urls)
