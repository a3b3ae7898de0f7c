"""Atomic replacement of a file: a reader sees the old file or the whole new one; hashes read in blocks."""

from __future__ import annotations

import hashlib
import os

import pytest

from batchgen.files import replaced, sha256_of, write_text


def test_replaced_puts_the_new_file_in_place_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text("old", encoding="utf-8")

    with replaced(path) as tmp:
        assert tmp.parent == path.parent and tmp != path
        tmp.write_text("new", encoding="utf-8")
        assert path.read_text(encoding="utf-8") == "old"  # not visible until the block ends

    assert path.read_text(encoding="utf-8") == "new"
    assert os.listdir(tmp_path) == ["manifest.json"]


def test_an_error_while_writing_leaves_the_old_file_and_no_temporary_file(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text("old", encoding="utf-8")

    with pytest.raises(RuntimeError, match="disk gone"):
        with replaced(path) as tmp:
            tmp.write_text("half", encoding="utf-8")
            raise RuntimeError("disk gone")

    assert path.read_text(encoding="utf-8") == "old"
    assert os.listdir(tmp_path) == ["manifest.json"]


def test_replaced_swaps_a_symlink_in_one_step(tmp_path):
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    current = tmp_path / "current"
    current.symlink_to("v1")

    with replaced(current) as tmp:
        tmp.symlink_to("v2")

    assert os.readlink(current) == "v2"
    assert sorted(os.listdir(tmp_path)) == ["current", "v1", "v2"]


def test_write_text_creates_or_replaces_a_utf8_file(tmp_path):
    path = tmp_path / "summary.md"
    write_text("耳机 first", path)
    write_text("耳机 second", path)
    assert path.read_bytes() == "耳机 second".encode()
    assert os.listdir(tmp_path) == ["summary.md"]


def test_sha256_of_a_file_larger_than_one_block(tmp_path):
    data = os.urandom((1 << 20) + 123)
    path = tmp_path / "part.parquet"
    path.write_bytes(data)
    assert sha256_of(path) == hashlib.sha256(data).hexdigest()
