"""RSS of the pipeline's own steps (no engine) against the item count.

    python -m benchmarks.memory_parts 2000      # then 20000: one process per size
    python -m benchmarks.memory_parts 2000 20000 --add-to benchmarks/results   # into latest.json/md

`--memory` in benchmarks.run measures the whole flow with the engine, which at 20,000 items
takes hours of prefill on a 2-core CPU. This measures what batchgen itself holds: the real
load, prompt building (real tokenizer), GX validation, assembly, staging (Parquet) and the
report, on engine outputs made up in place of the engine's (4 tokens, cut off, as with
max_tokens 4), so that the memory slope of our code is visible in a minute. Prints the RSS
after each step and the process peak, in MB, as one JSON line per size.
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
from types import SimpleNamespace


def measure(n: int) -> dict:
    from benchmarks import run as bench

    bench.set_environment()
    import pandas as pd
    import psutil

    from batchgen.assemble import assemble
    from batchgen.generation import first_pass_requests, output_rows, request_key, sampling_kwargs
    from batchgen.items import load_items
    from batchgen.manifest import build_manifest
    from batchgen.prompts import build_prompts
    from batchgen.publish import commit, stage
    from batchgen.report import write_report
    from batchgen.retry import latest_attempts
    from batchgen.schema import ATTEMPT_SCHEMA
    from batchgen.tokenizer import load_tokenizer
    from expectations.validate import validate_rows

    proc = psutil.Process()
    marks: dict[str, float] = {}

    def mark(name: str) -> None:
        marks[name] = round(proc.memory_info().rss / 2**20, 1)

    work = Path(tempfile.mkdtemp(prefix="batchgen-memory-parts-"))
    job = bench.bench_job(bench.write_products(work / "products.csv", n), work / "out", 4)
    mark("start")
    loaded = load_items(job.input)
    _, tokenizer, max_len = load_tokenizer(job.engine)
    mark("items_and_tokenizer")
    built = build_prompts(loaded.items, job.prompt, tokenizer, max_len, loaded.columns)
    mark("prompts")
    requests = first_pass_requests(built.prompts, job.sampling)
    mark("requests")
    base, now, rows = sampling_kwargs(job.sampling), datetime.now(timezone.utc), []
    for request in requests:  # in place of the engine: 4 tokens, cut off by max_tokens
        completion = SimpleNamespace(index=0, token_ids=[504, 2115, 314, 260], text="The product is a",
                                     cumulative_logprob=-3.0, finish_reason="length", stop_reason=None,
                                     logprobs=None)
        output = SimpleNamespace(request_id="stand-in", outputs=[completion])
        rows.extend(output_rows(request, output, request_key(request, base, "stand-in"), 1.0, now))
    attempts = pd.DataFrame(rows, columns=ATTEMPT_SCHEMA.names)
    del rows
    mark("attempts")
    keywords = loaded.items.set_index("item_id")[job.expectations.keyword_column].astype("string")
    validation = validate_rows(attempts, job.expectations, keywords, "memory-parts")
    verdicts = validation.verdicts.set_index("row_key")
    attempts["passed"], attempts["failed"] = list(verdicts["passed"]), list(verdicts["failed"])
    mark("validate")
    result = assemble(loaded.items, loaded.columns, loaded.rejected, latest_attempts(attempts), job.sampling)
    mark("assemble")
    manifest = build_manifest(job, {"name": "stand-in", "path": "-"}, {}, result.accepted, result.rejected, attempts,
                              0, 0, {}, now, None, None)
    _, staging = stage(Path(job.output.dir), result.accepted, result.rejected, attempts, [validation.result],
                       manifest, job.output.jsonl)
    mark("stage")
    write_report(staging)
    commit(Path(job.output.dir), staging)
    mark("report_and_commit")
    peak = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # kB on Linux
    return {"items": n, "rss_mb_after": marks, "peak_rss_mb": peak}


def main(argv: list[str]) -> int:
    add_to = None
    if "--add-to" in argv:  # --add-to DIR: also add the figures to DIR/latest.json and latest.md
        at = argv.index("--add-to")
        add_to, argv = Path(argv[at + 1]), argv[:at] + argv[at + 2:]
    sizes = [int(a) for a in argv] or [2000, 20000]
    if len(sizes) == 1 and add_to is None:
        print(json.dumps(measure(sizes[0])), flush=True)
        return 0
    result: dict = {"command": "python -m benchmarks.memory_parts " + " ".join(map(str, sizes)), "sizes": {},
                    "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}
    for n in sizes:  # a fresh process per size: RSS peaks are per process
        out = subprocess.run([sys.executable, "-m", "benchmarks.memory_parts", str(n)], capture_output=True,
                             text=True, check=True, cwd=Path(__file__).resolve().parents[1])
        line = out.stdout.strip().splitlines()[-1]
        print(line, flush=True)
        result["sizes"][str(n)] = json.loads(line)
    low, high = min(sizes), max(sizes)
    if high > low:
        rise = result["sizes"][str(high)]["peak_rss_mb"] - result["sizes"][str(low)]["peak_rss_mb"]
        result["slope_kb_per_item"] = round(1024 * rise / (high - low), 2)
    result["finished_at"] = datetime.now(timezone.utc).isoformat()
    if add_to is not None:
        from benchmarks.report import render_markdown

        latest = add_to / "latest.json"
        full = json.loads(latest.read_text(encoding="utf-8"))
        full["memory_parts"] = result
        latest.write_text(json.dumps(full, indent=2, default=str) + "\n", encoding="utf-8")
        (add_to / "latest.md").write_text(render_markdown(full), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
