"""Copy committed publications to shared storage (an object store or another path) and read them back.

`output.dir` stays the local working folder and result store; with `output.publish_to` set, each
committed publication is also copied to

    <url>/publications/<id>/     the publication's files, as committed locally (manifest included)
    <url>/current.json           {"publication": <id>, "manifest_sha256": ..., "counts": ...}, written LAST

A single PUT of an object is atomic on S3 (and on GCS), so a reader that reads `current.json` first
only ever sees a publication whose files are all there; on a local or mounted path `current.json`
is replaced with one rename. The URL is opened with pyarrow's own file systems (`s3://`, `gs://`,
`hdfs://`, `abfs://`, `file://`, an absolute path). Credentials are never part of the job: pyarrow
reads them from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
AWS_DEFAULT_REGION, AWS_ENDPOINT_URL for an S3-compatible server, or ~/.aws, or the machine's role).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from batchgen.publish import MANIFEST, PUBLICATIONS, verify_publication
from batchgen.urls import check_url, masked

CURRENT_JSON = "current.json"


class RemoteError(RuntimeError):
    """Shared storage that cannot be written or read, or a publication there that does not verify."""


def open_url(url: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's file system for the URL and the root path inside it (no trailing slash)."""
    check_url(url)
    try:
        filesystem, root = pafs.FileSystem.from_uri(url)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, ValueError) as exc:
        raise RemoteError(f"{masked(url)}: cannot open: {exc}") from None
    return filesystem, root.rstrip("/")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_bytes(filesystem: pafs.FileSystem, path: str) -> bytes:
    """The whole file at `path` of a pyarrow file system."""
    with filesystem.open_input_stream(path) as handle:
        return handle.read()


def _check_root(filesystem: pafs.FileSystem, root: str, url: str) -> None:
    """A missing bucket is named before anything is written; a local root is created."""
    try:
        if isinstance(filesystem, pafs.LocalFileSystem):
            filesystem.create_dir(root, recursive=True)
            return
        bucket = root.split("/", 1)[0]
        if filesystem.get_file_info(bucket).type == pafs.FileType.NotFound:
            raise RemoteError(f"{url}: bucket {bucket!r} does not exist (or these credentials cannot see it); "
                              "create it first")
    except OSError as exc:
        raise RemoteError(f"{url}: cannot reach the storage: {exc}") from None


def _write_current(filesystem: pafs.FileSystem, root: str, data: bytes) -> None:
    target = f"{root}/{CURRENT_JSON}"
    if isinstance(filesystem, pafs.LocalFileSystem):  # a local or mounted path: write aside, then one rename
        tmp = f"{root}/.{CURRENT_JSON}.{uuid.uuid4().hex}.tmp"
        with filesystem.open_output_stream(tmp) as handle:
            handle.write(data)
        filesystem.move(tmp, target)
    else:  # one PUT: readers see the old object or the new one, never a part
        with filesystem.open_output_stream(target) as handle:
            handle.write(data)


def upload_publication(local_dir: Path, url: str, keep: int | None = None) -> dict[str, Any]:
    """Copy a committed publication to `<url>/publications/<id>/`, then point `<url>/current.json` at it.

    The local copy is verified against its manifest first. With `keep`, older publications at the
    URL beyond the newest `keep` are removed after the switch. Returns what current.json holds.
    """
    local_dir = Path(local_dir)
    manifest = verify_publication(local_dir)
    publication = manifest.publication or local_dir.name
    shown = masked(url)
    filesystem, root = open_url(url)
    _check_root(filesystem, root, shown)
    destination = f"{root}/{PUBLICATIONS}/{publication}"
    try:
        pafs.copy_files(str(local_dir.resolve()), destination, source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=filesystem)
    except OSError as exc:
        raise RemoteError(f"{shown}: cannot copy publication {publication}: {exc}") from None
    current = {
        "publication": publication,
        "path": f"{PUBLICATIONS}/{publication}",
        "manifest_sha256": _sha256((local_dir / MANIFEST).read_bytes()),
        "counts": manifest.counts.to_json(),
        "uploaded_at": datetime.now(timezone.utc).isoformat(),
    }
    try:
        _write_current(filesystem, root, json.dumps(current, indent=2).encode("utf-8"))
    except OSError as exc:
        raise RemoteError(f"{shown}: publication {publication} copied, but {CURRENT_JSON} "
                          f"could not be written: {exc}") from None
    if keep is not None:
        _prune(filesystem, root, publication, keep)
    return current


def _prune(filesystem: pafs.FileSystem, root: str, current: str, keep: int) -> None:
    """Remove publications older than the newest `keep` (ids sort by time); never the current one."""
    try:
        infos = filesystem.get_file_info(pafs.FileSelector(f"{root}/{PUBLICATIONS}", allow_not_found=True))
    except OSError:
        return
    names = sorted(info.base_name for info in infos if info.type == pafs.FileType.Directory)
    for name in names[:-max(keep, 1)]:
        if name != current:
            try:
                filesystem.delete_dir(f"{root}/{PUBLICATIONS}/{name}")
            except OSError:
                pass  # a stale copy costs space, not correctness; the next upload tries again


def read_current_record(url: str) -> dict[str, Any]:
    """What `<url>/current.json` holds."""
    filesystem, root = open_url(url)
    try:
        return json.loads(read_bytes(filesystem, f"{root}/{CURRENT_JSON}"))
    except FileNotFoundError:
        raise RemoteError(f"{masked(url)}: nothing published yet (no {CURRENT_JSON})") from None
    except (OSError, ValueError) as exc:
        raise RemoteError(f"{masked(url)}: cannot read {CURRENT_JSON}: {exc}") from None


def read_publication(url: str, publication: str, manifest_sha256: str | None = None,
                     ) -> tuple[dict[str, Any], dict[str, pa.Table]]:
    """The manifest and the Parquet tables of one publication at the URL, each file checked against its SHA-256."""
    manifest, files = read_publication_files(url, publication, manifest_sha256)
    return manifest, {name: pq.read_table(pa.BufferReader(data)) for name, data in files.items()
                      if name.endswith(".parquet")}


def _read_file(filesystem: pafs.FileSystem, base: str, publication: str, name: str, shown: str, missing: str,
               ) -> bytes:
    """The bytes of one file of a publication at the URL; RemoteError `missing` when it is not there."""
    try:
        return read_bytes(filesystem, f"{base}/{name}")
    except FileNotFoundError:
        raise RemoteError(f"{shown}: {missing}") from None
    except OSError as exc:
        raise RemoteError(f"{shown}: cannot read {publication}/{name}: {exc}") from None


def read_publication_files(url: str, publication: str, manifest_sha256: str | None = None,
                           ) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest and {name: bytes} of every file it lists, each checked against its SHA-256."""
    shown = masked(url)
    filesystem, root = open_url(url)
    base = f"{root}/{PUBLICATIONS}/{publication}"
    raw = _read_file(filesystem, base, publication, MANIFEST, shown,
                     missing=f"publication {publication} has no {MANIFEST}")
    if manifest_sha256 is not None and _sha256(raw) != manifest_sha256:
        raise RemoteError(f"{shown}: {publication}/{MANIFEST} does not match the SHA-256 in {CURRENT_JSON}")
    manifest = json.loads(raw)
    files: dict[str, bytes] = {}
    for name, entry in manifest.get("files", {}).items():
        data = _read_file(filesystem, base, publication, name, shown,
                          missing=f"{publication}/{name} is listed in the manifest but missing")
        if _sha256(data) != entry["sha256"]:
            raise RemoteError(f"{shown}: {publication}/{name} does not match its SHA-256 in the manifest")
        files[name] = data
    return manifest, files


def read_current(url: str) -> tuple[dict[str, Any], dict[str, pa.Table]]:
    """The current publication at the URL: its manifest and {file name: table} for each Parquet file, verified."""
    record = read_current_record(url)
    return read_publication(url, record["publication"], record.get("manifest_sha256"))


def read_current_files(url: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The current publication at the URL: its manifest and {file name: bytes}, verified."""
    record = read_current_record(url)
    return read_publication_files(url, record["publication"], record.get("manifest_sha256"))
