import pickle, time, dataclasses, random, json
import pandas as pd, pyarrow as pa
from batchgen.schema import frame_input_codec, _codec
from batchgen.publish import frame_tables
from batchgen.assemble import assemble
from batchgen.retry import latest_attempts
job, window, prompts, engine, validated = pickle.load(open("/tmp/acct/window.pkl", "rb"))
struct, codec = frame_input_codec(window.items, window.columns, [])
attempts = pd.concat([v.rows for v in validated], ignore_index=True)
r = assemble(window.items, window.columns, window.rejected + prompts.built.rejected, latest_attempts(attempts), job.sampling)
class old_encode:  # the previous way: each row's input encoded as a dict, then each column taken from the dicts
    def __init__(self, codec):
        self.codec = codec

    def columns(self, values, names):
        encoded = [self.codec(value) for value in values]
        return {name: [row.get(name) if row else None for row in encoded] for name in names}
new = frame_tables(r.accepted, r.rejected, attempts, (struct, codec), None)
old = frame_tables(r.accepted, r.rejected, attempts, (struct, old_encode(codec)), None)
for k in new: assert new[k].equals(old[k]) and new[k].schema.equals(old[k].schema, check_metadata=True), k
print("real window: same tables")
# a codec with JSON columns and missing inputs
items = pd.DataFrame({"a": [1, "x", None, 3], "b": [{"k": 1}, {"k": 2}, None, {"k": 3}], "c": ["u", "v", "w", None]})
struct2, codec2 = frame_input_codec(items, ["a", "b", "c"], [{"a": [1, 2], "d": "é"}])
print(struct2, sorted(codec2.as_json))
rows = [{"a": 1, "b": {"k": 1}, "c": "u"}, None, {}, {"a": "x", "d": "é"}, {"a": [1, 2], "b": None, "c": "中"}]
cols = codec2.columns(rows, codec2.names)
by_row = [codec2(v) for v in rows]
for name in codec2.names:
    assert cols[name] == [row.get(name) if row else None for row in by_row], name
print("columns == rows:", cols)
def t(f, n=21):
    ts=[]
    for _ in range(n):
        s=time.perf_counter(); f(); ts.append(time.perf_counter()-s)
    return 1000*sorted(ts)[n//2]
print("frame_tables new %.2f ms old %.2f ms" % (t(lambda: frame_tables(r.accepted, r.rejected, attempts, (struct, codec), None)),
      t(lambda: frame_tables(r.accepted, r.rejected, attempts, (struct, old_encode(codec)), None))))
