import pickle, time, dataclasses, gc, cProfile, pstats
import pandas as pd
from batchgen.schema import frame_input_codec
from batchgen.assemble import assemble
from batchgen.manifest import tally
from batchgen.retry import latest_attempts
job, window, prompts, engine, validated = pickle.load(open("/tmp/acct/window.pkl", "rb"))
attempts = pd.concat([v.rows for v in validated], ignore_index=True)
result = assemble(window.items, window.columns, window.rejected + prompts.built.rejected, latest_attempts(attempts), job.sampling)
gc.collect(); gc.freeze()
ts = []
for _ in range(15):
    t = time.perf_counter(); tally(result.accepted, result.rejected, attempts); ts.append(time.perf_counter() - t)
print("tally median %.2f ms" % (sorted(ts)[7] * 1000))
pr = cProfile.Profile(); pr.enable()
for _ in range(20): tally(result.accepted, result.rejected, attempts)
pr.disable(); pstats.Stats(pr).sort_stats("cumulative").print_stats(18)
print(attempts.dtypes.to_string())
