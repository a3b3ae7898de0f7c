"""An engine that answers at once, for measuring the flow's own cost without vLLM's.

`StandInLLM` has the surface of `vllm.LLM` the flow uses: `generate(prompts, params, use_tqdm=False)`,
`get_tokenizer()`, `reset_prefix_cache()`, and `llm_engine`, whose `add_request`, `step`,
`has_unfinished_requests`, `get_num_unfinished_requests` and `abort_request` are those of vLLM's
`LLMEngine`. Every request finishes at once: `generate` returns all its outputs, and `step()`
returns every pending request as finished. Each completion is `max_tokens` tokens long (the words
"The product is a", repeated), cut off (`finish_reason` "length").

`BatchingStandInEngine` steps like a GPU instead: a request takes a step per token, with at most `running`
requests at once, so a cut-off output's retries are a chain of steps (for measuring how the flow feeds an engine).

`install()` makes the flow's generate task use it in place of `batchgen.engine.get_engine`.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

TOKENS = (504, 2115, 314, 260)  # "The product is a" in SmolLM2's vocabulary
WORDS = ("The", " product", " is", " a")
DEFAULT_MAX_TOKENS = 16  # SamplingParams' default


@functools.lru_cache(maxsize=64)
def _answer(max_tokens: int) -> tuple[tuple[int, ...], str]:
    return (tuple(TOKENS[i % len(TOKENS)] for i in range(max_tokens)),
            "".join(WORDS[i % len(WORDS)] for i in range(max_tokens)))


def _params_values(params: Any) -> tuple[int, int]:
    max_tokens = getattr(params, "max_tokens", None) or DEFAULT_MAX_TOKENS
    return max(1, int(max_tokens)), max(1, int(getattr(params, "n", 1) or 1))


def finished_output(request_id: str, prompt_token_ids: list[int], max_tokens: int, n: int,
                    stop_percent: int = 0) -> SimpleNamespace:
    """A RequestOutput-shaped answer: n completions of max_tokens tokens each, cut off by max_tokens; with
    `stop_percent`, that share of the requests (by a hash of the request id) ends by a stop instead (the same
    tokens, finish_reason "stop"), as most of a real job's outputs do."""
    token_ids, text = _answer(max_tokens)
    finish = "stop" if stop_percent and zlib.crc32(request_id.encode()) % 100 < stop_percent else "length"
    return SimpleNamespace(
        request_id=request_id, finished=True, prompt_token_ids=prompt_token_ids,
        outputs=[SimpleNamespace(index=index, token_ids=list(token_ids), text=text,
                                 cumulative_logprob=-0.5 * max_tokens, finish_reason=finish, stop_reason=None,
                                 logprobs=None)
                 for index in range(n)])


def _prompt_ids(prompt: Any) -> list[int]:
    if isinstance(prompt, dict):
        return prompt["prompt_token_ids"]
    return prompt.prompt_token_ids


class StandInEngine:
    """vLLM's LLMEngine surface: requests go in with add_request, and the next step() returns them all finished."""

    def __init__(self, stop_percent: int = 0) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[list[int], int, int]] = {}  # request id -> (prompt ids, max_tokens, n)
        self.added = self.steps = self.busy_steps = self.aborted = 0
        self.stop_percent = stop_percent  # outputs that end by a stop (finished_output)

    def add_request(self, request_id: str, prompt: Any, params: Any, *args: Any, **kwargs: Any) -> str:
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a string, got {type(request_id)}")
        max_tokens, n = _params_values(params)
        with self._lock:
            if request_id in self._pending:
                raise ValueError(f"request {request_id} is already running")
            self._pending[request_id] = (_prompt_ids(prompt), max_tokens, n)
            self.added += 1
        return request_id

    def step(self) -> list[SimpleNamespace]:
        with self._lock:
            pending, self._pending = self._pending, {}
            self.steps += 1
            self.busy_steps += bool(pending)
        return [finished_output(rid, ids, max_tokens, n, self.stop_percent)
                for rid, (ids, max_tokens, n) in pending.items()]

    def has_unfinished_requests(self) -> bool:
        return bool(self._pending)

    def get_num_unfinished_requests(self) -> int:
        return len(self._pending)

    def abort_request(self, request_ids: Any, internal: bool = False) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        with self._lock:
            for rid in ids:
                if self._pending.pop(rid, None) is not None:
                    self.aborted += 1


class BatchingStandInEngine(StandInEngine):
    """A stand-in that batches like vLLM: at most `running` requests run at once, each step takes `step_seconds` and
    gives each running request one token, so a request of max_tokens takes max_tokens steps. `cut_percent` of the
    requests (by a hash of the request id) are cut off at their budget; the others stop at 60% of it. Counts the
    tokens its steps made (`tokens`) and when the last output came (`last_output_at`, perf_counter); says its
    max_num_seqs as vLLM's engine does (`vllm_config`), so the flow's stream knows how full it is."""

    def __init__(self, step_seconds: float, cut_percent: int = 15, running: int = 1024) -> None:
        super().__init__()
        self.step_seconds, self.cut_percent, self.running = step_seconds, cut_percent, running
        self.vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=running))
        self._running: OrderedDict[str, list[Any]] = OrderedDict()
        self.tokens = 0
        self.last_output_at = 0.0

    def step(self) -> list[SimpleNamespace]:
        time.sleep(self.step_seconds)
        with self._lock:
            for request_id in list(self._pending):
                if len(self._running) >= self.running:
                    break
                ids, max_tokens, n = self._pending.pop(request_id)
                cut = zlib.crc32(request_id.encode()) % 100 < self.cut_percent
                length = max_tokens if cut else max(1, int(0.6 * max_tokens))
                self._running[request_id] = [ids, max_tokens, n, length, length]
            done = []
            for request_id, request in list(self._running.items()):
                request[4] -= 1
                if request[4] <= 0:
                    done.append((request_id, request))
                    del self._running[request_id]
            self.steps += 1
            self.busy_steps += bool(done)
            self.tokens += len(self._running) + len(done)
        if done:
            self.last_output_at = time.perf_counter()
        outputs = []
        for request_id, (ids, max_tokens, n, length, _) in done:
            output = finished_output(request_id, ids, max_tokens, n)
            if length < max_tokens:
                for completion in output.outputs:
                    completion.token_ids = completion.token_ids[:length]
                    completion.text, completion.finish_reason = completion.text[:4 * length], "stop"
            outputs.append(output)
        return outputs

    def has_unfinished_requests(self) -> bool:
        return bool(self._pending) or bool(self._running)

    def get_num_unfinished_requests(self) -> int:
        return len(self._pending) + len(self._running)

    def abort_request(self, request_ids: Any, internal: bool = False) -> None:
        super().abort_request(request_ids, internal)
        with self._lock:
            for request_id in [request_ids] if isinstance(request_ids, str) else list(request_ids):
                if self._running.pop(request_id, None) is not None:
                    self.aborted += 1


def calibrated_work(seconds: float) -> int:
    """How many rounds of HoldingCore's step work (sum(range(100))) take `seconds` here, alone."""
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < 0.5:
        sum(range(100))
        count += 1
    return max(1, int(count * seconds / 0.5))


class HoldingCore:
    """vLLM's LLMEngine surface for measuring the engine process's own loop (benchmarks/results/cpu-idle-readers/,
    cpu-spare-traffic/): it holds every request it is given, and `held` of its own, and finishes none; each step
    is `work` rounds of pure Python work (a fixed amount, not a fixed time: the interpreter lock may be taken
    away), then `sleep` seconds with the lock released (a front end waiting for its engine core, as on a GPU).
    Says `max_num_seqs` as vLLM's engine does when given. When each step started: `times` (perf_counter)."""

    def __init__(self, work: int, sleep: float = 0.0, held: int = 0, max_num_seqs: int | None = None):
        self.work, self.sleep = work, sleep
        self.pending: set[str] = {f"held-{i}" for i in range(held)}
        self.times: list[float] = []
        self.model_config = SimpleNamespace(max_model_len=2048, dtype="float32")
        if max_num_seqs is not None:
            self.vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs))

    def add_request(self, request_id: str, prompt: Any, params: Any, **kwargs: Any) -> None:
        self.pending.add(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending)

    def get_num_unfinished_requests(self) -> int:
        return len(self.pending)

    def abort_request(self, request_ids: list[str], internal: bool = False) -> None:
        self.pending.difference_update(request_ids)

    def step(self) -> list[Any]:
        self.times.append(time.perf_counter())
        for _ in range(self.work):
            sum(range(100))
        if self.sleep:
            time.sleep(self.sleep)
        return []


class StandInLLM:
    """vllm.LLM's surface used by the flow; holds nothing between calls. `engine`: its llm_engine (a StandInEngine
    unless given)."""

    def __init__(self, engine: StandInEngine | None = None, stop_percent: int = 0) -> None:
        self.llm_engine = engine if engine is not None else StandInEngine(stop_percent)
        self.generate_calls = 0
        self._ids = itertools.count()

    @property
    def calls(self) -> int:
        """Engine calls that answered something: generate calls and steps that returned outputs."""
        return self.generate_calls + self.llm_engine.busy_steps

    def reset_counts(self) -> None:
        self.generate_calls = 0
        engine = self.llm_engine
        engine.added = engine.steps = engine.busy_steps = engine.aborted = 0

    def generate(self, prompts: Any, sampling_params: Any = None, use_tqdm: Any = False, **kwargs: Any) -> list:
        self.generate_calls += 1
        prompts = [prompts] if isinstance(prompts, dict) else list(prompts)
        params = sampling_params if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(prompts)
        return [finished_output(str(next(self._ids)), _prompt_ids(prompt), *_params_values(p),
                                self.llm_engine.stop_percent) for prompt, p in zip(prompts, params)]

    def get_tokenizer(self) -> Any:
        from batchgen.models import default_model_path

        return _tokenizer(str(default_model_path()))

    def reset_prefix_cache(self) -> bool:
        return True


@functools.lru_cache(maxsize=2)
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def standin_engine(llm: StandInLLM) -> SimpleNamespace:
    """What batchgen.engine.get_engine returns (llm, model, args, max_model_len, load_seconds, stream), around llm.

    `stream` is batchgen.stream.EngineStream over the stand-in's llm_engine where that module exists; without
    it the flow calls llm.generate, and the object carries no stream."""
    from batchgen.engine import engine_args, on_cpu
    from batchgen.job import EngineSpec
    from batchgen.models import model_max_len, resolve_model

    model = resolve_model(None)
    engine = SimpleNamespace(llm=llm, model=model, args=engine_args(EngineSpec(), model, on_cpu()),
                             max_model_len=model_max_len(model.path) or 2048, load_seconds=0.0)
    try:
        from batchgen.stream import EngineStream
    except ImportError:
        return engine
    engine.stream = EngineStream(llm.llm_engine)
    engine.dtype = "float32"
    engine.run = lambda fn, *args: engine.stream.call(lambda: fn(llm, *args))  # batchgen.engine.Engine.run
    return engine


def install(llm: StandInLLM) -> SimpleNamespace:
    """Make every engine the flow asks for the stand-in: `get_engine` of batchgen.engine (for modules that
    import it later) and of tasks.generate (which imported it already). Call before importing the flow."""
    import batchgen.engine

    engine = standin_engine(llm)

    def get_engine(spec: Any) -> SimpleNamespace:
        return engine

    batchgen.engine.get_engine = get_engine
    import tasks.generate

    tasks.generate.get_engine = get_engine
    return engine


def batching_standin() -> BatchingStandInEngine:
    """The BatchingStandInEngine of the ad-hoc retry-chain measurements: its step STEP seconds (default 0.05) and
    CUT% (default 15) cut off, from the environment."""
    import os

    return BatchingStandInEngine(float(os.environ.get("STEP", "0.05")), int(os.environ.get("CUT", "15")))


def retry_bench_job(items: int, work: Any, default_max_tokens: int) -> Any:
    """The benchmark's job over `items` products (written into the folder `work`) at MAXTOK tokens (default
    `default_max_tokens`), with windows in flight 3 and the example job's retries (grow x2 up to 320 tokens, 2
    passes, in the stream)."""
    import os

    from benchmarks import run as bench

    job = bench.bench_job(bench.write_products(work / "p.csv", items), work / "out",
                          int(os.environ.get("MAXTOK", str(default_max_tokens))))
    retry = job.retry.model_copy(update={"max_passes": 2, "in_stream": True, "strategy": "grow", "growth_factor": 2,
                                         "max_tokens_cap": 320})
    return job.model_copy(update={"windows_in_flight": 3, "retry": retry})


def ahead_runs(job: Any, work: Any, repeats: int) -> Iterator[tuple[bool, Any]]:
    """(retry.ahead, the job with it and an output folder of its own) for `repeats` rounds of ahead off and on,
    alternating which goes first (cpu-retry-ahead/)."""
    for rep in range(repeats):
        for ahead in ((False, True) if rep % 2 == 0 else (True, False)):
            yield ahead, job.model_copy(update={
                "retry": job.retry.model_copy(update={"ahead": ahead}),
                "output": job.output.model_copy(update={"dir": str(work / f"out-{rep}-{ahead}")})})


def measured_run(llm: StandInLLM, flow: Any, job: Any) -> dict[str, Any]:
    """One run of `flow` (flows.batch_generation.batch_generation) on `job` with `llm`'s BatchingStandInEngine, as
    the ad-hoc retry-chain scripts print it: its wall time, the time after the engine's last output, the engine's
    steps and tokens (dropped spares' included), the items, those accepted, and the generate task's seconds."""
    engine = llm.llm_engine
    steps, tokens = engine.steps, engine.tokens
    started = time.perf_counter()
    manifest = flow(job)
    wall = time.perf_counter() - started
    return {"wall": round(wall, 2), "after_last_output": round(started + wall - engine.last_output_at, 2),
            "engine_steps": engine.steps - steps, "engine_tokens": engine.tokens - tokens,
            "items": manifest.counts.items, "accepted": manifest.counts.accepted,
            "generate": round(manifest.timings_seconds["generate"], 2)}


def batching_retry_bench(default_max_tokens: int) -> tuple[StandInLLM, Any, Any, int]:
    """The set-up of the ad-hoc measurements of retry chains (benchmarks/results/cpu-window-threads/,
    cpu-retry-ahead/), called by their scripts before they import the flow: a BatchingStandInEngine installed
    (`batching_standin`), and `retry_bench_job` over argv[1] items. Returns (the stand-in, the job, a fresh work
    folder, argv[2] repeats)."""
    import sys
    import tempfile
    from pathlib import Path

    llm = StandInLLM(batching_standin())
    install(llm)
    work = Path(tempfile.mkdtemp())
    return llm, retry_bench_job(int(sys.argv[1]), work, default_max_tokens), work, int(sys.argv[2])
