"""What spare requests' traffic costs the engine process's loop: each spare retry (retry.ahead) is a submission of
one request, sent, held in the stream's spare list while the engine is full, then withdrawn (or promoted).

    .venv/bin/python benchmarks/results/cpu-spare-traffic/spare_traffic_ab.py 0 100 300

A real engine process (batchgen.engine_process.ProcessEngine) with a stand-in engine (max_num_seqs 64, always
holding 64 requests, so spares wait as in a full engine) whose step is a fixed amount of Python work (2 ms alone,
calibrated once) and then SLEEP ms with the interpreter lock released (vLLM's front end waiting for the GPU's
engine core). The run's process sends R spares per second for 3 s, each withdrawn 0.1 s after it was sent, and
the engine's steps per second over those 3 s are counted. One JSON line per run. With TREE=/path the engine process
imports batchgen from that tree instead (a tree before a change, for an A/B). An ad-hoc measurement kept with its
figures (README.md)."""
import json
import os
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
TREE = Path(os.environ.get("TREE") or HERE.parents[2])
sys.path.insert(0, str(TREE))
STEP_SECONDS = 0.002
WORK = int(os.environ.get("SPARE_TRAFFIC_WORK") or 0)
SLEEP = float(os.environ.get("SLEEP_MS") or 0) / 1000


class FullLLM:
    """The factory the engine process builds: an engine that says max_num_seqs 64 and always holds 64 requests."""

    def __init__(self):
        from benchmarks.standin import HoldingCore

        self.llm_engine = core = HoldingCore(WORK, SLEEP, held=64, max_num_seqs=64)
        # at shutdown (the engine process stopping), the step times go to the file the run's process named
        core.engine_core = SimpleNamespace(shutdown=lambda: Path(os.environ["STEP_TIMES"]).write_text(
            json.dumps(core.times)))


def measure(rate: int) -> dict:
    from batchgen.engine_process import ProcessEngine
    from batchgen.models import ModelRef
    from benchmarks.standin import calibrated_work

    os.environ.setdefault("SPARE_TRAFFIC_WORK", str(calibrated_work(STEP_SECONDS)))
    times_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"spare-traffic-{os.getpid()}.json"
    os.environ["STEP_TIMES"] = str(times_file)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), str(TREE)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    engine = ProcessEngine(ModelRef(name="full", path="/full"), {}, {}, factory="spare_traffic_ab:FullLLM")
    try:
        engine.stream.submit([{"prompt_token_ids": [0]}], [None])  # the engine steps from here on
        time.sleep(1.0)
        sent, started = [], time.perf_counter()
        while (now := time.perf_counter()) < started + 3.0:
            due = int((now - started) * rate)
            while len(sent) < due:
                sent.append((time.perf_counter(), engine.stream.submit([{"prompt_token_ids": [len(sent)]}], [None],
                                                                       spare=True)))
            while sent and sent[0][0] < now - 0.1 and sent[0][1] is not None:
                sent[0][1].withdraw()
                sent.append((0.0, None))  # keep the count; withdrawn ones are replaced by markers
                sent.pop(0)
            time.sleep(0.002)
        ended = time.perf_counter()
    finally:
        engine.close()
    times = json.loads(times_file.read_text())
    times_file.unlink()
    steps = sum(started <= t < ended for t in times)
    return {"rate": rate, "sent": len(sent), "sleep_ms": SLEEP * 1000, "tree": TREE.name,
            "steps_per_s": round(steps / (ended - started), 1)}


def main() -> None:
    rates = [int(a) for a in sys.argv[1:]] or [0, 100, 300]
    for rate in rates:
        print(json.dumps(measure(rate)), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    import spare_traffic_ab

    spare_traffic_ab.main()
