"""Seconds per round on real SuperNodes (loopback), the central node's reply polling before and
after: Flower 1.41's HTTP grid sleeps 3 s between pulls in ``send_and_receive``; the strategy's
own loop (``flower_vfl.strategies.resilience.send_and_receive``) polls from 20 ms up to 0.25 s.

Interleaved pairs of deployments (``flower_vfl.deploy.deploy_local``, insecure), per-round time
= median of the differences of ``elapsed_s`` between consecutive rounds in report.json.

    python benchmarks/bench_loopback_rounds.py [--pairs 2] [--rounds 6] [--dataset breast_cancer]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np

from flower_vfl.deploy import deploy_local

ROOT = Path(__file__).resolve().parents[1]


def per_round(workdir, rc, mode, data_dir):
    os.environ.pop("FLOWER_VFL_GRID_PULL", None)
    if mode == "flower":
        os.environ["FLOWER_VFL_GRID_PULL"] = "flower"
    nodes = {m: {"data-dir": data_dir} for m in range(2)} if data_dir else None
    res = deploy_local(workdir, 2, rc, node_configs=nodes, app_dir=ROOT, tls=False, auth=False, timeout=1800)
    os.environ.pop("FLOWER_VFL_GRID_PULL", None)
    rows = json.loads((Path(res["out_dir"]) / "report.json").read_text())["rounds"]
    el = [r["elapsed_s"] for r in rows]
    return statistics.median(np.diff(el)), res["exit_code"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--dataset", default="breast_cancer")
    ap.add_argument("--data-dir", default="")
    args = ap.parse_args(argv)
    rc = {"dataset": args.dataset, "num-parties": 2, "max-rounds": args.rounds}
    if args.data_dir:
        rc["data-dir"] = args.data_dir
    out = {"flower": [], "strategy": []}
    for i in range(args.pairs):
        for mode in ("flower", "strategy"):
            with tempfile.TemporaryDirectory(prefix=f"bench-{mode}-") as d:
                s, code = per_round(d, rc, mode, args.data_dir)
            out[mode].append(s)
            print(f"pair {i + 1} {mode:9s}: {s:.2f} s/round (exit {code})", flush=True)
    load = Path("/proc/loadavg").read_text().split()[:3]
    ratio = [f / s for f, s in zip(out["flower"], out["strategy"])]
    print(f"load average {' '.join(load)}; flower/strategy per pair: {[round(float(r), 2) for r in ratio]}")
    (Path(__file__).parent / "results" / "bench_loopback_rounds.json").write_text(
        json.dumps({"config": rc, "seconds_per_round": out, "ratio": ratio, "loadavg": load}, indent=2))


if __name__ == "__main__":
    main()
