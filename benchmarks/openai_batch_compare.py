"""`batchgen run-batch` against vLLM's own `run_batch` on the same OpenAI Batch file: keys, structure and values.

    python -m benchmarks.openai_batch_compare [--input examples/openai_batch/requests.jsonl] [--out DIR]

Three fresh processes on the embedded model, float32, seed 0: (1) vLLM's run_batch on the whole file (it stops at
the first line it cannot read: the file's /v1/completions line), (2) vLLM's run_batch on the file's chat lines,
(3) `batchgen run-batch` on the whole file. For every custom_id both answered it lists the key paths only one
writes, and compares prompt_tokens, completion_tokens, finish_reason and (at temperature 0) the text. Writes
compare.json and compare.md into --out (benchmarks/results/openai-batch/ by default).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SERVED = "SmolLM2-135M-Instruct"
# The CPU engine as batchgen starts it: a fixed 2 GiB KV cache (vLLM's default reserves 92% of RAM), 32-token blocks.
VLLM_CPU_ARGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "2048", "--seed", "0",
                 "--kv-cache-memory-bytes", str(2 << 30), "--gpu-memory-utilization", "0.3", "--block-size", "32"]


def key_paths(value: Any, prefix: str = "") -> set[str]:
    """Every key path of a JSON value; list items share one path (`choices[].index`)."""
    if isinstance(value, dict):
        paths = set()
        for key, inner in value.items():
            path = f"{prefix}.{key}" if prefix else key
            paths |= {path} | key_paths(inner, path)
        return paths
    if isinstance(value, list):
        return set().union(*(key_paths(item, f"{prefix}[]") for item in value)) if value else set()
    return set()


def run(command: list[str], log: Path) -> tuple[int, float]:
    started = time.perf_counter()
    with open(log, "w") as handle:
        done = subprocess.run(command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, env=os.environ.copy())
    return done.returncode, round(time.perf_counter() - started, 1)


def last_error(log: Path) -> str:
    """Why a run failed: vLLM's request validation error when there is one (the line it could not read), else the
    last error line."""
    lines = log.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        if "ValidationError" in line and "BatchRequestInput" in line:
            return " ".join(part.strip() for part in lines[i:i + 3])[:400]
    errors = [line for line in lines if "Error" in line]
    return errors[-1][:300] if errors else ""


def records(path: Path) -> dict[str, dict[str, Any]]:
    if not path.is_file():
        return {}
    return {r["custom_id"]: r for r in map(json.loads, path.read_text(encoding="utf-8").splitlines()) if r["custom_id"]}


def compare(vllm: dict[str, Any], ours: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    theirs, mine = key_paths(vllm), key_paths(ours)
    row: dict[str, Any] = {"only_vllm": sorted(theirs - mine), "only_batchgen": sorted(mine - theirs)}
    vb, ob = vllm["response"]["body"], ours["response"]["body"]
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        row[name] = [vb["usage"][name], ob["usage"][name]]
    row["finish_reason"] = [[c["finish_reason"] for c in vb["choices"]], [c["finish_reason"] for c in ob["choices"]]]
    if request["body"].get("temperature") == 0:
        texts = [[c["message"]["content"] for c in body["choices"]] for body in (vb, ob)]
        row["same_text_at_temperature_0"] = texts[0] == texts[1]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.openai_batch_compare",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", type=Path, default=ROOT / "examples" / "openai_batch" / "requests.jsonl")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "openai-batch")
    args = parser.parse_args(argv)
    os.environ.setdefault("BATCHGEN_CACHE", str(ROOT / ".cache"))
    from batchgen.models import default_model_path

    model = str(default_model_path())
    work = Path(tempfile.mkdtemp(prefix="batchgen-openai-compare-"))
    os.environ.setdefault("PREFECT_HOME", str(work / "prefect"))
    lines = [json.loads(line) for line in args.input.read_text(encoding="utf-8").splitlines() if line.strip()]
    chat = work / "chat.jsonl"
    chat.write_text("".join(json.dumps(line) + "\n" for line in lines if line["url"] == "/v1/chat/completions"))
    vllm = [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "--model", model,
            "--served-model-name", SERVED, *VLLM_CPU_ARGS]
    figures: dict[str, Any] = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                               "input": str(args.input.relative_to(ROOT) if args.input.is_relative_to(ROOT)
                                            else args.input), "lines": len(lines)}
    print("[compare] vLLM run_batch, whole file", flush=True)
    code, seconds = run([*vllm, "-i", str(args.input), "-o", str(work / "vllm-all.jsonl")], work / "vllm-all.log")
    figures["vllm_whole_file"] = {"exit_code": code, "seconds": seconds,
                                  "output_lines": len(records(work / "vllm-all.jsonl")),
                                  "last_error": last_error(work / "vllm-all.log") if code else ""}
    print("[compare] vLLM run_batch, chat lines", flush=True)
    code, seconds = run([*vllm, "-i", str(chat), "-o", str(work / "vllm.jsonl")], work / "vllm.log")
    figures["vllm_chat_lines"] = {"exit_code": code, "seconds": seconds}
    print("[compare] batchgen run-batch, whole file", flush=True)
    code, seconds = run([sys.executable, "-m", "batchgen.cli", "run-batch", "-i", str(args.input), "-o",
                         str(work / "batchgen.jsonl"), "--max-model-len", "2048"], work / "batchgen.log")
    errors = work / "batchgen.errors.jsonl"
    figures["batchgen"] = {"exit_code": code, "seconds": seconds,
                           "output_lines": len(records(work / "batchgen.jsonl")),
                           "error_lines": len(errors.read_text().splitlines()) if errors.is_file() else 0}
    theirs, ours = records(work / "vllm.jsonl"), records(work / "batchgen.jsonl")
    by_id = {line["custom_id"]: line for line in lines}
    figures["per_request"] = {cid: compare(theirs[cid], ours[cid], by_id[cid]) for cid in theirs if cid in ours}
    figures["answered_only_by_batchgen"] = sorted(set(ours) - set(theirs))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compare.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    (args.out / "compare.md").write_text(markdown(figures), encoding="utf-8")
    print(json.dumps(figures, indent=2), flush=True)
    return 0 if figures["batchgen"]["exit_code"] == 0 else 1


def markdown(figures: dict[str, Any]) -> str:
    rows = figures["per_request"]
    only_vllm = sorted(set().union(*(set(r["only_vllm"]) for r in rows.values()))) if rows else []
    only_ours = sorted(set().union(*(set(r["only_batchgen"]) for r in rows.values()))) if rows else []
    out = [f"# batchgen run-batch against vLLM run_batch ({figures['date']})", "",
           f"Input: `{figures['input']}`, {figures['lines']} lines; embedded model, float32, seed 0.", "",
           (f"- vLLM on the whole file: exit code {figures['vllm_whole_file']['exit_code']}, "
            f"{figures['vllm_whole_file']['output_lines']} output lines "
            f"({figures['vllm_whole_file']['last_error'] or 'no error'})"),
           (f"- vLLM on the chat lines: exit code {figures['vllm_chat_lines']['exit_code']}, "
            f"{figures['vllm_chat_lines']['seconds']} s"),
           (f"- batchgen on the whole file: exit code {figures['batchgen']['exit_code']}, "
            f"{figures['batchgen']['output_lines']} output lines, {figures['batchgen']['error_lines']} error lines, "
            f"{figures['batchgen']['seconds']} s; answered only by batchgen: "
            f"{', '.join(figures['answered_only_by_batchgen']) or 'none'}"), "",
           "| custom_id | prompt_tokens (vLLM, batchgen) | completion_tokens | finish_reason | same text at T=0 |",
           "| --- | --- | --- | --- | --- |"]
    for cid, row in rows.items():
        out.append(f"| {cid} | {row['prompt_tokens']} | {row['completion_tokens']} | {row['finish_reason']} | "
                   f"{row.get('same_text_at_temperature_0', 'n/a (sampled)')} |")
    out += ["", "Key paths only vLLM writes: " + (", ".join(f"`{p}`" for p in only_vllm) or "none"), "",
            "Key paths only batchgen writes: " + (", ".join(f"`{p}`" for p in only_ours) or "none"), ""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
