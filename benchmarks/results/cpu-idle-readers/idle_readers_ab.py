"""The engine process's loop beside idle readers: every submission has a forwarder thread there, reading its outputs
with Submission.batches(SEND_ITEMS, SEND_SECONDS). Before 2026-12-04 an idle reader woke every SEND_SECONDS (20 ms);
now it sleeps until the next output. This measures what that cost the engine's own loop.

    .venv/bin/python benchmarks/results/cpu-idle-readers/idle_readers_ab.py 1 8 32 128

A real engine process (batchgen.engine_process.ProcessEngine) with a stand-in engine whose step is a fixed amount
of pure Python work (2 ms alone, calibrated once; as vLLM's front end is on a fast GPU) and never finishes its requests; K submissions of one request
each are held open (K idle forwarders), then the engine's steps over 3 s are counted. Each K runs with the
readers as they are now and as they were (`Submission.batches` of the tree before, put back in the engine
process), alternating. One JSON line per run. An ad-hoc measurement kept with its figures (README.md)."""
import json
import os
import queue
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

STEP_SECONDS = 0.002


WORK = int(os.environ.get("IDLE_READERS_WORK") or 0)  # set by the parent (calibrated once, the same for every run)


def polling_batches(self, max_items, max_seconds, urgent=None, urgent_seconds=0.0):
    """Submission.batches as it was before 2026-12-04 (an idle reader woke every max_seconds)."""
    from batchgen.stream import StreamError

    batch = []
    deadline = time.monotonic() + max_seconds
    while self.received < self.total:
        timeout = deadline - time.monotonic()
        try:
            got = self._outputs.get(timeout=max(timeout, 0.0)) if timeout > 0 else self._outputs.get_nowait()
        except queue.Empty:
            got = None
        if isinstance(got, BaseException):
            raise StreamError(f"the engine failed: {type(got).__name__}: {got}") from got
        if got is not None:
            self.received += 1
            batch.append(got)
        if batch and (len(batch) >= max_items or time.monotonic() >= deadline or self.received == self.total):
            yield batch
            batch = []
            deadline = time.monotonic() + max_seconds
        elif got is None:
            deadline = time.monotonic() + max_seconds
    if batch:
        yield batch


def step_times(llm) -> list[float]:
    """For Engine.run (once the engine is idle): when each step started (perf_counter, the same clock here)."""
    return list(llm.llm_engine.times)


class BusyLLM:
    """The factory the engine process builds (`ProcessEngine(..., factory=...)`)."""

    def __init__(self):
        if os.environ.get("POLLING_READERS") == "1":
            import batchgen.stream

            batchgen.stream.Submission.batches = polling_batches
        from benchmarks.standin import HoldingCore

        self.llm_engine = HoldingCore(WORK)


def measure(readers: int, polling: bool) -> dict:
    from batchgen.engine_process import ProcessEngine
    from batchgen.models import ModelRef
    from benchmarks.standin import calibrated_work

    os.environ["POLLING_READERS"] = "1" if polling else "0"
    os.environ.setdefault("IDLE_READERS_WORK", str(calibrated_work(STEP_SECONDS)))
    here = str(Path(__file__).resolve().parent)  # the engine process imports this file as idle_readers_ab
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    engine = ProcessEngine(ModelRef(name="busy", path="/busy"), {}, {}, factory="idle_readers_ab:BusyLLM")
    try:
        held = [engine.stream.submit([{"prompt_token_ids": [i]}], [None]) for i in range(readers)]
        time.sleep(1.0)  # every request in, every forwarder waiting
        started = time.perf_counter()
        time.sleep(3.0)
        ended = time.perf_counter()
        for submission in held:
            submission.cancel()
        times = engine.run(step_times)  # once the cancelled requests are out: the engine is idle
        steps = sum(started <= t < ended for t in times)
        return {"readers": readers, "polling": polling, "steps_per_s": round(steps / (ended - started), 1)}
    finally:
        engine.close()


def main() -> None:
    counts = [int(a) for a in sys.argv[1:]] or [1, 8, 32, 128]
    for k in counts:
        for polling in (False, True, True, False):
            print(json.dumps(measure(k, polling)), flush=True)


if __name__ == "__main__":  # run as this module's own name, so that the engine process can import step_times
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import idle_readers_ab

    idle_readers_ab.main()
