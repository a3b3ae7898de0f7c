"""Fixtures of the batchgen tests that several modules use: a real publication (a CSV loaded by load_items,
assembled and published with the card; the engine's outputs made by hand, since what is checked is the layout),
the five-item assembly scenario, and a hash cache of the test's own."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from batchgen import provenance
from batchgen.assemble import assemble
from batchgen.items import load_items
from batchgen.job import InputSpec
from batchgen.records import Rejection
from batchgen.retry import latest_attempts
from tests.frames import make_items, with_verdicts
from tests.publications import generated, publish_frames

# The input has columns named like batchgen's own (text, stage) and one named like a renamed one (input_text).
CSV = ("sku,name,text,stage,input_text\n"
       "s1,Mug,keeps coffee hot,draft,a\n"
       "s2,Boots,dry feet,final,b\n"
       "\n"  # a blank line is not a row
       "s3,Lamp,bright,draft,c\n"
       "s1,Mug again,duplicate,draft,d\n")


@pytest.fixture
def publication(tmp_path):
    path = tmp_path / "items.csv"
    path.write_text(CSV, encoding="utf-8")
    loaded = load_items(InputSpec(path=str(path), id_column="sku"))
    attempts = pd.concat([with_verdicts(generated("s1", ["The Mug keeps coffee hot."]), [[]]),
                          with_verdicts(generated("s2", ["Boots."]), [["length"]]),
                          with_verdicts(generated("s3", ["The Lamp is bright."]), [[]])], ignore_index=True)
    result = assemble(loaded.items, loaded.columns, loaded.rejected, latest_attempts(attempts))
    manifest = {"job": "readers", "model": {"name": "SmolLM2-135M-Instruct"},
                "prompt": {"style": "chat", "system": None, "template": "Describe {{ name }}."},
                "counts": {"items": 4, "accepted": len(result.accepted), "rejected": len(result.rejected),
                           "rejected_by_reason": {"duplicate_id": 1, "length": 1}}}
    written = publish_frames(tmp_path / "out", result.accepted, result.rejected, attempts, [], manifest, True,
                             id_column="sku")
    return tmp_path / "out", written, path


@pytest.fixture
def scenario():
    """Five items: two generated and passing, one failing, one rejected at the prompt stage, one lost;
    plus a load-stage rejection that never became an item."""
    items = make_items([
        ("p1", "耳机", "降噪"),
        ("p2", "Aurora Mug", "hot"),
        ("p3", "Trail Boots", "dry"),
        ("p4", "Blank", ""),
        ("p5", "Lost Lamp", "bright"),
    ])
    early = [
        Rejection("line-9", 9, "load", ["invalid_json"], "line 9: Expecting value"),
        Rejection("p4", 5, "prompt", ["missing_field"], "row 5: feature is empty",
                  {"name": "Blank", "feature": ""}),
    ]
    attempts = pd.concat([
        # p1: candidate 0 fails, candidate 1 passes -> candidate 1 is published
        with_verdicts(generated("p1", ["短", "这款耳机降噪出色，通勤首选。"]), [["length"], []]),
        # p2: cut off on the first pass, fixed by a retry
        with_verdicts(generated("p2", ["The Aurora Mug keeps"], ["length"]), [["truncated"]]),
        with_verdicts(generated("p2", ["The Aurora Mug keeps coffee hot."], attempt=2, candidate=0, max_tokens=32),
                      [[]]),
        # p3: every candidate fails
        with_verdicts(generated("p3", ["Buy now", "Click https://x"]), [["keyword", "length"], ["must_not_match"]]),
    ], ignore_index=True)
    return SimpleNamespace(items=items, early=early, attempts=attempts)


@pytest.fixture
def hash_cache(tmp_path, monkeypatch):
    """The hash cache in a folder of the test's own (the model cache stays where it is)."""
    monkeypatch.setattr(provenance, "_hash_cache", lambda: tmp_path / "cache" / provenance.HASHES)
    provenance._MEMORY.clear()
    yield tmp_path / "cache"
    provenance._MEMORY.clear()
