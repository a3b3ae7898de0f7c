"""The engine in the run's process against vLLM's engine processes, side by side on the same prompts.

    python -m benchmarks.engine_processes                    # 96 prompts, 64 tokens, 2 rounds
    python -m benchmarks.engine_processes --prompts 32 --rounds 1 --out benchmarks/results/engine_processes.json

Each measurement is a fresh process (the choice is per process: VLLM_ENABLE_V1_MULTIPROCESSING=0 or 1)
that builds batchgen's engine for the default model, then makes one `generate` call on the same prompts
with per-request seeds. The two settings alternate, round after round, so that a slow spell of the
machine hits both. Prints one JSON line per measurement (engine start seconds, generate seconds, output
tokens/s, a SHA-256 of the texts) and a summary with the ratios; the texts must be identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"in_process": "0", "engine_processes": "1"}


def measure(prompts: int, max_tokens: int) -> dict:
    started = time.perf_counter()
    from vllm import SamplingParams

    from batchgen.engine import get_engine
    from batchgen.engine_process import generate
    from batchgen.job import EngineSpec

    imported = time.perf_counter()
    engine = get_engine(EngineSpec())
    ready = time.perf_counter()
    texts = [f"Write a short description of product number {i}, a waterproof hiking boot." for i in range(prompts)]
    params = [SamplingParams(max_tokens=max_tokens, temperature=0.7, top_p=0.9, seed=i, ignore_eos=True)
              for i in range(prompts)]
    outputs = engine.run(generate, texts, params)
    done = time.perf_counter()
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    digest = hashlib.sha256("\x00".join(o.outputs[0].text for o in outputs).encode()).hexdigest()
    return {"import_seconds": round(imported - started, 2), "engine_start_seconds": round(ready - imported, 2),
            "generate_seconds": round(done - ready, 2), "output_tokens": tokens,
            "output_tokens_per_second": round(tokens / (done - ready), 2), "texts_sha256": digest}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="also write the result as JSON here")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # a child
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.prompts, args.max_tokens)), flush=True)
        import psutil

        for child in psutil.Process().children(recursive=True):  # vLLM's engine processes, if any
            child.kill()
        os._exit(0)  # leave at once: engine shutdown is not what is measured
    runs = []
    for round_ in range(args.rounds):
        for name, value in SETTINGS.items():
            env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": value, "VLLM_LOGGING_LEVEL": "WARNING"}
            out = subprocess.run([sys.executable, "-m", "benchmarks.engine_processes", "--measure", "--prompts",
                                  str(args.prompts), "--max-tokens", str(args.max_tokens)],
                                 cwd=ROOT, env=env, capture_output=True, text=True)
            if out.returncode:
                sys.stderr.write(out.stderr[-4000:])
                raise SystemExit(f"{name} failed (exit {out.returncode})")
            run = {"setting": name, "round": round_ + 1, **json.loads(out.stdout.strip().splitlines()[-1])}
            print(json.dumps(run), flush=True)
            runs.append(run)

    def mean(name: str, key: str) -> float:
        values = [r[key] for r in runs if r["setting"] == name]
        return sum(values) / len(values)

    summary = {
        "command": "python -m benchmarks.engine_processes " + " ".join(argv),
        "finished_at": datetime.now(timezone.utc).isoformat(), "machine": platform.platform(),
        "logical_cores": os.cpu_count(), "prompts": args.prompts, "max_tokens": args.max_tokens, "runs": runs,
        "texts_identical": len({r["texts_sha256"] for r in runs}) == 1,
        "engine_start_seconds": {name: round(mean(name, "engine_start_seconds"), 1) for name in SETTINGS},
        "output_tokens_per_second": {name: round(mean(name, "output_tokens_per_second"), 1) for name in SETTINGS},
    }
    tps = summary["output_tokens_per_second"]
    summary["ratio_in_process_vs_engine_processes"] = round(tps["in_process"] / tps["engine_processes"], 3)
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=1), flush=True)
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
