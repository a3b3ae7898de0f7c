"""Shared-storage URLs as a job names them (batchgen.urls): the rules of output.publish_to, secrets never shown."""

from __future__ import annotations

import pytest

from batchgen.job import JobError, job_from_dict
from batchgen.urls import masked
from tests.jobs import job_publishing_to


@pytest.mark.parametrize("url, leaked", [
    ("s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/prefix", "wJalrXUtnFEMI"),
    ("s3://bucket/prefix?access_key=AKIAEXAMPLE&secret_key=wJalrXUtnFEMI", "wJalrXUtnFEMI"),
])
def test_credentials_in_the_url_are_refused_without_echoing_them(tmp_path, url, leaked):
    with pytest.raises(JobError, match="output.publish_to: .*credentials must not be written into the job") as err:
        job_from_dict(job_publishing_to(tmp_path, url))
    assert leaked not in str(err.value)


@pytest.mark.parametrize("url, expected", [
    ("ftp://host/x", "unsupported scheme 'ftp'"),
    ("s3:///prefix", "no bucket"),
    ("", "is empty"),
])
def test_unusable_urls_are_refused_naming_the_field(tmp_path, url, expected):
    with pytest.raises(JobError, match=f"output.publish_to: .*{expected}"):
        job_from_dict(job_publishing_to(tmp_path, url))


@pytest.mark.parametrize("url, shown", [
    ("s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/prefix", "s3://***@bucket/prefix"),
    ("s3://bucket/prefix?access_key=AKIAEXAMPLE&secret_key=wJalrXUtnFEMI", "s3://***@bucket/prefix?***"),
    ("gs://bucket/prefix", "gs://bucket/prefix"),
])
def test_a_url_in_a_message_hides_its_user_password_and_query(url, shown):
    assert masked(url) == shown
