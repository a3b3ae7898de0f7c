"""Memory of the shard merge against the item count: batchgen's batched copy against reading the tables whole.

    python -m benchmarks.memory_merge 2000 20000                          # prints one JSON line per run
    python -m benchmarks.memory_merge 2000 20000 --add-to benchmarks/results   # into latest.json/md

For each size, two shard publications of half the items each are written with batchgen's own
publishing (real Parquet files, JSON-lines mirrors, manifests with SHA-256s), with rows shaped
like a run's: a 400-character text per item, its input, two attempts per item with 64 output
token ids each, a tenth of the items rejected. Then, each in a fresh process:

- `batchgen`: `merge_shards`, which reads the item ids first and copies each table 8,192 rows
  at a time;
- `whole`: the same publication made by reading every shard table whole and concatenating
  (how the merge worked before), for comparison in the same run.

Each line holds the process's RSS before the merge, its peak RSS (ru_maxrss) after it, and the
difference; the summary gives each method's growth in KB per item between the sizes.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

SHARDS = 2
METHODS = ("batchgen", "whole")
TEXT = ("A sturdy, well-made product for everyday use. " * 9)[:400]


def shard_tables(ids: list[str]) -> dict:
    """One shard's results, rejected and attempts tables, shaped like a run's."""
    import pyarrow as pa

    rejected = ids[::10]
    accepted = [i for i in ids if i not in set(rejected)]
    inputs = [{"name": f"product {i}", "feature": "waterproof", "audience": "hikers"} for i in ids]
    by_id = dict(zip(ids, inputs))
    tokens = list(range(1000, 1064))
    results = pa.table({
        "item_id": accepted, "text": [f"{TEXT} ({i})" for i in accepted], "attempt": [2] * len(accepted),
        "finish_reason": ["stop"] * len(accepted), "n_output_tokens": [96] * len(accepted),
        "input": [by_id[i] for i in accepted]})
    rejected_table = pa.table({
        "item_id": rejected, "stage": ["validate"] * len(rejected), "reasons": [["truncated"]] * len(rejected),
        "text": [f"{TEXT} ({i})" for i in rejected], "input": [by_id[i] for i in rejected]})
    attempts = pa.table({
        "item_id": [i for i in ids for _ in (1, 2)], "attempt": [1, 2] * len(ids),
        "text": [f"{TEXT} ({i})" for i in ids for _ in (1, 2)],
        "output_token_ids": [tokens for _ in ids for _ in (1, 2)],
        "finish_reason": ["length", "stop"] * len(ids)})
    from batchgen.publish import ATTEMPTS, REJECTED, RESULTS

    return {RESULTS: results, REJECTED: rejected_table, ATTEMPTS: attempts}


def write_shards(root: Path, n: int) -> tuple[list[Path], list[str]]:
    """Two shard publications of n items in all, committed the way a shard's run commits its own."""
    from batchgen.publish import REJECTED, RESULTS, Publication
    from batchgen.records import Manifest
    from batchgen.shards import shard_dir

    ids = [f"p{j:07d}" for j in range(n)]
    dirs = []
    for index in range(SHARDS):
        mine = ids[index::SHARDS]
        tables = shard_tables(mine)
        accepted, rejected = tables[RESULTS].num_rows, tables[REJECTED].num_rows
        counts = dict(items=len(mine), accepted=accepted, rejected=rejected, generated_items=len(mine),
                      attempts=2 * len(mine), rejected_by_reason={"truncated": rejected})
        manifest = Manifest.model_validate({
            "job": "memory-merge", "counts": counts, "flow_run_id": f"shard-{index}",
            "tokens": {"prompt": 80 * len(mine), "output": 192 * len(mine), "generated_this_run": 0},
            "timings_seconds": {"engine_calls": 1.0}})
        directory = shard_dir(root / "out", index, SHARDS)
        with Publication.open(directory, jsonl=True) as publication:
            publication.seal(manifest, [], tables={name: (t.schema, [t]) for name, t in tables.items()})
            publication.commit()
        dirs.append(directory)
    return dirs, ids


def merge_whole(out: Path, dirs: list[Path], manifest: dict) -> None:
    """The merge as it was: every shard table read whole, concatenated, written as one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from batchgen.publish import ATTEMPTS, REJECTED, RESULTS, Publication, current_publication
    from batchgen.records import Manifest

    names = (RESULTS, REJECTED, ATTEMPTS)
    tables = {name: pa.concat_tables([pq.read_table(current_publication(d) / name) for d in dirs],
                                     promote_options="permissive") for name in names}
    with Publication.open(out, jsonl=True) as publication:
        publication.seal(Manifest.model_validate(manifest), [], tables={n: (t.schema, [t]) for n, t in tables.items()})


def measure(method: str, root: Path, n: int) -> dict:
    import psutil

    from batchgen.publish import Publication
    from batchgen.shards import merge_shards, shard_dir

    dirs = [shard_dir(root / "out", i, SHARDS) for i in range(SHARDS)]
    ids = [f"p{j:07d}" for j in range(n)]
    before = psutil.Process().memory_info().rss
    if method == "batchgen":
        with Publication.open(root / "out", jsonl=True) as publication:
            merge_shards(publication, dirs, ids, {"job": "memory-merge"})
    else:
        merge_whole(root / "out", dirs, {"job": "memory-merge"})
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    return {"method": method, "items": n, "rss_before_mb": round(before / 2**20, 1),
            "peak_rss_mb": round(peak / 2**20, 1), "peak_above_before_mb": round((peak - before) / 2**20, 1)}


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--measure":  # a child: --measure METHOD ROOT N
        print(json.dumps(measure(argv[1], Path(argv[2]), int(argv[3]))), flush=True)
        return 0
    if argv and argv[0] == "--write":  # a child: --write ROOT N
        write_shards(Path(argv[1]), int(argv[2]))
        return 0
    add_to = None
    if "--add-to" in argv:
        at = argv.index("--add-to")
        add_to, argv = Path(argv[at + 1]), argv[:at] + argv[at + 2:]
    sizes = [int(a) for a in argv] or [2000, 20000]
    result: dict = {"command": "python -m benchmarks.memory_merge " + " ".join(map(str, sizes)), "shards": SHARDS,
                    "runs": [], "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="batchgen-memory-merge-") as tmp:
            # The shards are written by a child too: on Linux a child's ru_maxrss starts at its parent's RSS
            # at fork, so this process stays small.
            for args in (["--write", tmp, str(n)], *(["--measure", method, tmp, str(n)] for method in METHODS)):
                out = subprocess.run([sys.executable, "-m", "benchmarks.memory_merge", *args], capture_output=True,
                                     text=True, cwd=Path(__file__).resolve().parents[1])
                if args[0] == "--write":
                    if out.returncode:
                        sys.stderr.write(out.stderr[-4000:])
                        raise SystemExit(f"writing the {n}-item shards failed (exit {out.returncode})")
                    continue
                method = args[1]
                if out.returncode:
                    sys.stderr.write(out.stderr[-4000:])
                    raise SystemExit(f"the {method} merge of {n} items failed (exit {out.returncode})")
                line = out.stdout.strip().splitlines()[-1]
                print(line, flush=True)
                result["runs"].append(json.loads(line))
    peaks = {(r["method"], r["items"]): r["peak_above_before_mb"] for r in result["runs"]}
    steps = sorted(set(sizes))
    # Per step between sizes: below one row group (8,192 rows) a bigger table also means bigger row groups.
    result["slope_kb_per_item"] = {
        f"{low}-{high}": {method: round(1024 * (peaks[(method, high)] - peaks[(method, low)]) / (high - low), 2)
                          for method in METHODS}
        for low, high in zip(steps, steps[1:])}
    result["finished_at"] = datetime.now(timezone.utc).isoformat()
    print(json.dumps({"slope_kb_per_item": result.get("slope_kb_per_item")}), flush=True)
    if add_to is not None:
        from benchmarks.report import add_section

        add_section(add_to, "memory_merge", result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
