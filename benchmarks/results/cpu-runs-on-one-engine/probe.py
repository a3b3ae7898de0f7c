"""For Engine.run and the flow's process: what a process holds (benchmarks/results/cpu-runs-on-one-engine/runs.py)."""
import gc
import resource
import threading


def heap(llm=None, collect=False):
    if collect:
        gc.collect()
    out = {"objects": len(gc.get_objects()), "frozen": gc.get_freeze_count(), "threads": threading.active_count(),
           "collections": [g["collections"] for g in gc.get_stats()],
           "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
           "thread_names": sorted({t.name.rstrip("0123456789-") for t in threading.enumerate()})}
    if llm is not None:
        from batchgen.engine_process import _STREAMS
        s = _STREAMS[id(llm)]
        out.update(routes=len(s._routes), adding=len(s._adding), spare=len(s._spare), deferred=len(s._deferred))
        eng = llm.llm_engine
        op = getattr(eng, "output_processor", None)
        if op is not None:
            out["output_processor_states"] = len(getattr(op, "request_states", {}))
    return out
