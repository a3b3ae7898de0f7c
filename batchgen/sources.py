"""Where the input's rows come from: `input.path` as one file or many, local or in an object store.

`input.path` may be
- a file (CSV, JSONL, JSON array, Parquet);
- a folder of Parquet files (read in sorted order, subfolders too, as a partitioned dataset is written;
  files whose names start with `.` or `_` are skipped, as pyarrow does);
- a glob (`data/part-*.parquet`, `shards/**/*.jsonl`), the matching files in sorted order;
- a folder written by `datasets.Dataset.save_to_disk` (its Arrow files, read with pyarrow);
- any of these at an `s3://`, `gs://` (or `hdfs://`, `abfs://`, `file://`) URL, through pyarrow's file
  systems; credentials come from the environment, as for `output.publish_to` (batchgen.remote).
Errors are DataError naming the path: nothing there, nothing matching, a folder holding no table.
"""

from __future__ import annotations

import fnmatch
import glob
import io
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.fs as pafs

SUFFIX_FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet",
                  ".pq": "parquet"}
FORMATS = ("csv", "jsonl", "json", "parquet")
SAVED = "arrow"  # the format of a datasets.save_to_disk folder
_GLOB = set("*?[")


class SourceError(ValueError):
    """An input path that names no readable table (items.py raises it as DataError)."""


class InputFile:
    """One input file, local or at a URL; str() is the name messages use (the path as the job gives it)."""

    def __init__(self, path: str, filesystem: pafs.FileSystem | None = None, shown: str | None = None):
        self.path, self.filesystem, self.shown = path, filesystem, shown or path

    def __str__(self) -> str:
        return self.shown

    def __repr__(self) -> str:
        return f"InputFile({self.shown!r})"

    @property
    def local(self) -> bool:
        return self.filesystem is None

    def size(self) -> int:
        if self.local:
            return os.stat(self.path).st_size
        return self.filesystem.get_file_info(self.path).size or 0

    def open_binary(self) -> IO[bytes]:
        if self.local:
            return open(self.path, "rb")
        return self.filesystem.open_input_stream(self.path)

    def open_text(self, newline: str) -> IO[str]:
        """UTF-8 text, read as it is parsed (a byte-order mark is accepted and dropped)."""
        if self.local:
            return open(self.path, encoding="utf-8-sig", newline=newline)
        return io.TextIOWrapper(self.open_binary(), encoding="utf-8-sig", newline=newline)

    def open_random(self) -> Any:
        """What pyarrow's readers take: a local path, or a random-access file of the file system."""
        return self.path if self.local else self.filesystem.open_input_file(self.path)


def suffix_format(name: str) -> str | None:
    return SUFFIX_FORMATS.get(Path(name).suffix.lower())


def _visible(name: str) -> bool:
    return not any(part.startswith((".", "_")) for part in Path(name).parts)


def resolve(path: str, fmt: str | None) -> tuple[list[InputFile], str | None]:
    """The files `path` names, in reading order, and their format (None: unknown, the caller says so)."""
    if "://" in path:
        return _resolve_url(path, fmt)
    if _GLOB & set(path):
        return _from_glob(path, sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p)), fmt)
    if os.path.isdir(path):
        return _resolve_folder(path, fmt)
    return [InputFile(path)], fmt or suffix_format(path)


def _from_glob(pattern: str, matches: list[str], fmt: str | None,
               filesystem: pafs.FileSystem | None = None, shown=lambda p: p) -> tuple[list[InputFile], str | None]:
    if not matches:
        raise SourceError(f"{pattern}: no input file matches")
    return [InputFile(p, filesystem, shown(p)) for p in matches], fmt or _one_format(pattern, matches)


def _one_format(where: str, names: list[str]) -> str | None:
    found = {suffix_format(name) for name in names}
    if len(found) > 1:
        kinds = ", ".join(sorted(str(f) for f in found))
        raise SourceError(f"{where}: the files are of different formats ({kinds}); match one kind, "
                          f"or set input.format")
    return found.pop()


def _resolve_folder(path: str, fmt: str | None) -> tuple[list[InputFile], str | None]:
    root = Path(path)
    if (root / "dataset_dict.json").is_file():
        raise SourceError(f"{path}: is a datasets DatasetDict folder (splits: {', '.join(_splits(root))}); "
                          f"set input.path to one split's folder, e.g. {root / _splits(root)[0]}")
    if (root / "state.json").is_file() and (root / "dataset_info.json").is_file():
        return [InputFile(str(root / name)) for name in saved_files(root)], SAVED
    wanted = fmt or "parquet"
    files = [str(root / name) for name in _tables((str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()),
                                                  wanted)]
    if not files:
        raise SourceError(f"{path}: is a directory without {wanted} files (nor a datasets save_to_disk folder); "
                          f"input.path must name a file, a folder of Parquet files or a glob")
    return [InputFile(p) for p in files], wanted


def _splits(root: Path) -> list[str]:
    try:
        return list(json.loads((root / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]) or ["train"]
    except (OSError, ValueError, KeyError, TypeError):
        return ["train"]


def _saved_names(read_state: Callable[[], bytes], where: str) -> list[str]:
    """The Arrow files a save_to_disk folder's state.json lists, in order."""
    try:
        return [entry["filename"] for entry in json.loads(read_state())["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SourceError(f"{where}: state.json of a datasets save_to_disk folder cannot be read: {exc}") from None


def _tables(names: Iterable[str], wanted: str) -> list[str]:
    """The files of a folder (names relative to it) that hold its table: visible ones of the wanted format, sorted."""
    return sorted(name for name in names if _visible(name) and suffix_format(name) == wanted)


def saved_files(root: Path) -> list[str]:
    """The Arrow files of a save_to_disk folder, in order (its state.json lists them)."""
    names = _saved_names((root / "state.json").read_bytes, str(root))
    missing = [name for name in names if not (root / name).is_file()]
    if missing or not names:
        raise SourceError(f"{root}: the save_to_disk folder lacks its data files ({', '.join(missing) or 'none'})")
    return names


def _resolve_url(url: str, fmt: str | None) -> tuple[list[InputFile], str | None]:
    from batchgen.remote import RemoteError, open_url, read_bytes
    from batchgen.urls import masked

    shown = masked(url)
    scheme = url.split("://", 1)[0]
    try:
        filesystem, root = open_url(url)
    except (ValueError, RemoteError) as exc:
        raise SourceError(f"{shown}: {exc}" if shown not in str(exc) else str(exc)) from None

    def name(path: str) -> str:
        return f"{scheme}://{path}"

    try:
        if _GLOB & set(root):
            base = root[:min(root.index(c) for c in _GLOB if c in root)].rsplit("/", 1)[0]
            infos = filesystem.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
            matches = sorted(i.path for i in infos if i.type == pafs.FileType.File and fnmatch.fnmatchcase(i.path, root))
            return _from_glob(shown, matches, fmt, filesystem, name)
        info = filesystem.get_file_info(root)
        if info.type == pafs.FileType.File:
            return [InputFile(root, filesystem, shown)], fmt or suffix_format(root)
        if info.type == pafs.FileType.NotFound:
            raise SourceError(f"{shown}: input file not found")
        infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
    except (OSError, pa.ArrowException) as exc:
        raise SourceError(f"{shown}: cannot be read: {exc}") from None
    names = {i.path[len(root) + 1:]: i for i in infos if i.type == pafs.FileType.File}
    if "state.json" in names and "dataset_info.json" in names:
        saved = _saved_names(lambda: read_bytes(filesystem, f"{root}/state.json"), shown)
        return [InputFile(f"{root}/{file}", filesystem, name(f"{root}/{file}")) for file in saved], SAVED
    wanted = fmt or "parquet"
    files = [f"{root}/{rel}" for rel in _tables(names, wanted)]
    if not files:
        raise SourceError(f"{shown}: holds no {wanted} files (nor a datasets save_to_disk folder)")
    return [InputFile(p, filesystem, name(p)) for p in files], wanted
