"""Python's thread switch interval in the engine's processes, changed while the engine runs
(`benchmarks.run --flow-variants switch05`): in the process where vLLM's front end runs (batchgen's engine process
on a GPU, the run's own where the front end runs there) and in vLLM's engine core, through a worker extension
(vLLM's `worker_extension_cls`, which `collective_rpc` reaches by name). With one GPU the worker runs in the
engine core's process, so the extension sets the core's interval (vLLM's CPU build, as batchgen runs it, keeps its
engine core in the front end's process: one process, one interval). `--engine-switch-interval` sets one interval
for every method before the engine is built; a variant compares two on the same engine, in the same repeats.
"""

from __future__ import annotations

import os
import sys
from typing import Any

EXTENSION = "benchmarks.switch_interval.SwitchInterval"  # engine.extra_args.worker_extension_cls


class SwitchInterval:
    """Mixed into vLLM's worker class by `worker_extension_cls`."""

    def batchgen_switch_interval(self, seconds: float | None = None) -> dict[str, Any]:
        """The worker's process and its interval before; set to `seconds` if given."""
        return _here(seconds)


def _here(seconds: float | None = None) -> dict[str, Any]:
    before = {"pid": os.getpid(), "interval": sys.getswitchinterval()}
    if seconds is not None:
        sys.setswitchinterval(seconds)
    return before


def read(llm: Any) -> dict[str, Any]:
    """Where the front end runs and each worker's process: the process and its interval (for `Engine.run` and
    `ProcessEngine.run`, which call it with the engine's `vllm.LLM` in the front end's process)."""
    return {"front_end": _here(), "engine_core": llm.collective_rpc("batchgen_switch_interval")}


def swap(llm: Any, front_end: float, engine_core: float | None = None) -> dict[str, Any]:
    """Set the interval where the front end runs to `front_end` and in the workers' processes to `engine_core`
    (the same if not given); returns what they were (`read`'s shape), for `restore`."""
    front = _here()  # before the workers': where vLLM runs its engine core in this process, they are one
    core = llm.collective_rpc("batchgen_switch_interval", args=(front_end if engine_core is None else engine_core,))
    sys.setswitchinterval(front_end)
    return {"front_end": front, "engine_core": core}


def restore(llm: Any, before: dict[str, Any]) -> dict[str, Any]:
    """Set back what `swap` returned; returns `read` after."""
    swap(llm, before["front_end"]["interval"], before["engine_core"][0]["interval"])
    return read(llm)
