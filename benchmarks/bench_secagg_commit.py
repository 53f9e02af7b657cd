"""What a secure-aggregation party's store costs at N rows (docs/benchmarks.md, 10M section):
seconds per ``PartyStore.commit_secagg`` (the masked uint64 answer and the float64 value under
its mask, one durable WAL transaction), seconds to read either back, and the state folder's size.

    python -W ignore benchmarks/bench_secagg_commit.py 10000000 3
"""
import sys, time, tempfile, os
import numpy as np
from flower_vfl.privacy.store import party_store
N, reps = int(sys.argv[1]), int(sys.argv[2])
d = tempfile.mkdtemp(prefix="bench-secagg-store-")
st = party_store(d)
rng = np.random.default_rng(0)
masked = rng.integers(0, 2**63, size=N, dtype=np.uint64)
value = rng.normal(size=N)
ts = []
for r in range(1, reps + 1):
    t = time.perf_counter()
    st.commit_secagg(0, 1, "train", f"k{r}", b"d" * 32, masked, {f"train/{r}": "a,b"}, lambda rec, prior: False, (r, value))
    ts.append(time.perf_counter() - t)
t = time.perf_counter(); got = st.secagg_plain(0, 1, "train"); tp = time.perf_counter() - t
t = time.perf_counter(); m = st.secagg_masked(0, 1, "train", f"k{reps}"); tm = time.perf_counter() - t
assert np.array_equal(got[1], value) and np.array_equal(m, masked)
size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
print(f"N={N}: commit {', '.join(f'{x:.2f}' for x in ts)} s; read the value {tp:.2f} s, the masked answer {tm:.2f} s; folder {size/1e6:.0f} MB")
st.close()
import shutil
shutil.rmtree(d)
