"""Bitwise trajectories of the two paths (in-process engine, Flower strategy through LocalGrid).

For a9a (the paper's 2-party split) and breast cancer (3 parties), each non-private and with one
private party, it records per path: the history rows (round, train_loss, objective (NaN when
absent), primal and dual residual, rho), the non-private parties' coefficients, the intercept
and the test decision values (SHA-256 of their bytes and the first 32). The private party's
noise is drawn from one fixed stream per (party, round, kind) in both paths (a Flower party never
takes a seed, so the draw itself is replaced). It imports only what both trees have, so the same
file runs on the code before and after a refactor:

    PYTHONPATH=/work/ref  python benchmarks/trajectory_check.py --out /tmp/ref.npz
    PYTHONPATH=/work/main python benchmarks/trajectory_check.py --out /tmp/main.npz
    python benchmarks/trajectory_check.py --compare /tmp/ref.npz /tmp/main.npz

``--cases bc`` runs breast cancer only (a9a needs ``--data-dir``, default ../shared/data/a9a).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "bc": dict(dataset="breast_cancer", parties=3, rounds=15, lam=1e-3, private=2),
    "a9a": dict(dataset="a9a", parties=2, rounds=20, lam=1e-4, private=1),
}
PRIVATE = {"dp": True, "dp-epsilon": 2.0, "dp-train-rounds": 2, "dp-b1": 2.0, "dp-clip": 4.0}
COLUMNS = ("round", "train_loss", "objective", "primal_residual", "dual_residual", "rho")
NOISE_ENTROPY = 7


def noise_rng(self, round, kind="train"):
    """GaussianOutputMechanism.rng replaced: one fixed stream per (party, round, kind)."""
    from flower_vfl.privacy.mechanism import KIND_CODES
    seq = np.random.SeedSequence(entropy=NOISE_ENTROPY, spawn_key=(self._party_key, int(round), KIND_CODES[kind]))
    return np.random.default_rng(seq)


def fixed_noise():
    """Replace the parties' noise draw (both paths) by :func:`noise_rng`."""
    from flower_vfl.privacy import mechanism
    mechanism.GaussianOutputMechanism.rng = noise_rng


def _history(rows) -> np.ndarray:
    return np.array([[float(r.get(c, np.nan)) for c in COLUMNS] for r in rows])


def _decision(f) -> dict:
    f = np.ascontiguousarray(np.asarray(f, dtype=np.float64))
    return {"decision_sha256": np.frombuffer(hashlib.sha256(f.tobytes()).digest(), dtype=np.uint8),
            "decision_head": f[:32]}


def run_case(case: str, private: bool, data_dir: str | None) -> dict:
    """{'<path>/<key>': array} of one case, path in ('engine', 'flower')."""
    from flower_vfl import VerticalADMM
    from flower_vfl.apps import client as ca
    from flower_vfl.apps import server as sa
    from flower_vfl.config.settings import privacy_from_config
    from flower_vfl.deploy.local_grid import LocalGrid
    from flower_vfl.io.data import labels, party_block

    c = CASES[case]
    n, dd = c["parties"], (data_dir if c["dataset"] == "a9a" else None)
    rc = {"dataset": c["dataset"], "num-parties": n, "max-rounds": c["rounds"], "lam": c["lam"]}
    if dd:
        rc["data-dir"] = dd
    state = tempfile.mkdtemp(prefix="trajectory-")       # the private party's own ledger folder
    nodes = {100 + m: {"partition-id": m, **({"data-dir": dd} if dd else {}),
                       # dp-lam pinned to the run's lam, the default the references were written with
                       # (an unset dp-lam now scales with the party's N: config/settings.py default_dp_lam)
                       **(dict(PRIVATE, **{"state-dir": state, "dp-lam": c["lam"]}) if private and m == c["private"]
                          else {})}
             for m in range(n)}
    out = {}
    # Flower: the ServerApp's strategy and the ClientApp's handlers through real Messages
    grid = LocalGrid({"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify}, nodes, rc)
    st = sa.make_strategy(rc)
    st.start(grid)
    out["flower/history"] = _history(st.history_)
    out["flower/intercept"] = np.atleast_1d(np.asarray(st.central.b, dtype=float))
    out.update({"flower/" + k: v for k, v in _decision(st.decision_test_).items()})
    coef = []
    for m in range(n):
        state_m = grid.contexts[100 + m].state
        if "vfl.party" in state_m:                         # a non-private party's x_m (its own state)
            coef.append(state_m["vfl.party"]["x"].numpy().ravel())
    out["flower/coef"] = np.concatenate(coef)
    # the engine, with the same parties and privacy settings
    blocks = [party_block(c["dataset"], m, n, dd) for m in range(n)]
    y, _ = labels(c["dataset"], dd)
    privacy = [privacy_from_config(m, rc, nodes[100 + m]) for m in range(n)]
    eng = VerticalADMM(lam=c["lam"], max_rounds=c["rounds"], tol=0,
                       privacy=privacy if private else None).fit([b[0] for b in blocks], y)
    out["engine/history"] = _history(eng.history_)
    out["engine/intercept"] = np.atleast_1d(np.asarray(eng.intercept_, dtype=float))
    out.update({"engine/" + k: v for k, v in _decision(eng.decision_function([b[1] for b in blocks])).items()})
    out["engine/coef"] = np.concatenate([np.ravel(x) for x, p in zip(eng.coef_, privacy if private else [None] * n)
                                         if p is None])
    return out


def collect(cases, data_dir) -> dict:
    fixed_noise()
    out = {}
    for case in cases:
        for private in (False, True):
            tag = f"{case}_{'private' if private else 'plain'}"
            out.update({f"{tag}/{k}": v for k, v in run_case(case, private, data_dir).items()})
            print(f"{tag}: done", file=sys.stderr)
    return out


def compare(a: dict, b: dict) -> list[str]:
    """One line per key: 'same' (bitwise) or the largest difference."""
    lines = []
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            lines.append(f"{key}: only in {'first' if key in a else 'second'}")
            continue
        x, y = np.asarray(a[key]), np.asarray(b[key])
        if x.shape == y.shape and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"):
            lines.append(f"{key}: same")
        elif x.shape != y.shape:
            lines.append(f"{key}: shapes {x.shape} vs {y.shape}")
        else:
            d = np.abs(x.astype(float) - y.astype(float))
            lines.append(f"{key}: DIFFERS, max |diff| {np.nanmax(d) if np.isfinite(d).any() else 'nan'}"
                         + (f" (columns {sorted({COLUMNS[j] for j in np.argwhere(~(d == 0))[:, 1]})})"
                            if key.endswith("history") and x.ndim == 2 else ""))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the trajectories to this .npz")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "a9a"))
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two dumps key by key")
    args = ap.parse_args(argv)
    if args.compare:
        a, b = (dict(np.load(p)) for p in args.compare)
        print("\n".join(compare(a, b)))
        return
    out = collect(args.cases, args.data_dir)
    if args.out:
        np.savez_compressed(args.out, **out)
    paths = {}
    for k, v in out.items():            # engine vs Flower within this tree
        tag, path, what = k.split("/")
        paths.setdefault(path, {})[f"{tag}/{what}"] = v
    print("engine vs flower (this tree):")
    print("\n".join(compare(paths["engine"], paths["flower"])))


if __name__ == "__main__":
    main()
