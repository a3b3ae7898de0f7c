"""Where does the lead over HF transformers come from? Same prompts, same budget, one run each:

    python -m benchmarks.hf_gap --items 64

HF `generate` with static batches of 32 and 64 (float32, torch's default threads) and of 32
on one thread, then raw vLLM (one `LLM.generate` call) on the same prompts with the
benchmark's sampling (temperature 0.7, top_p 0.9), with top_p 1.0 (no full-vocabulary sort
per token), and greedy. Prints one JSON object; not part of latest.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hf_gap")
    parser.add_argument("--items", type=int, default=64)
    parser.add_argument("--hf-runs", nargs="+", default=["32", "64", "32x1"],
                        help="HF runs as BATCH or BATCHxTHREADS (default: 32 64 32x1)")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)

    from benchmarks import run as bench

    bench.set_environment()
    cfg = bench.parse_args(["--hf-items", str(args.items)])
    from vllm import SamplingParams

    from batchgen.generation import sampling_kwargs
    from batchgen.models import default_model_path

    job = bench.bench_job(bench.write_products(cfg.work / "products.csv", args.items), cfg.work / "unused",
                          args.max_tokens)
    _, prompts = bench.build_prompt_ids(job)
    out: dict = {"items": args.items, "max_tokens": args.max_tokens, "loadavg_at_start": os.getloadavg(), "hf": {}}
    for run in args.hf_runs:
        size, _, threads = run.partition("x")
        bench.log(f"HF, batches of {size}, threads {threads or 'default'}")
        hf = bench.run_hf(replace(cfg, hf_batch_size=int(size), hf_threads=int(threads) if threads else None),
                          str(default_model_path()), prompts, args.max_tokens)
        out["hf"][run] = {k: hf[k] for k in ("output_tokens", "wall_seconds", "output_tokens_per_second",
                                                   "torch_threads", "finish", "loadavg_1min", "batch_seconds")}
    memory = bench.TreeMemory()
    engine, _ = bench.start_engine(memory)
    base = sampling_kwargs(job.sampling)
    engine.run(bench.timed_generate, prompts[:4], SamplingParams(**{**base, "max_tokens": 4}))  # one-time costs
    out["vllm"] = {}
    for name, change in (("top_p_0.9", {}), ("top_p_1.0", {"top_p": 1.0}), ("greedy", {"temperature": 0.0})):
        bench.log(f"raw vLLM, {name}")
        raw = bench.run_raw(engine, prompts, SamplingParams(**{**base, **change}), memory)
        out["vllm"][name] = {k: raw[k] for k in ("output_tokens", "wall_seconds", "output_tokens_per_second",
                                                 "finish", "loadavg_1min")}
    memory.close()
    import batchgen.engine

    batchgen.engine.shutdown_all()
    out["loadavg_at_end"] = os.getloadavg()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":  # vLLM spawns its engine core: this module must be importable
    sys.exit(main())
