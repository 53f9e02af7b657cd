"""What the central node's per-round checkpoint costs (issue 24 item 3: the simulation tick).

The real strategy and party handlers on the in-process LocalGrid (no Flower runtime), a9a paper
split, 2 parties, ``--rounds`` rounds at ``tol`` 0, run without and with a state folder (an
``out-dir``: the ServerApp then checkpoints after every round, ``strategies/checkpointing.save``,
an atomic ``np.savez`` + fsync of the file and the folder). Prints the wall time of each run and
the time of every save, alternating the two ``--pairs`` times (the machine is shared: compare
within a pair).

    python -W ignore benchmarks/bench_checkpoint.py [--rounds 30] [--pairs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from flwr.app import ArrayRecord

from flower_vfl.apps import client as ca
from flower_vfl.apps.server import make_strategy
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.strategies import checkpointing

HANDLERS = {"query.identify": ca.identify, "train": ca.train, "evaluate": ca.evaluate}


def run(rounds: int, out: str | None) -> dict:
    rc = {"dataset": "a9a", "num-parties": 2, "max-rounds": rounds, "tol": 0.0, "party-wait": 0.0}
    if out:
        rc["out-dir"] = out
    st = make_strategy(rc)
    grid = LocalGrid(HANDLERS, {100 + m: {"partition-id": m} for m in range(2)}, rc, run_id=1)
    saves, orig = [], checkpointing.save

    def timed(*a, **k):
        t0 = time.perf_counter()
        orig(*a, **k)
        if st.state_dir:
            saves.append(time.perf_counter() - t0)
    checkpointing.save = timed
    try:
        t0 = time.perf_counter()
        st.start(grid=grid, initial_arrays=ArrayRecord(), num_rounds=rounds, timeout=120)
        wall = time.perf_counter() - t0
    finally:
        checkpointing.save = orig
    return {"state_dir": bool(out), "rounds": len(st.history_), "wall_s": round(wall, 3),
            "s_per_round": round(wall / max(len(st.history_), 1), 4),
            "save_ms_median": round(1e3 * statistics.median(saves), 1) if saves else 0.0,
            "save_ms_max": round(1e3 * max(saves), 1) if saves else 0.0}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args(argv)
    run(2, None)                                       # data and caches loaded once, untimed
    for _ in range(args.pairs):
        for out in (None, tempfile.mkdtemp(prefix="bench_ckpt_")):
            print(json.dumps(run(args.rounds, out)), flush=True)


if __name__ == "__main__":
    main()
