"""Tokenizing the benchmark's prompts as the flow does (a slice per core, Rust threads without the interpreter lock),
three times, in this process: run it under MALLOC_ARENA_MAX=1, 2, 16 to see what sharing one malloc arena costs.

    MALLOC_ARENA_MAX=1 python benchmarks/results/cpu-allocators/tokenizer_arenas.py 20000
"""
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import run as bench  # noqa: E402

bench.set_environment()
from batchgen.items import load_items  # noqa: E402
from batchgen.prompts import TOKENIZE_BATCH, _token_ids, build_prompts  # noqa: E402
from batchgen.tokenizer import load_tokenizer  # noqa: E402

n = int(sys.argv[1])
work = Path(tempfile.mkdtemp())
job = bench.bench_job(bench.write_products(work / "p.csv", n), work / "out", 4)
loaded = load_items(job.input)
_, tokenizer, max_len = load_tokenizer(job.engine)
texts = build_prompts(loaded.items, job.prompt, tokenizer, max_len, loaded.columns).prompts["prompt"].tolist()
for rep in range(3):
    started = time.perf_counter()
    for start in range(0, len(texts), TOKENIZE_BATCH):
        _token_ids(tokenizer, texts[start:start + TOKENIZE_BATCH], False)
    print(rep, round(time.perf_counter() - started, 2), "s")
