"""Shared-storage URLs as a job names them (`output.publish_to`): the rules a usable one follows, and the
form of one that is safe to show (credentials masked). No storage is opened here (that is `remote.py`)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

SCHEMES = {"s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss", "file"}
_SECRET_PARAMS = ("key", "secret", "token", "password", "credential", "signature")


def masked(url: str) -> str:
    """The URL with any user, password and query replaced by ***, fit for a message or a log."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None and not parts.query:
        return url
    host = parts.hostname or ""
    return f"{parts.scheme}://***@{host}{parts.path}" + ("?***" if parts.query else "")


def check_url(url: str) -> str:
    """The URL itself if it is usable as `output.publish_to`; ValueError (without the secret) otherwise."""
    url = url.strip()
    if not url:
        raise ValueError("is empty; give an object-store URL such as s3://bucket/prefix, or remove the field")
    if "://" not in url:
        if not Path(url).is_absolute():
            raise ValueError(f"{url!r} is neither a URL (s3://bucket/prefix) nor an absolute path")
        return url
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{masked(url)}: credentials must not be written into the job file; remove "
                         "'user:password@' and set them in the environment (AWS_ACCESS_KEY_ID and "
                         "AWS_SECRET_ACCESS_KEY for s3://)")
    secret = [name for name, _ in parse_qsl(parts.query) if any(word in name.lower() for word in _SECRET_PARAMS)]
    if secret:
        raise ValueError(f"{masked(url)}: credentials must not be written into the job file; remove "
                         f"{', '.join(sorted(set(secret)))} from the URL and set them in the environment")
    if parts.scheme.lower() not in SCHEMES:
        raise ValueError(f"{url}: unsupported scheme {parts.scheme!r}; use one of "
                         f"{', '.join(sorted(SCHEMES))}, or an absolute path")
    if parts.scheme.lower() in {"s3", "gs", "gcs"} and not parts.netloc:
        raise ValueError(f"{url}: no bucket; expected {parts.scheme}://bucket/prefix")
    return url
