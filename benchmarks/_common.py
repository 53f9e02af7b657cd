"""Shared helpers for the benchmark scripts: a9a loading (paper split), machine info, a round state.

Not part of the package. The scripts are run from the repo root as ``python benchmarks/<name>.py``.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:        # run without an install: use the working tree's flower_vfl,
    # after any PYTHONPATH entries (the A/B runs in docs/benchmarks.md set PYTHONPATH to another
    # tree; inserted at 0, the working tree shadowed it and both runs measured this tree)
    _pp = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    sys.path.insert(len(_pp) + 1 if _pp else 0, str(REPO))

RESULTS = Path(__file__).resolve().parent / "results"
A9A_DIR = Path(os.environ.get("A9A_DIR", "/work/shared/data/a9a"))
#: paper split (Sec. 5): party 1 = features 1-66, party 2 = features 67-123
SPLIT = 66
LAM = 1e-4
#: centralized optimum of (1/N) sum log(1 + e^{-y f}) + lam/2 ||w||^2 with an unpenalized
#: intercept, and its test log-loss / accuracy (docs/DESIGN.md sec. 4)
F_STAR = 0.3244130441
TEST_LOGLOSS_STAR = 0.3238
TEST_ACC_STAR = 0.8498


def load_a9a():
    """(train blocks, y_train, test blocks, y_test); blocks are CSR, labels in {-1, +1}."""
    from sklearn.datasets import load_svmlight_file

    Xtr, ytr = load_svmlight_file(str(A9A_DIR / "a9a"), n_features=123)
    Xte, yte = load_svmlight_file(str(A9A_DIR / "a9a.t"), n_features=123)
    Xtr, Xte = Xtr.tocsr(), Xte.tocsr()
    split = lambda X: [X[:, :SPLIT].tocsr(), X[:, SPLIT:].tocsr()]   # noqa: E731
    return split(Xtr), ytr, split(Xte), yte


def machine_info() -> dict:
    import numpy
    import scipy

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "numpy": numpy.__version__, "scipy": scipy.__version__}


def print_machine():
    info = machine_info()
    print("machine: " + ", ".join(f"{k}={v}" for k, v in info.items()))
    return info


def median_ms(samples) -> float:
    return 1e3 * float(np.median(samples))


class Timer:
    """``with Timer() as t: ...; t.s`` (time.perf_counter)."""

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.s = time.perf_counter() - self.t0
        return False


def mid_run_state(blocks, y, rounds=10, **kw):
    """A realistic mid-run ADMM state: run the engine ``rounds`` rounds and return its
    per-party (x_m, s_m, z_loc_m) and the central node's (z, y, q, b) as copies."""
    from flower_vfl import VerticalADMM

    eng = VerticalADMM(lam=LAM, max_rounds=rounds, tol=0, **kw).fit(blocks, y)
    parties = [{k: np.array(v, copy=True) for k, v in p.get_state().items()} for p in eng._parties]
    c = eng._central
    central = {"z": c.z.copy(), "y": c.y.copy(), "q": c.q.copy(), "b": np.float64(c.b),
               "rho": c.rho,
               # the z-update's predictor (core/central.py), restored with the state
               "pred": {k: np.array(v, copy=True) for k, v in c.predictor_state().items()}}
    return parties, central


def build_ours(blocks, t, state_parties, state_central, theta, alpha=1.0, fit_intercept=True,
               lam=LAM):
    """flower_vfl PartyUpdate / CentralUpdate objects set to a given state (the x-factorization
    is done by the first step; call :func:`our_round` once to warm up before timing)."""
    from flower_vfl.core.central import CentralUpdate
    from flower_vfl.core.losses import get_loss
    from flower_vfl.core.party import PartyUpdate
    from flower_vfl.core.penalties import get_penalty

    parties = []
    for D, st in zip(blocks, state_parties):
        p = PartyUpdate(D, get_penalty("l2"), lam)
        p.set_state(st)
        parties.append(p)
    c = CentralUpdate(get_loss("logistic"), t, state_central["rho"], alpha=alpha, theta=theta,
                      fit_intercept=fit_intercept)
    set_central(c, state_central)
    return parties, c


def set_central(c, st):
    c.z, c.y, c.q = st["z"].copy(), st["y"].copy(), st["q"].copy()
    c.b = np.float64(st["b"]) if c.fit_intercept else np.float64(0.0)
    c.set_predictor_state(st.get("pred", {}))


def restore(parties, central, state_parties, state_central):
    """Put the objects back to the state (outside any timed region)."""
    for p, st in zip(parties, state_parties):
        p.set_state(st)
    set_central(central, state_central)


def our_round(parties, central):
    """One round exactly as VerticalADMM.fit does it (without the objective/bookkeeping)."""
    s_sum = 0.0
    for p in parties:
        s = p.step(central.q, central.y, central.rho, central.alpha, central.theta)
        p.commit(s)
        s_sum = s_sum + s
    central.step(s_sum)
