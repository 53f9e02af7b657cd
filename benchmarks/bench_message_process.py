"""What one message costs a party on a real SuperNode before any ADMM work.

On real nodes (flwr 1.41) every message runs in a fresh ``flwr-clientapp`` process, so each
train message pays: interpreter start, imports, loading the party's columns, building its
x-update solver (the factorization of lam I + rho D^T D), then one x-update. Each stage is timed
as a fresh subprocess that stops after it, ``--reps`` times interleaved; the table gives medians
and each stage's increment.

    python benchmarks/bench_message_process.py [--reps 3] [--dataset a9a]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

STAGES = {
    "python": "pass",
    "import flwr (clientapp, app)": "import flwr.clientapp, flwr.app",
    "import flower_vfl.apps.client": "import flower_vfl.apps.client",
    "+ load the party's block": "import flower_vfl.apps.client\nfrom flower_vfl.io.data import party_block\n"
                                "party_block('{ds}', 1, 2)",
    "+ solver + one x-update": "import flower_vfl.apps.client, numpy as np\nfrom flower_vfl.io.data import party_block\n"
                               "from flower_vfl.core.party import PartyUpdate\n"
                               "from flower_vfl.core.penalties import get_penalty\n"
                               "D, _ = party_block('{ds}', 1, 2)\nn = D.shape[0]\n"
                               "PartyUpdate(D, get_penalty('l2'), 1e-4).step(np.ones(n), np.zeros(n), 1e-5, 1.0, 0.5)",
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dataset", default="a9a")
    args = ap.parse_args(argv)
    times = {k: [] for k in STAGES}
    for _ in range(args.reps):
        for name, code in STAGES.items():
            t = time.perf_counter()
            subprocess.run([sys.executable, "-W", "ignore", "-c", code.format(ds=args.dataset)], check=True,
                           capture_output=True)
            times[name].append(time.perf_counter() - t)
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"{args.dataset}, {args.reps} interleaved repetitions, load average {' '.join(load)}")
    prev = 0.0
    rows = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        rows[name] = {"median_s": med, "increment_s": med - prev, "all_s": ts}
        print(f"{name:34s} {med:7.2f} s  (+{med - prev:5.2f} s)")
        prev = med
    out = Path(__file__).parent / "results" / "bench_message_process.json"
    out.write_text(json.dumps({"dataset": args.dataset, "loadavg": load, "stages": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
