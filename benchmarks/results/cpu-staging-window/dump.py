import sys, functools, pickle, runpy
import tasks.publish as tp
orig = tp.stage_window_task.fn
seen = []
@functools.wraps(orig)
def st(job, publication, window, prompts, engine, validated):
    if len(window.items) >= 1500 and not seen:
        seen.append(1)
        try:
            import dataclasses; pickle.dump((job, dataclasses.replace(window, inputs=None), prompts, engine, validated), open("/tmp/acct/window.pkl", "wb"))
            print("DUMPED", len(window.items), file=sys.stderr)
        except Exception as e:
            print("DUMP FAILED", e, file=sys.stderr)
    return orig(job, publication, window, prompts, engine, validated)
tp.stage_window_task.fn = st
runpy.run_module("benchmarks.pipeline_only", run_name="__main__")
