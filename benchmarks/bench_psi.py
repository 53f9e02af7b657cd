"""PSI cost and the whole a9a own-data run (docs/benchmarks.md, "Own data and PSI").

    python benchmarks/bench_psi.py --psi-n 1000000                # PSI, 1M x 1M IDs
    python benchmarks/bench_psi.py --psi-n 0 --a9a                 # the a9a own-data run only

PSI: the label owner's request, one party's answer (its whole cost), the label owner's
matching, and the bytes of every message, for each setup structure. a9a: the three-file
export of the issue (5 % of rows missing at one party, extra rows at another), PSI-aligned,
trained and saved through the Flower path in process (LocalGrid), then a predict job on
a9a.t; wall time per phase.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS  # noqa: E402


def bench_psi(n: int, overlap: float, structures, seed=0) -> dict:
    from flower_vfl.io import psi as psi
    rng = np.random.default_rng(seed)
    owner = [f"id{v:09d}" for v in rng.permutation(n)]
    k = int(overlap * n)
    party = owner[:k] + [f"x{v:09d}" for v in range(n - k)]
    party = [party[i] for i in rng.permutation(n)]
    out = {"n_owner": n, "n_party": n, "overlap": k}
    t0 = time.perf_counter()
    lo = psi.LabelOwnerPSI(owner)
    request = lo.request()
    out["owner_request_s"] = time.perf_counter() - t0
    out["request_bytes"] = len(request)
    for st in structures:
        t0 = time.perf_counter()
        setup, response = psi.party_answer(party, request, fpr=1e-9, structure=st)
        t_party = time.perf_counter() - t0
        t0 = time.perf_counter()
        idx = lo.intersect(setup, response)
        t_match = time.perf_counter() - t0
        agreed = [owner[i] for i in idx]
        blob = psi.encode_ids(agreed)
        assert len(idx) >= k            # gcs / bloom may add false positives, never lose a match
        out[st] = {"party_answer_s": t_party, "owner_match_s": t_match, "setup_bytes": len(setup),
                   "response_bytes": len(response), "order_bytes": len(blob), "found": int(len(idx)),
                   "false_positives": int(len(idx) - k)}
        print(json.dumps({st: out[st]}), flush=True)
    return out


def bench_a9a(rounds: int) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from _own_data_helpers import node_configs, run_config, run_predict, run_train, write_a9a_files

    from flower_vfl.io.data import load_all
    X, y, Xt, yt = load_all("a9a")
    tmp = Path(tempfile.mkdtemp(prefix="bench-psi-"))
    res = {}
    t0 = time.perf_counter()
    train, score = write_a9a_files(tmp, X, y, Xt, "csv", n_extra=1000)
    res["write_files_s"] = time.perf_counter() - t0
    nodes = node_configs(train, score, "csv", tmp)
    rc = run_config(train, score, tmp, **{"max-rounds": rounds, "lam": 1e-4})
    t0 = time.perf_counter()
    st, _ = run_train(rc, nodes)
    res["train_job_s"] = time.perf_counter() - t0
    res["rounds"] = len(st.history_)
    res["n_aligned"] = int(st.central.n)
    res["admm_rounds_s"] = float(st.history_[-1].get("elapsed_s", float("nan")))
    t0 = time.perf_counter()
    pred = run_predict(rc, nodes)
    res["predict_job_s"] = time.perf_counter() - t0
    ids = np.array([int(i[1:]) for i in pred["ids"]])
    res["n_scored"] = len(ids)
    res["test_accuracy"] = float(np.mean(pred["labels"] == yt[ids]))
    print(json.dumps(res), flush=True)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--psi-n", type=int, default=1_000_000, help="IDs on each side (0: skip)")
    ap.add_argument("--overlap", type=float, default=0.9)
    ap.add_argument("--structures", default="raw,gcs")
    ap.add_argument("--a9a", action="store_true", help="also the whole a9a own-data run")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--out", default=str(RESULTS / "bench_psi.json"))
    args = ap.parse_args(argv)
    import os
    res = {"machine": {"cpus": os.cpu_count()}}
    if args.psi_n:
        res["psi"] = bench_psi(args.psi_n, args.overlap, args.structures.split(","))
    if args.a9a:
        res["a9a"] = bench_a9a(args.rounds)
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
