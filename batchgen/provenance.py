"""What makes a run reproducible, for its manifest: the prompt's text, the input file, the model's files, the
software and device, and the source's git commit.

Large files are hashed once: a streamed SHA-256, kept in `BATCHGEN_CACHE/hashes.json` under the file's path,
size and modification time (a model of several GB is not read again by every run, and a changed file is).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from batchgen.files import sha256_of, write_text
from batchgen.job import JobSpec

HASHES = "hashes.json"
_MEMORY: dict[str, str] = {}


def text_sha256(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def _hash_cache() -> Path:
    from batchgen.models import cache_dir

    return cache_dir() / HASHES


def file_sha256(path: str | Path, cache: bool = True) -> str:
    """The file's SHA-256, streamed; remembered by (path, size, mtime) in this process and in BATCHGEN_CACHE."""
    path = Path(path).resolve()
    stat = path.stat()
    key = f"{path}:{stat.st_size}:{stat.st_mtime_ns}"
    if key in _MEMORY:
        return _MEMORY[key]
    store = _hash_cache() if cache else None
    if store is not None and store.is_file():
        try:
            known = json.loads(store.read_text(encoding="utf-8"))
            if isinstance(known, dict) and isinstance(known.get(key), str):
                _MEMORY[key] = known[key]
                return known[key]
        except (OSError, ValueError):
            pass  # an unreadable cache is rebuilt
    value = sha256_of(path)
    _MEMORY[key] = value
    if store is not None:
        _remember(store, key, value)
    return value


def _remember(store: Path, key: str, value: str) -> None:
    """Add one hash to the cache file (locked, written to a temporary file and renamed); a cache that cannot be
    written is only a lost shortcut."""
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        with open(store.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                known = json.loads(store.read_text(encoding="utf-8")) if store.is_file() else {}
            except (OSError, ValueError):
                known = {}
            if not isinstance(known, dict):
                known = {}
            # entries of files that changed since are dropped: one entry per path
            path = key.rsplit(":", 2)[0]
            known = {k: v for k, v in known.items() if k.rsplit(":", 2)[0] != path}
            known[key] = value
            write_text(json.dumps(known, indent=0, sort_keys=True), store)
    except OSError:
        pass


def folder_sha256(folder: str | Path) -> tuple[str, dict[str, str]]:
    """One SHA-256 over a folder's files (relative path and SHA-256 of each, sorted), and the files' own hashes."""
    root = Path(folder)
    files = {path.relative_to(root).as_posix(): file_sha256(path)
             for path in sorted(root.rglob("*")) if path.is_file() and not path.name.startswith(".")}
    digest = hashlib.sha256("".join(f"{name}\0{sha}\n" for name, sha in files.items()).encode("utf-8"))
    return digest.hexdigest(), files


def prompt_provenance(job: JobSpec) -> dict[str, Any]:
    """The prompt as the job wrote it: template and system prompt, text and SHA-256."""
    prompt = job.prompt
    return {
        "style": prompt.style,
        "template": prompt.template,
        "template_sha256": text_sha256(prompt.template),
        "system": prompt.system,
        "system_sha256": text_sha256(prompt.system),
        "messages_column": prompt.messages_column,
    }


def input_provenance(job: JobSpec, rows: int) -> dict[str, Any]:
    """The input file: path, size, SHA-256, and the rows this run read from it (after `input.limit`)."""
    path = Path(job.input.path)
    facts: dict[str, Any] = {"path": str(path), "rows_read": rows}
    try:
        facts.update(size_bytes=path.stat().st_size, sha256=file_sha256(path))
    except OSError as exc:  # e.g. removed since it was read: the run's data are still what it read
        facts.update(size_bytes=None, sha256=None, error=f"{type(exc).__name__}: {exc.strerror or exc}")
    return facts


def _distribution_of(module: str) -> dict[str, str] | None:
    """The installed distribution that provides `module`: the one of the module's own name first (one lookup),
    else a scan of every installed package's files (over a second with a few hundred packages)."""
    try:
        found = metadata.distribution(module)
        return {"name": found.metadata["Name"], "version": found.version}
    except metadata.PackageNotFoundError:
        pass
    for name in metadata.packages_distributions().get(module, []):
        try:
            return {"name": name, "version": metadata.version(name)}
        except metadata.PackageNotFoundError:
            continue
    return None


def _hub_revision(repo_id: str, revision: str | None) -> str | None:
    """The commit of the hub snapshot this machine has of `repo_id` (no network)."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True)).name
    except Exception:  # not in the local cache, or huggingface_hub refuses: unknown, not a failure of the run
        return None


def model_provenance(job: JobSpec, model: dict[str, Any]) -> dict[str, Any]:
    """Where the model's weights come from, by hash: the folder vLLM loaded, and the package or hub revision."""
    from batchgen.models import DEFAULT_PACKAGE, embedded_gguf

    facts: dict[str, Any] = {}
    path = Path(model.get("path") or "")
    if job.engine.model is None:
        facts["source"] = "package"
        facts["package"] = _distribution_of(DEFAULT_PACKAGE) or {"name": DEFAULT_PACKAGE, "version": None}
        try:
            gguf = embedded_gguf()
            facts["package_file"] = {"name": gguf.name, "size_bytes": gguf.stat().st_size,
                                     "sha256": file_sha256(gguf)}
        except Exception as exc:  # noqa: BLE001  (the package went away after the run loaded its model)
            facts["package_file"] = {"error": str(exc)}
    elif path.is_dir():
        facts["source"] = "folder"
    else:
        facts["source"] = "hub"
        revision = job.engine.extra_args.get("revision")
        facts["hub"] = {"repo_id": job.engine.model, "revision_requested": revision,
                        "revision": _hub_revision(job.engine.model, revision)}
        try:
            from huggingface_hub import snapshot_download

            path = Path(snapshot_download(job.engine.model, revision=revision, local_files_only=True))
        except Exception:
            path = Path("")
    if path.is_dir() and str(path) != ".":
        digest, files = folder_sha256(path)
        facts["files_sha256"] = digest
        facts["files"] = files
    return facts


def _git(folder: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_provenance(folder: str | Path) -> dict[str, Any] | None:
    """The commit of the git checkout holding `folder`, and whether tracked files differ from it; None outside git."""
    folder = Path(folder)
    commit = _git(folder, "rev-parse", "HEAD")
    if not commit:
        return None
    status = _git(folder, "status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status), "root": _git(folder, "rev-parse", "--show-toplevel")}


def device_provenance() -> dict[str, Any]:
    """torch and CUDA versions, and the device the engine ran on (GPU names, else the CPU's model name)."""
    facts: dict[str, Any] = {"platform": platform.platform(), "processor": platform.machine()}
    try:
        import torch

        facts["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            facts["device"] = "cuda"
            facts["device_names"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            return facts
    except Exception:  # noqa: BLE001  (no torch: the manifest still says what it knows)
        pass
    facts["device"] = "cpu"
    try:
        names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo", encoding="utf-8")
                 if line.startswith("model name")]
        facts["device_names"] = sorted(set(names)) or [platform.processor() or platform.machine()]
        facts["cpu_count"] = os.cpu_count()
    except OSError:
        facts["device_names"] = [platform.processor() or platform.machine()]
    return facts


def engine_provenance(job: JobSpec, engine_args: dict[str, Any]) -> dict[str, Any]:
    """The dtype and context length vLLM used, read from the engine's own model config when this process ran it."""
    from batchgen.engine import loaded_engine

    engine = loaded_engine(job.engine)
    facts: dict[str, Any] = {"dtype_requested": job.engine.dtype, "dtype_passed": engine_args.get("dtype")}
    if engine is None:  # nothing was generated in this process (every result reused)
        facts.update(dtype=None, note="no engine ran in this run; every result was reused")
        return facts
    facts.update(dtype=engine.dtype, max_model_len=int(engine.max_model_len), load_seconds=round(engine.load_seconds, 3))
    return facts
