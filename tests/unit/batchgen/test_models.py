"""Where the model comes from: folders checked for what vLLM loads, a shared cache readable by every user."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from batchgen import models
from batchgen.models import ModelError, default_model_path, resolve_model


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHGEN_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"1234")
    monkeypatch.setattr(models, "embedded_gguf", lambda: gguf)
    return tmp_path / "cache" / "models" / f"{models.DEFAULT_MODEL}-4"


def test_conversion_leaves_a_folder_every_user_can_read(cache, monkeypatch):
    def convert(gguf, dest):  # stands in for transformers' conversion, into a mkdtemp folder (mode 0700)
        import tempfile

        tmp = Path(tempfile.mkdtemp(dir=dest.parent))
        (tmp / "config.json").write_text("{}")
        models.share(tmp)
        tmp.rename(dest)

    monkeypatch.setattr(models, "_convert", convert)
    dest = default_model_path()
    assert (mode(dest), mode(dest / "config.json")) == (0o755, 0o644)


def test_a_cache_converted_with_mode_0700_is_opened_up_by_its_owner(cache):
    cache.mkdir(parents=True)
    (cache / "config.json").write_text("{}")
    (cache / "config.json").chmod(0o600)
    cache.chmod(0o700)
    assert default_model_path() == cache
    assert (mode(cache), mode(cache / "config.json")) == (0o755, 0o644)


def test_a_cache_this_user_cannot_read_is_a_model_error_saying_what_to_do(cache, monkeypatch):
    def refuse(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "exists", refuse)  # root reads everything: another user's 0700 folder is faked
    with pytest.raises(ModelError, match=r"cannot be used by this user \(Permission denied: .*chmod -R a\+rX"):
        default_model_path()


def test_a_file_is_not_a_model(tmp_path):
    (tmp_path / "weights.gguf").write_bytes(b"x")
    with pytest.raises(ModelError, match="is a file; engine.model names a model folder or a hub id"):
        resolve_model(str(tmp_path / "weights.gguf"))
