"""Raw vLLM against the batchgen flow on an 8B-shaped model with random weights (GPU only).

    python -m benchmarks.big_model                            # 2,000 items x 128 tokens, ~4 minutes on an H200
    python -m benchmarks.big_model --items 4000 --max-tokens 256 --out benchmarks/results/gpu-h200
    python -m benchmarks.big_model --tiny --items 16 --max-tokens 8   # a 2-layer model: the plumbing, also on CPU

With the 135M default model the GPU waits on the host, so the flow's cost shows more than it would
with a model of the size people run. This writes, into a temporary folder, a Llama-3-8B-shaped
`config.json` (LlamaForCausalLM: hidden 4096, 32 layers, 32 heads, 8 KV heads, intermediate
14336, rope_theta 500000, 8192 positions, bfloat16) whose vocabulary is the default model's
tokenizer's, next to that tokenizer's files, and has vLLM load it with `load_format: dummy`
(random weights, nothing to download). The outputs are meaningless, so the job sets
`ignore_eos` and no stop strings: every output is max_tokens long. One engine, built through
`batchgen.engine.get_engine(job.engine)` so that the flow reuses it, measures one raw
`LLM.generate` call on the job's prompt token ids and then the flow on the same job.

Writes big_model.json into --out (default: the machine's results folder, as benchmarks.run)
and, when --out holds a benchmark run's latest.json, adds it there (section `big_model`) and
to latest.md. Without CUDA (and without --tiny) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

LLAMA3_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 8192}
TINY = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 8192}
ROPE_THETA = 500000.0
NOT_TOKENIZER = ("config.json", "batchgen-source.json")  # besides weights: what the model folder must not copy
# batchgen checks that a model folder holds weights; with load_format dummy vLLM reads none: an empty but valid
# safetensors file (no tensors) satisfies the check.
PLACEHOLDER_WEIGHTS = "no-weights-load-format-dummy.safetensors"


def write_placeholder_weights(path: Path) -> None:
    """A safetensors file with no tensors: an 8-byte little-endian header length, then the JSON header."""
    header = json.dumps({"__metadata__": {"note": "random weights: vLLM load_format dummy"}}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header)


def write_model_folder(dest: Path, shape: dict[str, int]) -> dict[str, Any]:
    """A model folder with `shape` and the default model's tokenizer; returns the config written.

    The config starts from the default model's own config.json (the field names the local transformers
    writes, e.g. rope_parameters), with the shape, the rope base and bfloat16 put in."""
    from transformers import AutoTokenizer

    from batchgen.models import default_model_path

    source = default_model_path()
    for path in source.iterdir():
        if path.is_file() and path.name not in NOT_TOKENIZER and not path.name.endswith((".safetensors", ".bin",
                                                                                          ".index.json")):
            shutil.copy2(path, dest / path.name)
    tokenizer = AutoTokenizer.from_pretrained(source)
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    config.pop("_model_name_or_path", None)
    config.update(shape, architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=len(tokenizer),
                  tie_word_embeddings=False, dtype="bfloat16")
    if "torch_dtype" in config:
        config["torch_dtype"] = "bfloat16"
    if isinstance(config.get("rope_parameters"), dict):
        config["rope_parameters"] = {**config["rope_parameters"], "rope_theta": ROPE_THETA}
    else:
        config["rope_theta"] = ROPE_THETA
    config.pop("rope_scaling", None)
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    write_placeholder_weights(dest / PLACEHOLDER_WEIGHTS)
    return config


def big_job(bench: Any, products: Path, out: Path, model: Path, max_tokens: int) -> Any:
    """The benchmark job with the big model, random weights, and outputs of exactly max_tokens tokens."""
    return bench.bench_job(products, out, max_tokens, extra={
        "engine": {"model": str(model), "extra_args": {"load_format": "dummy"}},
        "sampling": {"ignore_eos": True, "stop": []},
    })


def measure(args: argparse.Namespace, device: dict[str, Any] | None, command: str) -> dict[str, Any]:
    from benchmarks import run as bench

    from prefect.testing.utilities import prefect_test_harness
    from vllm import SamplingParams

    import batchgen.engine
    from batchgen.generation import sampling_kwargs

    shape = TINY if args.tiny else LLAMA3_8B
    work = Path(tempfile.mkdtemp(prefix="batchgen-big-model-"))
    model = work / ("llama-tiny-dummy" if args.tiny else "llama3-8b-shaped-dummy")
    model.mkdir()
    config = write_model_folder(model, shape)
    products = bench.write_products(work / "products.csv", args.items)
    job = big_job(bench, products, work / "out", model, args.max_tokens)
    item_ids, prompt_ids = bench.build_prompt_ids(job)
    by_item = dict(zip(item_ids, prompt_ids))
    memory = bench.TreeMemory(gpu=device is not None)
    started_at = datetime.now(timezone.utc).isoformat()
    try:
        with prefect_test_harness(server_startup_timeout=120):
            bench.log(f"building the engine for {model.name} (load_format dummy)")
            with memory.phase() as at_load:
                engine = batchgen.engine.get_engine(job.engine)  # the flow's get_engine(job.engine) finds this one
            params = SamplingParams(**sampling_kwargs(job.sampling))
            bench.log("warm-up: 8 prompts raw, then the flow on 8 items (one-time costs)")
            warm_params = SamplingParams(**{**sampling_kwargs(job.sampling), "max_tokens": 4})
            engine.run(bench.timed_generate, prompt_ids[:8], warm_params)
            warm = big_job(bench, bench.write_products(work / "warm.csv", 8), work / "out-warm", model, 4)
            bench.run_flow(warm, memory)

            bench.log(f"raw vLLM, one call on {args.items} prompts, {args.max_tokens} tokens each")
            bench.cold_prefix_cache(engine)
            raw = bench.run_raw(engine, prompt_ids, params, memory)
            bench.log(f"the flow on {args.items} items")
            bench.cold_prefix_cache(engine)
            run = bench.run_flow(job, memory, by_item)
            loads = batchgen.engine.LOADS
            batchgen.engine.shutdown_all()
    finally:
        memory.close()
        shutil.rmtree(work, ignore_errors=True)
    methods = {"raw_vllm": raw, "flow": run["flow"], "generation": run["generation"]}
    for m in methods.values():
        m["ratio_vs_raw"] = bench.ratio(m["output_tokens_per_second"], raw["output_tokens_per_second"])
    timings = run["manifest"]["timings_seconds"]
    return {
        "command": command,
        "started_at": started_at,
        "finished_at": datetime.now(timezone.utc).isoformat(),
        "device": device,
        "items": args.items,
        "max_tokens": args.max_tokens,
        "shape": {"architecture": config["architectures"][0], "dtype": config["dtype"],
                  "vocab_size": config["vocab_size"], "rope_theta": ROPE_THETA, **shape},
        "tiny": args.tiny,
        "engine": {"load_seconds": round(engine.load_seconds, 2), "max_model_len": engine.max_model_len,
                   "dtype": bench.engine_dtype(engine),
                   "loads": loads, "args": {k: v for k, v in engine.args.items() if k not in ("model", "tokenizer")},
                   **{k: at_load[k] for k in ("peak_rss_mb", "peak_gpu_memory_mb") if k in at_load}},
        "sampling": job.sampling.model_dump(mode="json"),
        "prompts_identical": run["prompts_identical"],
        "methods": methods,
        "flow_timings_seconds": timings,
        "raw_output_tokens_per_second": raw["output_tokens_per_second"],
        "flow_output_tokens_per_second": run["flow"]["output_tokens_per_second"],
        "ratio_flow_vs_raw": methods["flow"]["ratio_vs_raw"],
        "ratio_generation_vs_raw": methods["generation"]["ratio_vs_raw"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.big_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, help="results folder (default: the machine's, as benchmarks.run)")
    parser.add_argument("--tiny", action="store_true",
                        help="a 2-layer, 256-wide model of the same family instead: checks the plumbing (also on CPU)")
    args = parser.parse_args(argv)
    if args.items < 1 or args.max_tokens < 1:
        parser.error("--items and --max-tokens must be at least 1")

    from benchmarks import run as bench

    bench.set_environment()
    from benchmarks.gpu import cuda_device, default_results_dir

    device = cuda_device()
    if device is None and not args.tiny:
        print("benchmarks.big_model needs CUDA (an NVIDIA GPU, nvidia-smi and the vllm package): an 8B-shaped "
              "model is not run on CPUs. Nothing measured (--tiny runs a 2-layer model anywhere).", file=sys.stderr)
        return 0
    out = (args.out or default_results_dir(device)).resolve()
    given = sys.argv[1:] if argv is None else argv
    command = "python -m benchmarks.big_model" + (" " + " ".join(given) if given else "")
    started = time.perf_counter()
    result = measure(args, device, command)
    result["wall_seconds"] = round(time.perf_counter() - started, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "big_model.json").write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    if (out / "latest.json").exists():
        from benchmarks.report import add_section

        add_section(out, "big_model", result)
    bench.log(f"wrote {out / 'big_model.json'}" + (" and its section of latest.md" if (out / "latest.json").exists()
                                                   else ""))
    bench.log(f"raw {result['raw_output_tokens_per_second']} tok/s, flow {result['flow_output_tokens_per_second']} "
              f"tok/s: ratio_flow_vs_raw = {result['ratio_flow_vs_raw']}")
    if result["engine"]["loads"] != 1:
        bench.log(f"WARNING: {result['engine']['loads']} engines were built; the flow did not reuse this one")
    return 0


if __name__ == "__main__":  # vLLM starts its engine core with spawn: this module must be importable
    sys.exit(main())
