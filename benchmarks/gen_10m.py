"""Synthetic sparse vertical data at scale (issue 24 item 4), written as the files the parties read.

N rows (default 10,000,000) of 123 binary columns in a9a's LIBSVM layout (``a9a`` + ``a9a.t`` in
``--out``), so that the bundled-dataset loader of every real node reads it from its node config's
``data-dir`` (``dataset=a9a``; ``flower_vfl.io.data``: 123 columns, split into M contiguous column
blocks, ``column_ranges``), with its block cache after the first parse (``io/party_cache.py``).
Why not the own-data route (CSV / Parquet / LIBSVM files with an ID column): it aligns rows by
ECDH-PSI first, ~2.6 min of one core per million IDs per party (docs/benchmarks.md, "Own data
and PSI"), i.e. hours at 10M on this 2-core machine before the first round.

Each row has ``--nnz`` distinct ones in each of the ``--parties`` column blocks (default 3 of
the ~31 columns of each of 4 parties: 12 nonzeros a row, a9a has ~14); labels in {-1, +1} from
a planted linear model plus logistic noise (about 75-80 % of them predictable). Generated in
chunks of ``--chunk`` rows (memory ~ chunk x block width x 8 bytes), with progress printed.
The held-out file ``a9a.t`` has ``--n-test`` rows (default min(N / 10, 100,000)) of the same model.

    python benchmarks/gen_10m.py --rows 10000000 --out /tmp/vfl10m/10m
    python benchmarks/gen_10m.py --rows 1000000 --out /tmp/vfl10m/1m

Keep the output outside the repository (~65 bytes a row: 0.65 GB at 10M).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

N_FEATURES = 123          # a9a's, what the bundled loader reads


def ranges(parties: int):
    from flower_vfl.io.data import column_ranges
    return column_ranges("a9a", N_FEATURES, parties)


def write_file(path: Path, n_rows: int, parties: int, nnz: int, chunk: int, seed: int, w: np.ndarray) -> dict:
    """``n_rows`` LIBSVM lines into ``path`` (atomically); returns counts."""
    rng = np.random.default_rng(seed)
    blocks = ranges(parties)
    tokens = np.array([f"{j + 1}:1" for j in range(N_FEATURES)], dtype=object)
    tmp = path.with_suffix(".tmp")
    pos = 0
    t0 = time.time()
    with open(tmp, "w") as fh:
        for start in range(0, n_rows, chunk):
            rows = min(chunk, n_rows - start)
            cols = []
            for a, b in blocks:
                # nnz distinct columns of the block per row: the first nnz of a random permutation
                keys = rng.random((rows, b - a))
                pick = np.argpartition(keys, nnz - 1, axis=1)[:, :nnz] if nnz < b - a else \
                    np.tile(np.arange(b - a), (rows, 1))
                cols.append(np.sort(pick, axis=1) + a)
            C = np.concatenate(cols, axis=1)
            f = w[C].sum(axis=1) / np.sqrt(C.shape[1]) * 2.0
            y = np.where(rng.random(rows) < 1.0 / (1.0 + np.exp(-f)), "+1", "-1")
            pos += int((y == "+1").sum())
            T = tokens[C]
            fh.write("\n".join(lab + " " + " ".join(r) for lab, r in zip(y.tolist(), T.tolist())))
            fh.write("\n")
            done = start + rows
            print(f"  {path.name}: {done:,}/{n_rows:,} rows ({time.time() - t0:.0f} s)", flush=True)
    os.replace(tmp, path)
    return {"rows": n_rows, "positive": pos, "bytes": path.stat().st_size}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--n-test", type=int, default=None)
    ap.add_argument("--parties", type=int, default=4)
    ap.add_argument("--nnz", type=int, default=3, help="ones per row in each party's column block")
    ap.add_argument("--chunk", type=int, default=500_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    if ROOT in out.parents or out == ROOT:
        ap.error(f"--out {out} is inside the repository; write the data elsewhere (e.g. /tmp)")
    out.mkdir(parents=True, exist_ok=True)
    n_test = args.n_test if args.n_test is not None else min(args.rows // 10, 100_000)
    w = np.random.default_rng(args.seed + 1000).normal(size=N_FEATURES)    # the planted model
    t0 = time.time()
    meta = {"rows": args.rows, "n_test": n_test, "parties": args.parties, "nnz_per_party": args.nnz,
            "ranges": ranges(args.parties), "seed": args.seed}
    meta["train"] = write_file(out / "a9a", args.rows, args.parties, args.nnz, args.chunk, args.seed, w)
    meta["test"] = write_file(out / "a9a.t", n_test, args.parties, args.nnz, args.chunk, args.seed + 1, w)
    meta["seconds"] = round(time.time() - t0, 1)
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
