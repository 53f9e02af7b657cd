"""What the central node's per-round files cost a round (issue 24 item 3: the simulation tick).

The real ServerApp (``apps/server.main``) with the real party handlers on the in-process
LocalGrid (no Flower runtime), a9a paper split, 2 parties, ``--rounds`` rounds at ``tol`` 0, in
three modes, alternated ``--pairs`` times (the machine is shared: compare within a pair):

- ``none``: no ``out-dir`` (no checkpoint, no report);
- ``inline``: an ``out-dir``; after every round the checkpoint (atomic ``np.savez`` + fsync of the
  file and the folder, ``strategies/checkpointing.save``) and the report (report.json,
  metrics.csv, decision_test.npy, each atomic and fsynced) are written before the next round's
  messages go out (``VerticalADMMStrategy.write_inline = True``, the behaviour before 2026-11-27);
- ``thread``: the default: the same files written by the strategy's ``RoundWriter`` while the
  parties compute the next round (``io/writer.py``).

Prints per run the wall time a round and the median / max time between a round's replies and the
next round's messages spent on these files (``_on_round``: the wait for the previous round's
writes, the snapshot, the hand-over or the write itself).

    python -W ignore benchmarks/bench_checkpoint.py [--rounds 30] [--pairs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from flwr.app import Context, RecordDict

from flower_vfl.apps import client as ca
from flower_vfl.apps import server as sa
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.strategies.vertical_admm import VerticalADMMStrategy

HANDLERS = {"query.identify": ca.identify, "train": ca.train, "evaluate": ca.evaluate}
MODES = ("none", "inline", "thread")


def run(rounds: int, mode: str) -> dict:
    rc = {"dataset": "a9a", "num-parties": 2, "max-rounds": rounds, "tol": 0.0, "party-wait": 0.0}
    if mode != "none":
        rc["out-dir"] = tempfile.mkdtemp(prefix="bench_ckpt_")
    grid = LocalGrid(HANDLERS, {100 + m: {"partition-id": m} for m in range(2)}, rc, run_id=1)
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
    spent, orig = [], VerticalADMMStrategy._on_round

    def timed(self, *a, **k):
        t0 = time.perf_counter()
        orig(self, *a, **k)
        spent.append(time.perf_counter() - t0)
    VerticalADMMStrategy._on_round, VerticalADMMStrategy.write_inline = timed, mode == "inline"
    try:
        t0 = time.perf_counter()
        sa.main(grid, ctx)
        wall = time.perf_counter() - t0
    finally:
        VerticalADMMStrategy._on_round, VerticalADMMStrategy.write_inline = orig, False
    return {"mode": mode, "rounds": len(spent), "wall_s": round(wall, 3),
            "s_per_round": round(wall / max(len(spent), 1), 4),
            "files_ms_median": round(1e3 * statistics.median(spent), 1),
            "files_ms_max": round(1e3 * max(spent), 1)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args(argv)
    run(2, "none")                                     # data and caches loaded once, untimed
    for _ in range(args.pairs):
        for mode in MODES:
            print(json.dumps(run(args.rounds, mode)), flush=True)


if __name__ == "__main__":
    main()
