import pickle, random, time
import numpy as np, pandas as pd
from batchgen.retry import latest_attempts
def old(attempts):
    if attempts.empty: return attempts
    ordered = attempts.sort_values(["item_id", "candidate", "attempt"], kind="stable")
    return ordered.groupby(["item_id", "candidate"], sort=False).tail(1).reset_index(drop=True)
job, window, prompts, engine, validated = pickle.load(open("/tmp/acct/window.pkl", "rb"))
att = pd.concat([v.rows for v in validated], ignore_index=True)
pd.testing.assert_frame_equal(old(att), latest_attempts(att)); print("real window same")
sh = att.sample(frac=1, random_state=1).reset_index(drop=True)
pd.testing.assert_frame_equal(old(sh), latest_attempts(sh)); print("shuffled same")
rng = random.Random(0)
alphabet = ["a", "b", "ab", "B", "é", "z1", "z10", "z2", "中", "😀", ""]
for trial in range(500):
    n = rng.randint(1, 60)
    ids = [rng.choice(alphabet) + rng.choice(alphabet) for _ in range(n)]
    frame = pd.DataFrame({"item_id": ids, "candidate": [rng.randint(0, 2) for _ in range(n)],
                          "attempt": [rng.randint(1, 3) for _ in range(n)], "text": [f"t{i}" for i in range(n)]})
    if trial % 2:
        frame["item_id"] = frame["item_id"].astype("string[pyarrow]")
    if trial % 3 == 0:
        frame["item_id"] = frame["item_id"].astype(pd.StringDtype("pyarrow", na_value=np.nan))
    pd.testing.assert_frame_equal(old(frame), latest_attempts(frame))
print("500 random same")
ints = pd.DataFrame({"item_id": [3, 1, 2, 1], "candidate": [0, 0, 0, 0], "attempt": [1, 1, 1, 2]})
pd.testing.assert_frame_equal(old(ints), latest_attempts(ints)); print("int ids (fallback) same")
empty = att.iloc[:0]
assert latest_attempts(empty) is empty
def t(f, n=21):
    ts=[]
    for _ in range(n):
        s=time.perf_counter(); f(att); ts.append(time.perf_counter()-s)
    return 1000*sorted(ts)[n//2]
print(f"old {t(old):.2f} ms new {t(latest_attempts):.2f} ms")
