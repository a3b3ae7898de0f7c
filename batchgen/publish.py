"""The one writer of the dataset: explicit schemas, temporary names then rename, manifest last.

A reader who opens `manifest.json` first and then the files it lists sees one complete
publication: the manifest is replaced last and records each file's SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from batchgen.schema import accepted_schema, attempts_schema, input_type, rejected_schema
from batchgen.store import write_atomic

RESULTS = "results.parquet"
REJECTED = "rejected.parquet"
ATTEMPTS = "attempts.parquet"
VALIDATION = "validation.json"
MANIFEST = "manifest.json"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_text_atomic(text: str, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _jsonl(table: pa.Table) -> str:
    return "".join(json.dumps(row, ensure_ascii=False, default=str) + "\n" for row in table.to_pylist())


def to_table(frame: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    records = frame[schema.names].astype(object).where(frame[schema.names].notna(), None).to_dict(orient="records")
    return pa.Table.from_pylist(records, schema=schema)


def publish(
    out_dir: Path,
    accepted: pd.DataFrame,
    rejected: pd.DataFrame,
    attempts: pd.DataFrame,
    validation: list[dict[str, Any]],
    manifest: dict[str, Any],
    jsonl: bool,
) -> dict[str, Any]:
    """Write the publication; returns the manifest as written (with file names, rows and hashes)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    struct = input_type(list(accepted["input"]) + list(rejected["input"]))
    tables = {
        RESULTS: to_table(accepted, accepted_schema(struct)),
        REJECTED: to_table(rejected, rejected_schema(struct)),
        ATTEMPTS: to_table(attempts, attempts_schema()),
    }
    files: dict[str, dict[str, Any]] = {}
    for name, table in tables.items():
        path = out_dir / name
        write_atomic(table, path)
        files[name] = {"rows": table.num_rows, "sha256": _sha256(path)}
        if jsonl:
            mirror = path.with_suffix(".jsonl")
            write_text_atomic(_jsonl(table), mirror)
            files[mirror.name] = {"rows": table.num_rows, "sha256": _sha256(mirror)}
    write_text_atomic(json.dumps(validation, ensure_ascii=False, indent=1, default=str), out_dir / VALIDATION)
    files[VALIDATION] = {"sha256": _sha256(out_dir / VALIDATION)}
    manifest = {**manifest, "files": files}
    write_text_atomic(json.dumps(manifest, ensure_ascii=False, indent=2, default=str), out_dir / MANIFEST)
    return manifest
