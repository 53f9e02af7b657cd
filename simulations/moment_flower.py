"""The moment route through Flower (issue 21 item 3): a9a, both parties private, fresh runs.

Each run is the real ServerApp strategy (``make_strategy`` with ``route='moment'``,
:class:`~flower_vfl.strategies.moment.MomentStrategy`) and the real ClientApp handlers
(``query.moment_identify``, ``query.moment_release``, ``train.moment``, ``evaluate.moment``) on the
in-process LocalGrid, every party with its own node config (dp=true, its epsilon, delta, clip,
``moment-pool='test'``) and a fresh state-dir: fresh OS-entropy noise per run (a ClientApp never
takes a seed). The pool is the a9a test set, cross-fitted (each half scored by the model fitted on
the other half). Every epsilon printed is read from the parties' own ledgers. For each run the
Flower model is also checked against the in-process Newton minimizer of the same pool objective on
the same released g~ (read back from the party's store): max |dx| over both parties and both fits.

    python simulations/moment_flower.py [--runs 3] [--epsilon 1] [--lam 3e-4] [--tol 1e-9] [--max-rounds 200]

Writes simulations/results/moment_flower.{csv,json}.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord

from _common import write_csv

warnings.filterwarnings("ignore", category=UserWarning)

DELTA, C_V, M = 1e-5, 1.5, 2


def one_run(run_id, eps, lam, tol, max_rounds, folder):
    from flower_vfl.apps import client as ca
    from flower_vfl.apps.server import make_strategy
    from flower_vfl.clients.party_private import party_store
    from flower_vfl.clients.source import declared_source
    from flower_vfl.core.moment_sharing import MomentXUpdate
    from flower_vfl.core.scoring import normalize_rows
    from flower_vfl.deploy.local_grid import LocalGrid
    from flower_vfl.estimator.moment_route import solve_moment_logistic
    from flower_vfl.io.data import labels, party_block
    from flower_vfl.privacy.ssp import stacking_target
    handlers = {"query.moment_identify": ca.moment_identify, "query.moment_release": ca.moment_release,
                "train.moment": ca.moment_train, "evaluate.moment": ca.moment_evaluate}
    ncs = {100 + m: {"partition-id": m, "state-dir": str(Path(folder) / f"party{m}"), "dp": True, "dp-epsilon": eps,
                     "dp-delta": DELTA, "dp-clip": C_V, "moment-pool": "test"} for m in range(M)}
    rc = {"dataset": "a9a", "num-parties": M, "route": "moment", "party-wait": 0.0, "lam": lam, "tol": tol,
          "max-rounds": max_rounds}
    st = make_strategy(rc)
    t0 = time.perf_counter()
    st.start(grid=LocalGrid(handlers, ncs, rc, run_id=run_id), initial_arrays=ArrayRecord(), num_rounds=1,
             timeout=600)
    wall = time.perf_counter() - t0
    # the same objective in process, on the parties' stored releases
    y, _ = labels("a9a")
    t = (y == np.unique(y)[1]).astype(float)
    kappa = stacking_target(t, C_V)[1]
    blocks = [party_block("a9a", m, M) for m in range(M)]
    g = []
    for nc in ncs.values():
        src = declared_source(nc, rc, nc["partition-id"])
        g.append(np.asarray(party_store(nc["state-dir"]).answer(src.key, f"{run_id}/moment", 1, "eval")
                            .payload["g_tilde"]))
    h = [gm / (kappa * t.size) for gm in g]
    dx = 0.0
    for fit in (0, 1):
        pool = [normalize_rows(b[1][st.halves_[fit]]) for b in blocks]
        xs_ref, _ = solve_moment_logistic(pool, h, float(t.mean()), lam)
        xs = [MomentXUpdate(pool[m], h[m], lam).solve(st.targets_[fit][m], st.rho_[fit] * M) for m in range(M)]
        dx = max(dx, max(float(np.max(np.abs(a - r))) for a, r in zip(xs, xs_ref)))
    eps_spent = [st.privacy_[m]["totals"]["exact"] for m in range(M)]
    return {"run": run_id, "epsilon": eps, "lam": lam, "accuracy": st.metrics_["test_accuracy"],
            "log_loss": st.metrics_["test_loss"], "rounds_fit0": st.rounds_[0], "rounds_fit1": st.rounds_[1],
            "max_dx_vs_newton": dx, "epsilon_spent_party0": eps_spent[0], "epsilon_spent_party1": eps_spent[1],
            "wall_s": wall}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--lam", type=float, default=3e-4)
    ap.add_argument("--tol", type=float, default=1e-9)
    ap.add_argument("--max-rounds", type=int, default=200)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    a = ap.parse_args(argv)
    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 0, 0
    rows = []
    for r in range(a.runs):
        with tempfile.TemporaryDirectory() as folder:
            row = one_run(r + 1, a.epsilon, a.lam, a.tol, a.max_rounds, folder)
        rows.append(row)
        print(json.dumps(row), flush=True)
    acc, loss = np.array([r["accuracy"] for r in rows]), np.array([r["log_loss"] for r in rows])
    rounds = np.array([[r["rounds_fit0"], r["rounds_fit1"]] for r in rows])
    summary = {"runs": a.runs, "epsilon": a.epsilon, "delta": DELTA, "c_v": C_V, "lam": a.lam, "tol": a.tol,
               "accuracy_mean": float(acc.mean()), "accuracy_sd": float(acc.std(ddof=1)) if a.runs > 1 else 0.0,
               "log_loss_mean": float(loss.mean()), "log_loss_sd": float(loss.std(ddof=1)) if a.runs > 1 else 0.0,
               "rounds_per_fit_mean": float(rounds.mean()), "rounds_per_fit_max": int(rounds.max()),
               "max_dx_vs_newton": max(r["max_dx_vs_newton"] for r in rows),
               "wall_s_mean": float(np.mean([r["wall_s"] for r in rows]))}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "moment_flower.csv", rows)
    (out / "moment_flower.json").write_text(json.dumps({"summary": summary, "runs": rows}, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
