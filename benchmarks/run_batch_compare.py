"""batchgen against `vllm run-batch` on the same prompts, each a fresh process, wall time from start to output.

    python -m benchmarks.run_batch_compare --items 10000 --max-tokens 80 --out DIR
    python -m benchmarks.run_batch_compare --items 10000 --max-tokens 80 --warm-up 16 --out DIR  # warm caches first
    python -m benchmarks.run_batch_compare --items 8 --max-tokens 8 --out /tmp/x --retries   # a plumbing check

What a user who has the same table would run: (a) `python -m vllm.entrypoints.openai.run_batch -i requests.jsonl
-o results.jsonl --model M` on an OpenAI Batch file holding each item's chat messages (rendered by batchgen's own
template code, so both tools see the same conversations), and (b) `batchgen run job.yaml` on the example job over
the same items (a temporary Prefect server, the engine, validation, publishing, the report: everything a run
does). Retries off by default; with --retries, batchgen's job keeps its retry passes and run-batch gets one naive
retry pass: a second run-batch over the lines it cut off, with the doubled budget. Writes run_batch.json into --out.

Whichever tool starts an engine first on a machine pays torch.compile's cold cache (~60 s on an H200) and the other
finds it warm; `--warm-up N` runs both tools on N items first (untimed, recorded), so that both timed runs start
with warm caches, as they would on a user's second run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.run import JOB_FILE, ROOT, SAMPLING, set_environment, write_products


def job_file(products: Path, out_dir: Path, max_tokens: int, retries: bool, path: Path) -> Path:
    job = yaml.safe_load(JOB_FILE.read_text(encoding="utf-8"))
    job["input"]["path"] = str(products)
    job["sampling"] = {**job["sampling"], **SAMPLING, "max_tokens": max_tokens}
    if not retries:
        job["retry"] = {"max_passes": 0}
    job["output"] = {"dir": str(out_dir), "jsonl": False}
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    return path


def batch_lines(job_path: Path, model: str, max_tokens: int) -> list[dict[str, Any]]:
    """One OpenAI Batch chat-completion line per item, with the conversation batchgen would build."""
    from batchgen.items import load_items
    from batchgen.job import load_job
    from batchgen.prompts import render_messages

    job = load_job(job_path)
    loaded = load_items(job.input)
    lines = []
    for row in loaded.items.to_dict(orient="records"):
        messages = render_messages(job.prompt, {name: row[name] for name in loaded.columns})
        lines.append({"custom_id": str(row["item_id"]), "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": model, "messages": messages, "max_tokens": max_tokens,
                               "temperature": SAMPLING["temperature"], "top_p": SAMPLING["top_p"],
                               "stop": SAMPLING["stop"]}})
    return lines


def timed(command: list[str], log: Path, published: Path | None = None, exit_grace: float = 60.0) -> float:
    """Seconds from start to exit. With `published` (a file the run writes last): a process still running
    `exit_grace` s after that file appeared is killed and the run fails, saying so (a run that never exits is
    no figure)."""
    started = time.perf_counter()
    seen_at = None
    with open(log, "w") as handle:
        process = subprocess.Popen(command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, env=os.environ.copy())
        while process.poll() is None:
            time.sleep(0.2)
            if published is not None and seen_at is None and published.exists():
                seen_at = time.perf_counter()
            if seen_at is not None and time.perf_counter() - seen_at > exit_grace:
                process.kill()
                process.wait()
                raise SystemExit(f"{' '.join(command[:4])} ... published {published} "
                                 f"{seen_at - started:.1f} s after its start, then had not exited {exit_grace:.0f} s "
                                 f"later: killed\n{log.read_text()[-3000:]}")
    seconds = time.perf_counter() - started
    if process.returncode:
        raise SystemExit(f"{' '.join(command[:4])} ... failed ({process.returncode}):\n{log.read_text()[-3000:]}")
    return seconds


def run_batch_command(model: str, requests: Path, results: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(requests), "-o", str(results),
            "--model", model, "--seed", "0", *extra]


def cut_off(results: Path) -> list[str]:
    ids = []
    for line in results.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        body = (record.get("response") or {}).get("body") or {}
        if any(choice.get("finish_reason") == "length" for choice in body.get("choices", [])):
            ids.append(record["custom_id"])
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run_batch_compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=10000)
    parser.add_argument("--max-tokens", type=int, default=80)
    parser.add_argument("--retries", action="store_true", help="batchgen's retry passes against one naive retry pass")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vllm-arg", action="append", default=[], help="more arguments for run-batch (repeatable)")
    parser.add_argument("--warm-up", type=int, default=0, metavar="N",
                        help="first run both tools on N items, untimed, so both find vLLM's compile cache warm")
    args = parser.parse_args(argv)
    set_environment()
    from batchgen.models import default_model_path

    work = Path(tempfile.mkdtemp(prefix="batchgen-run-batch-"))
    model = str(default_model_path())
    products = write_products(work / "products.csv", args.items)
    job = job_file(products, work / "out", args.max_tokens, args.retries, work / "job.yaml")
    lines = batch_lines(job, model, args.max_tokens)
    requests = work / "requests.jsonl"
    requests.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    args.out.mkdir(parents=True, exist_ok=True)

    figures: dict[str, Any] = {"items": args.items, "max_tokens": args.max_tokens, "retries": args.retries,
                               "model": model, "vllm_args": args.vllm_arg, "warm_up_items": args.warm_up}
    if args.warm_up:
        warm = work / "warm"
        warm.mkdir()
        warm_job = job_file(write_products(warm / "products.csv", args.warm_up), warm / "out", args.max_tokens,
                            False, warm / "job.yaml")
        warm_requests = warm / "requests.jsonl"
        warm_requests.write_text("".join(json.dumps(line) + "\n" for line in batch_lines(warm_job, model,
                                                                                           args.max_tokens)),
                                 encoding="utf-8")
        print(f"[compare] warm-up: both tools on {args.warm_up} items", flush=True)
        figures["warm_up_seconds"] = {
            "run_batch": round(timed(run_batch_command(model, warm_requests, warm / "results.jsonl", args.vllm_arg),
                                     args.out / "warm_run_batch.log"), 2),
            "batchgen": round(timed([sys.executable, "-m", "batchgen.cli", "run", str(warm_job)],
                                    args.out / "warm_batchgen.log", warm / "out" / "current" / "manifest.json"), 2)}
    print(f"[compare] vllm run-batch on {args.items} lines", flush=True)
    results = work / "results.jsonl"
    figures["run_batch_seconds"] = round(timed(run_batch_command(model, requests, results, args.vllm_arg),
                                               args.out / "run_batch.log"), 2)
    cut = cut_off(results)
    figures["run_batch_cut_off"] = len(cut)
    if args.retries and cut:
        wanted = set(cut)
        again = [{**line, "body": {**line["body"], "max_tokens": 2 * args.max_tokens}}
                 for line in lines if line["custom_id"] in wanted]
        retry_requests = work / "retry.jsonl"
        retry_requests.write_text("".join(json.dumps(line) + "\n" for line in again), encoding="utf-8")
        figures["run_batch_retry_seconds"] = round(timed(
            run_batch_command(model, retry_requests, work / "retry-results.jsonl", args.vllm_arg),
            args.out / "run_batch_retry.log"), 2)
        figures["run_batch_retry_cut_off"] = len(cut_off(work / "retry-results.jsonl"))
    figures["run_batch_total_seconds"] = round(figures["run_batch_seconds"] + figures.get("run_batch_retry_seconds", 0),
                                               2)

    print(f"[compare] batchgen run on {args.items} items", flush=True)
    figures["batchgen_seconds"] = round(timed([sys.executable, "-m", "batchgen.cli", "run", str(job)],
                                              args.out / "batchgen.log", work / "out" / "current" / "manifest.json"), 2)
    manifest = json.loads((work / "out" / "current" / "manifest.json").read_text(encoding="utf-8"))
    figures["batchgen_counts"] = manifest["counts"]
    figures["batchgen_timings_seconds"] = manifest["timings_seconds"]
    figures["ratio_batchgen_vs_run_batch"] = round(figures["run_batch_total_seconds"] / figures["batchgen_seconds"], 4)
    name = "run_batch_retries.json" if args.retries else "run_batch.json"
    (args.out / name).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(figures, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
