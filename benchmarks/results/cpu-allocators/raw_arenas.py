"""Raw vLLM on the CPU engine as batchgen builds it (in this process), four LLM.generate calls of 64 prompts x 48
tokens; `cap` first caps glibc's malloc arenas at 2 (mallopt M_ARENA_MAX), as an experiment of 2026-12-05 did:

    python benchmarks/results/cpu-allocators/raw_arenas.py 64 cap
"""
import ctypes
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

if __name__ == "__main__":  # vLLM's engine starts processes with spawn
    if len(sys.argv) > 2 and sys.argv[2] == "cap":
        print("mallopt", ctypes.CDLL(None).mallopt(-8, 2))  # M_ARENA_MAX
    from benchmarks import run as bench

    bench.set_environment()
    from vllm import SamplingParams

    from batchgen.engine import get_engine
    from batchgen.job import EngineSpec

    n = int(sys.argv[1])
    work = Path(tempfile.mkdtemp())
    _, prompts = bench.build_prompt_ids(bench.bench_job(bench.write_products(work / "p.csv", n), work / "out", 48))
    engine = get_engine(EngineSpec(**bench.ENGINE))
    params = SamplingParams(max_tokens=48, ignore_eos=True, temperature=0.7, top_p=0.9)
    for rep in range(4):
        got = engine.run(bench.timed_generate, prompts, params)
        print("rep", rep, round(got["wall"], 2), "s", round(got["tokens"] / got["wall"], 1), "tok/s", flush=True)
