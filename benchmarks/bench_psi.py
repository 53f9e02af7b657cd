"""PSI cost and the whole a9a own-data run (docs/benchmarks.md, "Own data and PSI").

    python benchmarks/bench_psi.py --psi-n 1000000                # PSI, 1M x 1M IDs
    python benchmarks/bench_psi.py --psi-n 0 --a9a                 # the a9a own-data run only
    python benchmarks/bench_psi.py --psi-n 0 --flower-n 20000      # through Flower vs the library
    python benchmarks/bench_psi.py --psi-n 0 --loopback-n 1000000  # 1M x 1M on real nodes, loopback

PSI: the label owner's request, one party's answer (its whole cost), the label owner's
matching, and the bytes of every message, for each setup structure. a9a: the three-file
export of the issue (5 % of rows missing at one party, extra rows at another), PSI-aligned,
trained and saved through the Flower path in process (LocalGrid), then a predict job on
a9a.t; wall time per phase.
"""

from __future__ import annotations

import argparse
import json
import os
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


def _id_sets(n: int, overlap: float, seed=0):
    """The label owner's n IDs and a party's n IDs, ``overlap`` of them shared (both shuffled)."""
    rng = np.random.default_rng(seed)
    owner = [f"id{v:09d}" for v in rng.permutation(n)]
    k = int(overlap * n)
    party = owner[:k] + [f"x{v:09d}" for v in range(n - k)]
    return owner, [party[i] for i in rng.permutation(n)], k


def _own_files(tmp: Path, owner, party):
    """The label owner's labels file (ID, label, one column) and the party's file (ID, one
    column), CSV, as a deployment's own-data files (docs/own-data.md)."""
    lab = tmp / "owner.csv"
    with open(lab, "w") as fh:
        fh.write("id,label,f1\n")
        fh.writelines(f"{i},{j % 2},{(j % 7) / 7:.3f}\n" for j, i in enumerate(owner))
    par = tmp / "party.csv"
    with open(par, "w") as fh:
        fh.write("id,f2\n")
        fh.writelines(f"{i},{(j % 5) / 5:.3f}\n" for j, i in enumerate(party))
    return lab, par


def bench_psi_flower(n: int, overlap: float, pairs: int = 1, seed=0) -> dict:
    """Throughput of the PSI alignment through Flower (the label owner's
    :class:`~flower_vfl.strategies.psi_align.PSIAlignment` and the party's real ``query.psi_answer`` /
    ``query.psi_order`` ClientApp handlers, Flower Messages on the in-process LocalGrid: the party's
    file read, its PSI log, the order step) against openmined-psi called directly on the same IDs (the
    label owner's request, the party's setup and response, the label owner's intersection), alternated
    ``pairs`` times; IDs per second = the label owner's n / wall seconds."""
    from flwr.app import Context  # noqa: F401  (Flower present)

    from flower_vfl.apps import client as ca
    from flower_vfl.deploy.local_grid import LocalGrid
    from flower_vfl.strategies.psi_align import PSIAlignment
    import private_set_intersection.python as lib
    owner, party, k = _id_sets(n, overlap, seed)
    tmp = Path(tempfile.mkdtemp(prefix="bench-psi-flower-"))
    _, par = _own_files(tmp, owner, party)
    rows = {"direct_s": [], "flower_s": [], "load": []}
    for i in range(pairs):
        for mode in (("direct", "flower") if i % 2 == 0 else ("flower", "direct")):
            t0 = time.perf_counter()
            if mode == "direct":
                c = lib.client.CreateWithNewKey(True)
                req = c.CreateRequest(owner)
                srv = lib.server.CreateWithNewKey(True)
                setup = srv.CreateSetupMessage(1e-9, n, party, lib.DataStructure.RAW)
                got = len(c.GetIntersection(setup, srv.ProcessRequest(req)))
            else:
                node = {"partition-id": 0, "data-path": str(par), "psi-max-asked": 1e6,
                        "state-dir": str(tmp / f"state{i}")}
                grid = LocalGrid({"query.psi_answer": ca.HANDLERS["query.psi_answer"],
                                  "query.psi_order": ca.HANDLERS["query.psi_order"]},
                                 {100: node}, {"num-parties": 1, "label-column": "label"})
                got = len(PSIAlignment(owner, 1).run(grid).order)
            rows[f"{mode}_s"].append(time.perf_counter() - t0)
            assert got == k, (mode, got, k)
        rows["load"].append(os.getloadavg()[0])
        print(json.dumps({"pair": i + 1, "direct_s": rows["direct_s"][-1], "flower_s": rows["flower_s"][-1],
                          "load": rows["load"][-1]}), flush=True)
    ratios = [d / f for d, f in zip(rows["direct_s"], rows["flower_s"])]
    out = {"n_owner": n, "n_party": n, "overlap": k, **rows, "throughput_ratio_flower_over_direct": ratios,
           "ids_per_s_direct": [n / t for t in rows["direct_s"]], "ids_per_s_flower": [n / t for t in rows["flower_s"]]}
    print(json.dumps({"throughput ratio (Flower / library)": [round(r, 3) for r in ratios]}), flush=True)
    return out


def bench_psi_loopback(n: int, overlap: float, seed=0) -> dict:
    """n x n IDs end to end on real nodes on loopback: ``deploy_local`` (SuperLink, one SuperNode,
    TLS, registered keys, the warm executor), the own-data training job (``labels-path``: PSI of
    the training rows, then one ADMM round); the PSI exchanges' wall time and bytes from the central
    node's ``$FLOWER_VFL_TIMING`` lines (``flower_vfl.strategies.exchange``), the job's wall time."""
    from flower_vfl.deploy.local import Processes, deploy_local
    owner, party, k = _id_sets(n, overlap, seed)
    work = Path(tempfile.mkdtemp(prefix="bench-psi-loopback-"))
    t0 = time.perf_counter()
    lab, par = _own_files(work, owner, party)
    files_s = time.perf_counter() - t0
    del owner, party
    timing = work / "timing.jsonl"
    os.environ["FLOWER_VFL_TIMING"] = str(timing)
    # the label owner's kept PSI key (flower_vfl.io.psi.label_owner_key) on a deployed ServerApp
    os.environ.setdefault("FLOWER_VFL_STATE_DIR", str(work / "owner-state"))
    procs = Processes(work / "logs")
    rc = {"num-parties": 1, "labels-path": str(lab), "label-column": "label", "max-rounds": 1, "tol": 0.0,
          "out-dir": str(work / "out")}
    nodes = {0: {"data-path": str(par), "psi-max-asked": 1.25, "state-dir": str(work / "party0-state")}}
    t0 = time.time()
    try:
        res = deploy_local(work, 1, rc, node_configs=nodes, app_dir=str(Path(__file__).resolve().parents[1]),
                           tls=True, auth=True, processes=procs, timeout=7200, isolation="warm")
    finally:
        procs.stop_all()
    wall = time.time() - t0
    lines = [json.loads(x) for x in timing.read_text().splitlines()] if timing.exists() else []
    ex = [r for r in lines if r.get("who") == "server" and any(str(t).startswith("query.psi") for t in r.get("type", []))]
    out = {"n_owner": n, "n_party": n, "overlap": k, "exit_code": res["exit_code"], "write_files_s": files_s,
           "deploy_and_job_wall_s": wall, "load": os.getloadavg()[0],
           "psi_exchanges": [{"type": r["type"], "wall_s": r["t_done"] - r["t_push"],
                              "bytes_out": sum(r.get("array_bytes_out", {}).values()),
                              "bytes_in": sum(r.get("array_bytes_in", {}).values())} for r in ex]}
    if ex:
        out["psi_first_push_to_last_reply_s"] = ex[-1]["t_done"] - ex[0]["t_push"]
    print(json.dumps(out), flush=True)
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
    ap.add_argument("--flower-n", type=int, default=0,
                    help="IDs on each side for PSI through Flower vs the library called directly (0: skip)")
    ap.add_argument("--pairs", type=int, default=2, help="alternated (library, Flower) pairs of --flower-n")
    ap.add_argument("--loopback-n", type=int, default=0,
                    help="IDs on each side end to end on real nodes on loopback (0: skip)")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--out", default=str(RESULTS / "bench_psi.json"))
    args = ap.parse_args(argv)
    import os
    res = {"machine": {"cpus": os.cpu_count()}}
    if args.psi_n:
        res["psi"] = bench_psi(args.psi_n, args.overlap, args.structures.split(","))
    if args.flower_n:
        res["flower_vs_library"] = bench_psi_flower(args.flower_n, args.overlap, args.pairs)
    if args.loopback_n:
        res["loopback"] = bench_psi_loopback(args.loopback_n, args.overlap)
    if args.a9a:
        res["a9a"] = bench_a9a(args.rounds)
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
