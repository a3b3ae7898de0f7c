"""The engine process's loop while its forwarders send finished outputs back: each submission has a forwarder thread
there. Before 2026-12-05 it read with Submission.batches(SEND_ITEMS, SEND_SECONDS), which wakes it at each output
the loop puts; now with Submission.periodic_batches(SEND_ITEMS, SEND_SECONDS), which wakes it at most once per
SEND_SECONDS. This measures what the wake-ups cost the engine's own loop.

    .venv/bin/python benchmarks/results/cpu-forward-period/forward_ab.py [ROUNDS]

A real engine process (batchgen.engine_process.ProcessEngine) with a stand-in front end (`FinishingCore`) whose
step is a fixed amount of pure Python work (3 ms alone, calibrated once: a front end detokenizing its running
sequences), then 30 ms with the interpreter lock released (waiting for its engine core, as on a GPU), then it
finishes FINISH of its requests (40-token outputs) as vLLM finishes those that hit a stop: the 80-token example job
on the H200 finished ~17 outputs a step. Three submissions of 2,048 requests (three windows in flight) are sent
from this process and read back as the flow reads them; the time to the last output and the engine's steps are
recorded. Both ways alternate, ROUNDS times (default 3). One JSON line per run. An ad-hoc measurement kept with
its figures (README.md)."""
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

WORK_SECONDS, WAIT_SECONDS, FINISH, WINDOWS, ITEMS = 0.003, 0.030, 24, 3, 2048
WORK = int(os.environ.get("FORWARD_AB_WORK") or 0)  # set by the parent (calibrated once, the same for every run)


class FinishingCore:
    """vLLM's LLMEngine surface: holds its requests in order; each step is WORK rounds of Python, a wait with the
    lock released, then the FINISH oldest requests finished."""

    def __init__(self) -> None:
        self.pending: dict[str, None] = {}
        self.times: list[float] = []
        self.model_config = SimpleNamespace(max_model_len=2048, dtype="float32")

    def add_request(self, request_id, prompt, params, **kwargs) -> None:
        self.pending[request_id] = None

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending)

    def get_num_unfinished_requests(self) -> int:
        return len(self.pending)

    def abort_request(self, request_ids, internal=False) -> None:
        for request_id in [request_ids] if isinstance(request_ids, str) else request_ids:
            self.pending.pop(request_id, None)

    def step(self):
        from benchmarks.standin import finished_output

        self.times.append(time.perf_counter())
        for _ in range(WORK):
            sum(range(100))
        time.sleep(WAIT_SECONDS)
        done = list(self.pending)[:FINISH]
        for request_id in done:
            del self.pending[request_id]
        return [finished_output(request_id, [1, 2, 3], 40, 1, stop_percent=100) for request_id in done]


def step_times(llm) -> list[float]:
    return list(llm.llm_engine.times)


class FinishingLLM:
    """The factory the engine process builds; FORWARD_BY_OUTPUT=1 puts the forwarders' reading as it was."""

    def __init__(self):
        if os.environ.get("FORWARD_BY_OUTPUT") == "1":
            import batchgen.stream

            batchgen.stream.Submission.periodic_batches = batchgen.stream.Submission.batches
        self.llm_engine = FinishingCore()


def measure(by_output: bool) -> dict:
    from batchgen.engine_process import ProcessEngine
    from batchgen.models import ModelRef
    from benchmarks.standin import calibrated_work

    os.environ["FORWARD_BY_OUTPUT"] = "1" if by_output else "0"
    os.environ.setdefault("FORWARD_AB_WORK", str(calibrated_work(WORK_SECONDS)))
    here = str(Path(__file__).resolve().parent)  # the engine process imports this file as forward_ab
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    engine = ProcessEngine(ModelRef(name="finishing", path="/finishing"), {}, {}, factory="forward_ab:FinishingLLM")
    try:
        started = time.perf_counter()
        submissions = [engine.stream.submit([{"prompt_token_ids": [i]}] * ITEMS, [None] * ITEMS)
                       for i in range(WINDOWS)]
        wakeups = 0
        for submission in submissions:
            for batch in submission.batches(512, 1.0):
                wakeups += 1
        wall = time.perf_counter() - started
        times = engine.run(step_times)
        steps = len(times)
        period = (times[-1] - times[0]) / (steps - 1)
        return {"by_output": by_output, "outputs": WINDOWS * ITEMS, "steps": steps, "wall_s": round(wall, 3),
                "ms_per_step": round(1000 * period, 2),
                "loop_ms_beyond_its_work_and_wait": round(1000 * (period - WORK_SECONDS - WAIT_SECONDS), 2)}
    finally:
        engine.close()


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    for _ in range(rounds):
        for by_output in (False, True):
            print(json.dumps(measure(by_output)), flush=True)


if __name__ == "__main__":  # run as this module's own name, so that the engine process can import step_times
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import forward_ab

    forward_ab.main()
