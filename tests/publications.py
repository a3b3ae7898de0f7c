"""Publishing hand-made frames through the production writer (batchgen.publish.Publication), for unit tests."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd

from batchgen.generation import output_rows
from batchgen.publish import Publication
from batchgen.records import Attempt, GenRequest, Manifest, RunTotals
from batchgen.schema import frame_input_codec


def generated(item_id: str, texts: list[str], finish: list[str] | None = None, attempt: int = 1,
              candidate: int | None = None, max_tokens: int = 16) -> list[Attempt]:
    """Attempt rows as the engine step produces them (one per candidate)."""
    finish = finish or ["stop"] * len(texts)
    req = GenRequest(item_id=item_id, prompt=f"<prompt {item_id}>", prompt_token_ids=[1, 2, 3],
                     max_tokens=max_tokens, n=len(texts), attempt=attempt, candidate=candidate,
                     strategy="first" if attempt == 1 else "grow")
    out = SimpleNamespace(request_id=f"req-{item_id}-{attempt}", outputs=[
        SimpleNamespace(index=i, text=t, token_ids=list(range(10, 10 + len(t.split()))), cumulative_logprob=-1.0,
                        finish_reason=f, stop_reason=None)
        for i, (t, f) in enumerate(zip(texts, finish))
    ])
    return output_rows(req, out, f"key-{item_id}-{attempt}-{candidate}", 0.25)




def stage_frames(out: Path, accepted: pd.DataFrame, rejected: pd.DataFrame, attempts: pd.DataFrame,
                 validation: list[dict[str, Any]], manifest: dict[str, Any], jsonl: bool = True,
                 id_column: str | None = None, keep: int = 3) -> Publication:
    """Open a publication, add the frames as its one window and seal it (not committed: a run that stops here
    has crashed before its switch)."""
    publication = Publication.open(Path(out), jsonl=jsonl, keep=keep, id_column=id_column)
    try:
        inputs = frame_input_codec(pd.DataFrame(), [], list(accepted["input"]) + list(rejected["input"]))
        publication.add_window(1, accepted, rejected, attempts, inputs, RunTotals())
        publication.seal(Manifest.model_validate({"job": "test", **manifest}), validation)
    except BaseException:
        publication.discard()  # as the flow's `with open_publication(...)` does
        raise
    return publication


def publish_frames(out: Path, accepted: pd.DataFrame, rejected: pd.DataFrame, attempts: pd.DataFrame,
                   validation: list[dict[str, Any]], manifest: dict[str, Any], jsonl: bool = True,
                   id_column: str | None = None, keep: int = 3) -> Manifest:
    """`stage_frames`, then commit: returns the manifest as written."""
    with stage_frames(out, accepted, rejected, attempts, validation, manifest, jsonl, id_column, keep) as publication:
        publication.commit()
    return publication.manifest


def merge(out: Path, shard_dirs: list[Path], ids: list[str], identity: dict[str, Any], jsonl: bool,
          shard_urls: list[str] | None = None) -> tuple[Manifest, Publication]:
    """The shard merge (batchgen.shards.merge_shards) into a new publication of `out`, sealed, not committed;
    discarded if the merge refuses."""
    from batchgen.shards import merge_shards

    publication = Publication.open(Path(out), jsonl=jsonl)
    try:
        return merge_shards(publication, shard_dirs, ids, identity, shard_urls), publication
    except BaseException:
        publication.discard()
        raise
